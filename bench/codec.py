#!/usr/bin/env python3
"""DSSST1 codec benchmark: dssst1 against its baselines, side by side, in one process.

    python bench/codec.py            # the full run recorded in bench/README.md
    python bench/codec.py --smoke    # small sizes, a few seconds (CI; no thresholds)

Payloads: (a) an RL forward-backward batch (256 x 4096 input_ids, attention_mask, advantages,
old log-probs, loss mask), (b) ~1 GiB of bf16 weights in ~300 tensors, (c) 10,000 tensors of 64
bytes. Every method runs on the same arrays in the same process; each time is the best of several
runs. Baselines: memcpy into a pre-faulted buffer, ``tobytes()`` into fresh memory,
safetensors (NumPy and torch), ``torch.save`` / ``torch.load``, pickle protocol 5, the model of
the deployed v1 codec (``tests/v1ref``), and for decoding ``json.loads`` of the same header plus
one NumPy view per tensor (the least any reader of this format must do). Ratios are "times the
dssst1 time" (> 1: slower than dssst1). Torch rows are skipped when torch is not installed. The
targets at the end are reported, not asserted.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import io
import json
import pickle
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import dssst1  # noqa: E402
from tests import v1ref  # noqa: E402

try:
    import torch
except ImportError:  # the torch baselines are skipped
    torch = None
try:
    import safetensors.numpy as st_numpy
except ImportError:  # pragma: no cover - a dev dependency
    st_numpy = None
try:
    import safetensors.torch as st_torch
except ImportError:
    st_torch = None

MiB = 1 << 20


# --------------------------------------------------------------------------- payloads


def rl_batch(smoke: bool) -> dict[str, Any]:
    rows, cols = (8, 128) if smoke else (256, 4096)
    rng = np.random.default_rng(0)
    return {
        "args": [],
        "kwargs": {
            "input_ids": rng.integers(0, 151_000, (rows, cols), dtype=np.int64),
            "attention_mask": np.ones((rows, cols), np.int64),
        },
        "context": {
            "advantages": rng.standard_normal((rows, cols), dtype=np.float32),
            "old_log_probs_shifted": -rng.random((rows, cols), dtype=np.float32),
            "loss_mask": np.ones((rows, cols), np.float32),
        },
        "processing": {"post": ["compute_logprobs"], "loss_fn": "ppo", "config": {"clip": 0.2}},
    }


def weight_set(smoke: bool) -> dict[str, Any]:
    """A transformer-shaped bf16 state dict: ~1 GiB (smoke: ~8 MiB) in ~300 tensors."""
    hidden, layers = (256, 4) if smoke else (1536, 24)
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (4 * hidden * 4, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (hidden, hidden),
            p + "self_attn.k_proj.weight": (hidden // 4, hidden),
            p + "self_attn.v_proj.weight": (hidden // 4, hidden),
            p + "self_attn.o_proj.weight": (hidden, hidden),
            p + "self_attn.q_proj.bias": (hidden,),
            p + "self_attn.k_proj.bias": (hidden // 4,),
            p + "self_attn.v_proj.bias": (hidden // 4,),
            p + "mlp.gate_proj.weight": (hidden * 2, hidden),
            p + "mlp.up_proj.weight": (hidden * 2, hidden),
            p + "mlp.down_proj.weight": (hidden, hidden * 2),
            p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
        }
    shapes["model.norm.weight"] = (hidden,)
    shapes["lm_head.weight"] = (4 * hidden * 4, hidden)
    out: dict[str, Any] = {}
    for n, (name, shape) in enumerate(shapes.items()):
        arr = np.empty(shape, dtype=ml_dtypes.bfloat16)
        arr.view(np.uint16).fill(0x3F80 + n % 64)  # touch every page
        out[name] = arr
    return out


def many_small(smoke: bool) -> dict[str, Any]:
    count = 500 if smoke else 10_000
    return {f"t{i:05d}": np.full(16, i, dtype=np.float32) for i in range(count)}


def flatten(value: Any, prefix: str = "") -> dict[str, np.ndarray[Any, Any]]:
    if isinstance(value, np.ndarray):
        return {prefix or "__root__": value}
    out: dict[str, Any] = {}
    if isinstance(value, dict):
        for key, item in value.items():
            out |= flatten(item, f"{prefix}.{key}" if prefix else key)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            out |= flatten(item, f"{prefix}.{index}" if prefix else str(index))
    return out


def as_torch(arrays: dict[str, Any]) -> dict[str, Any]:
    assert torch is not None
    out = {}
    for name, arr in arrays.items():
        if arr.dtype == np.dtype(ml_dtypes.bfloat16):
            out[name] = torch.from_numpy(arr.view(np.uint16)).view(torch.bfloat16)
        else:
            out[name] = torch.from_numpy(arr)
    return out


def numpy_standin(arrays: dict[str, Any]) -> dict[str, Any]:
    """safetensors.numpy has no bfloat16: the same bytes as uint16 (noted in the table)."""
    bf16 = np.dtype(ml_dtypes.bfloat16)
    return {k: (v.view(np.uint16) if v.dtype == bf16 else v) for k, v in arrays.items()}


# --------------------------------------------------------------------------- timing


def best_time(fn: Callable[[], Any], *, min_runs: int, budget_s: float) -> float:
    """The best wall time of ``fn`` over at least ``min_runs`` runs (more while under budget).

    The harness's own objects (payloads, baselines' inputs) are frozen out of the garbage
    collector first, so that collections triggered by ``fn`` cost what they would cost in a
    process that holds only ``fn``'s data, the same for every method.
    """
    gc.collect()
    gc.freeze()
    try:
        best = float("inf")
        start = time.perf_counter()
        runs = 0
        while runs < min_runs or (time.perf_counter() - start < budget_s and runs < 10_000):
            t0 = time.perf_counter()
            result = fn()
            t1 = time.perf_counter()
            del result
            best = min(best, t1 - t0)
            runs += 1
        return best
    finally:
        gc.unfreeze()


def fmt_time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:8.1f} us"
    if seconds < 1:
        return f"{seconds * 1e3:8.2f} ms"
    return f"{seconds:8.3f} s "


class Table:
    def __init__(self, title: str, nbytes: int) -> None:
        self.title = title
        self.nbytes = nbytes
        self.rows: list[tuple[str, str, float | None, str]] = []
        self.times: dict[tuple[str, str], float] = {}

    def add(self, op: str, method: str, seconds: float | None, note: str = "") -> None:
        self.rows.append((op, method, seconds, note))
        if seconds is not None:
            self.times[(op, method)] = seconds

    def print(self) -> None:
        print(f"\n## {self.title}: {self.nbytes / MiB:,.1f} MiB of tensor data")
        print(f"{'op':7} {'method':40} {'time':>11} {'GB/s':>8} {'x dssst1':>9}  note")
        for op, method, seconds, note in self.rows:
            ref = self.times.get((op, "dssst1"))
            if seconds is None:
                print(f"{op:7} {method:40} {'-':>11} {'-':>8} {'-':>9}  {note}")
                continue
            gbs = self.nbytes / seconds / 1e9
            ratio = f"{seconds / ref:9.2f}" if ref else f"{'-':>9}"
            print(f"{op:7} {method:40} {fmt_time(seconds):>11} {gbs:8.2f} {ratio}  {note}")


def header_dss_views(frame: bytes) -> list[Any]:
    """`header_views` plus parsing the ``dss`` structure string: the two JSON documents every
    DSSST1 reader has to parse."""
    n = int.from_bytes(frame[:8], "little")
    json.loads(json.loads(frame[8 : 8 + n])["__metadata__"]["dss"])
    return header_views(frame)


def header_views(frame: bytes) -> list[Any]:
    """The least a reader of this format does: parse the header, make one view per tensor."""
    n = int.from_bytes(frame[:8], "little")
    header = json.loads(frame[8 : 8 + n])
    start = 8 + n
    dtypes = {"F64": "<f8", "F32": "<f4", "I64": "<i8", "BF16": ml_dtypes.bfloat16, "U8": "u1"}
    views = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        views.append(
            np.ndarray(entry["shape"], dtypes[entry["dtype"]], frame, start + begin)
            if end > begin
            else None
        )
    return views


class Run:
    """One payload's measurements: the value, its flat arrays, its frame and the timer."""

    def __init__(self, title: str, value: Any, smoke: bool, heavy: bool) -> None:
        self.value = value
        self.arrays = flatten(value)
        self.table = Table(title, sum(a.nbytes for a in self.arrays.values()))
        self.frame = dssst1.dumps(value)
        self.smoke = smoke
        self.heavy = heavy
        self.runs, self.budget = (1, 0.01) if smoke else ((3, 2.0) if heavy else (5, 1.0))
        self.standin = numpy_standin(self.arrays)
        self.note = "bf16 saved as U16" if heavy and self.standin is not self.arrays else ""
        self.tensors = as_torch(self.arrays) if torch is not None else None

    def time(self, op: str, method: str, fn: Callable[[], Any], note: str = "") -> None:
        self.table.add(op, method, best_time(fn, min_runs=self.runs, budget_s=self.budget), note)


def encode_rows(run: Run) -> None:
    value, arrays, frame = run.value, run.arrays, run.frame
    run.time("encode", "dssst1", lambda: dssst1.dumps(value), "dumps: one copy into bytes")
    run.time("encode", "dssst1.iter_frame (streaming)", lambda: dssst1.iter_frame(value),
             "header bytes + views, no payload copy")  # fmt: skip
    dst = bytearray(len(frame))
    dst[:] = frame  # pre-fault every page
    dview = memoryview(dst)
    flat = [memoryview(a.reshape(-1).view(np.uint8)) for a in arrays.values()]

    def memcpy() -> None:
        pos = 0
        for src in flat:
            dview[pos : pos + src.nbytes] = src
            pos += src.nbytes

    run.time("encode", "memcpy into pre-faulted buffer", memcpy)
    run.time(
        "encode", "tobytes() into fresh memory", lambda: [a.tobytes() for a in arrays.values()]
    )
    standin, tensors = run.standin, run.tensors
    if st_numpy is not None:
        run.time("encode", "safetensors.numpy.save", lambda: st_numpy.save(standin), run.note)
    if tensors is not None and st_torch is not None:
        run.time("encode", "safetensors.torch.save", lambda: st_torch.save(tensors))
    else:
        run.table.add("encode", "safetensors.torch.save", None, "torch not installed")
    if tensors is not None:

        def tsave() -> io.BytesIO:
            buf = io.BytesIO()
            torch.save(tensors, buf)
            return buf

        run.time("encode", "torch.save (BytesIO)", tsave)
    else:
        run.table.add("encode", "torch.save (BytesIO)", None, "torch not installed")
    run.time("encode", "pickle protocol 5", lambda: pickle.dumps(arrays, protocol=5))
    run.time("encode", "v1 reference codec (tests/v1ref)", lambda: v1ref.dumps(value))


def decode_rows(run: Run) -> None:
    frame, tensors = run.frame, run.tensors
    run.time("decode", "dssst1", lambda: dssst1.loads(frame), "NumPy views, zero-copy")
    if torch is not None:
        run.time("decode", "dssst1 (tensors='torch')", lambda: dssst1.loads(frame, tensors="torch"),
                 "torch views, zero-copy")  # fmt: skip
    run.time("decode", "json.loads(header) + views", lambda: header_views(frame),
             "no checks, no tree")  # fmt: skip
    run.time("decode", "json.loads(header, dss) + views", lambda: header_dss_views(frame),
             "both JSON documents, no checks")  # fmt: skip
    if st_numpy is not None:
        blob = st_numpy.save(run.standin)
        run.time("decode", "safetensors.numpy.load", lambda: st_numpy.load(blob), run.note)
    if tensors is not None and st_torch is not None:
        tblob = st_torch.save(tensors)
        run.time("decode", "safetensors.torch.load", lambda: st_torch.load(tblob))
    if tensors is not None:
        buf = io.BytesIO()
        torch.save(tensors, buf)
        saved = buf.getvalue()
        run.time("decode", "torch.load (BytesIO)",
                 lambda: torch.load(io.BytesIO(saved), weights_only=True))  # fmt: skip
    pickled = pickle.dumps(run.arrays, protocol=5)
    run.time("decode", "pickle.loads", lambda: pickle.loads(pickled))
    run.time("decode", "v1 reference codec (tests/v1ref)", lambda: v1ref.loads(frame))


def chunk_rows(run: Run) -> None:
    frame = run.frame
    size = (64 << 10) if run.smoke else 4 * MiB
    chunks = dssst1.encode_chunks(frame, kind="request", max_bytes=size)

    def assemble() -> memoryview | None:
        assembler = dssst1.ChunkAssembler("request")
        out = None
        for item in chunks:
            out = assembler.feed(item) or out
        return out

    run.time("chunks", f"encode_chunks ({size >> 10} KiB)",
             lambda: dssst1.encode_chunks(frame, kind="request", max_bytes=size),
             f"{len(chunks)} chunks, sha256 of the frame included")  # fmt: skip
    run.time("chunks", "ChunkAssembler (feed all)", assemble, "one copy + sha256 verify")


def bench_payload(title: str, value: Any, smoke: bool, heavy: bool) -> Table:
    run = Run(title, value, smoke, heavy)
    encode_rows(run)
    decode_rows(run)
    chunk_rows(run)
    return run.table


def bench_hashes(smoke: bool) -> None:
    print("\n## chunk checksums")
    print(f"{'size':>8} {'function':28} {'time':>11} {'GB/s':>8}")
    rng = np.random.default_rng(1)
    for size in [1 * MiB] if smoke else [4 * MiB, 60 * MiB]:
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        funcs: list[tuple[str, Callable[[bytes], Any]]] = [
            ("hashlib.sha256", lambda b: hashlib.sha256(b).digest()),
            ("hashlib.sha1", lambda b: hashlib.sha1(b).digest()),
            ("hashlib.blake2b", lambda b: hashlib.blake2b(b).digest()),
            ("zlib.crc32 (payload_crc32)", zlib.crc32),
            ("zlib.adler32", zlib.adler32),
        ]
        for name, fn in funcs:
            seconds = best_time(
                lambda fn=fn, data=data: fn(data),  # type: ignore[misc]
                min_runs=1 if smoke else 3,
                budget_s=0.01 if smoke else 0.5,
            )
            rate = size / seconds / 1e9
            print(f"{size // MiB:>5} MiB {name:28} {fmt_time(seconds):>11} {rate:8.2f}")


def report_targets(tables: dict[str, Table], smoke: bool) -> None:
    print("\n## targets (reported, not asserted)")
    if smoke:
        print("(smoke sizes: the targets are meant for the full run)")

    def get(key: str, op: str, method: str) -> float | None:
        return tables[key].times.get((op, method))

    def line(text: str, ok: bool | None) -> None:
        mark = "n/a " if ok is None else ("met " if ok else "MISS")
        print(f"[{mark}] {text}")

    a_dec = get("a", "decode", "dssst1")
    a_json = get("a", "decode", "json.loads(header) + views")
    if a_dec is not None:
        line(f"decode (a) <= 100 us: {a_dec * 1e6:.1f} us", a_dec <= 100e-6)
    if a_dec is not None and a_json is not None:
        line(
            f"decode (a) <= 1.5x json.loads(header)+views: {a_dec / a_json:.2f}x",
            a_dec <= 1.5 * a_json,
        )
    a_both = get("a", "decode", "json.loads(header, dss) + views")
    if a_dec is not None and a_both is not None:
        line(f"  for reference, {a_dec / a_both:.2f}x json.loads of header and dss + views", None)
    b_dec, b_st = get("b", "decode", "dssst1"), get("b", "decode", "safetensors.torch.load")
    line(
        f"decode (b) >= 10x faster than safetensors.torch.load: {b_st / b_dec:.0f}x"
        if b_dec and b_st else "decode (b) vs safetensors.torch.load: torch not installed",
        None if not (b_dec and b_st) else b_st >= 10 * b_dec,
    )  # fmt: skip
    for key in ("a", "b"):
        enc, tob = get(key, "encode", "dssst1"), get(key, "encode", "tobytes() into fresh memory")
        if enc and tob:
            line(f"dumps ({key}) <= 1.2x tobytes(): {enc / tob:.2f}x", enc <= 1.2 * tob)
        for other in ("safetensors.torch.save", "torch.save (BytesIO)"):
            base = get(key, "encode", other)
            if enc and base:
                line(f"dumps ({key}) faster than {other}: {base / enc:.2f}x", enc < base)
            else:
                line(f"dumps ({key}) vs {other}: torch not installed", None)
    for op in ("encode", "decode"):
        ours = get("c", op, "dssst1")
        for other in ("safetensors.numpy.save", "safetensors.numpy.load"):
            base = get("c", op, other)
            if ours and base:
                line(f"{op} (c) no worse than 2x {other}: {ours / base:.2f}x", ours <= 2 * base)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="small sizes, a few seconds")
    args = parser.parse_args()
    smoke = args.smoke
    print(f"# dssst1 codec benchmark{' (smoke)' if smoke else ''}")
    print(f"python {sys.version.split()[0]}, numpy {np.__version__}, "
          f"torch {getattr(torch, '__version__', 'absent')}")  # fmt: skip
    tables: dict[str, Table] = {}
    for key, title, make, heavy in (
        ("a", "(a) RL batch", rl_batch, False),
        ("b", "(b) bf16 weights, ~300 tensors", weight_set, True),
        ("c", "(c) 10k tensors x 64 bytes", many_small, False),
    ):
        value = make(smoke)
        tables[key] = bench_payload(title, value, smoke, heavy)
        tables[key].print()
        del value
        gc.collect()
    bench_hashes(smoke)
    report_targets(tables, smoke)


if __name__ == "__main__":
    main()
