#!/usr/bin/env python3
"""The GPU checks (`tools/gpu_check.sh` installs what they need and runs this): one result line
per check, `PASS`, `FAIL` or `SKIP`, then a JSON summary.

    python tools/gpu_check.py                 # on a CUDA machine: every check
    python tools/gpu_check.py --cpu           # the same flow on CPU where a check has a CPU
                                              # form (gloo for NCCL); the GPU-only ones SKIP
    python tools/gpu_check.py --list          # the checks, nothing run
    python tools/gpu_check.py --only nccl_group,sync_nccl

Checks:

- `cuda`: torch sees a CUDA device, and NCCL;
- `nccl_group`: two processes build the weight group (`engines/weight_transfer/group.py`) on
  NCCL and move a state dict in several buckets, bit-exact (CPU form: gloo). NCCL takes one
  device per rank: SKIP on a one-GPU machine;
- `sync_nccl`: a gateway over a local one-node Ray cluster with the machine's GPUs (Ray gives
  the trainer and the sampler one each): a sync with `method: nccl` (backend nccl), then the
  sampler's log-probs of its sampled tokens equal the trainer's (max |Δ| <= 1e-4, fp32), and a
  second sync reuses the group. SKIP on a one-GPU machine. (CPU form: an on-prem server,
  `collective` on gloo);
- `sync_cuda_ipc`: an on-prem server (trainer and sampler share GPU 0): the same with
  `method: cuda_ipc` (GPU only);
- `sleep_wake`: `sleep-inference` frees the sampler's GPU memory (nvidia-smi's used memory
  drops), `wake-inference` brings it back and it generates again (GPU only);
- `bench_concurrency`, `bench_weight_sync`: the benchmarks' `--smoke` runs (the weight-sync one
  on the tiny model, its on-prem rows `cuda_ipc` and `safetensors` on a GPU;
  `ARCTIC_GPU_CHECK_FULL=1`: on the real-size model, 3 reps).

Every check runs under its own time limit; the whole run is meant to take under 10 minutes on
one GPU machine (the engines' start-ups are most of it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "sdk"), str(ROOT / "servers"), str(ROOT)]

CHECKS = ["cuda", "nccl_group", "sync_nccl", "sync_cuda_ipc", "sleep_wake",
          "bench_concurrency", "bench_weight_sync"]  # fmt: skip
GPU_ONLY = {"cuda", "sync_cuda_ipc", "sleep_wake"}


class Skip(Exception):
    pass


def gpu_mem_used_mib() -> int:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return sum(int(x) for x in out.stdout.split())


# ---------------------------------------------------------------------------- checks


def check_cuda(cpu: bool) -> str:
    import torch

    if not torch.cuda.is_available():
        raise AssertionError("torch sees no CUDA device")
    nccl = torch.cuda.nccl.version()
    return f"{torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}, NCCL {nccl}"


def _group_peer(rank: int, port: int, backend: str, out: str) -> None:
    import contextlib as cl

    import torch

    from arctic_servers.engines.weight_transfer import buckets
    from arctic_servers.engines.weight_transfer.group import Rendezvous, WeightGroup

    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dev = "cuda" if backend == "nccl" else "cpu"
    g = torch.Generator().manual_seed(0)
    sd = {f"model.layers.{i}.w": torch.randn(256, 1024, generator=g) for i in range(6)}
    sd["model.embed_tokens.weight"] = torch.randn(2048, 256, generator=g).bfloat16()
    if rank == 0:
        rdv = Rendezvous.bind("127.0.0.1")
        Path(out + ".port").write_text(str(rdv.port))
        grp = WeightGroup.join(
            "gpucheck", host="127.0.0.1", port=rdv.port, rank=0, world_size=2,
            backend=backend, timeout_s=60, rendezvous=rdv,
        )  # fmt: skip
        on = {k: v.to(dev) for k, v in sd.items()}
        metas = [buckets.meta_of(k, v) for k, v in on.items()]
        st = buckets.send(grp, metas, lambda ns: cl.nullcontext([on[n] for n in ns]),
                          version=1, bucket_bytes=2 << 20)  # fmt: skip
        Path(out).write_text(json.dumps(st.as_dict()))
    else:
        deadline = time.monotonic() + 60
        while not Path(out + ".port").exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        port = int(Path(out + ".port").read_text())
        grp = WeightGroup.join("gpucheck", host="127.0.0.1", port=port, rank=1, world_size=2,
                               backend=backend, timeout_s=60)  # fmt: skip
        got: dict[str, Any] = {}

        def keep(items: list[tuple[str, Any]]) -> None:
            got.update((n, t.cpu().clone()) for n, t in items)

        buckets.receive(grp, version=1, consume=keep)
        bad = [k for k in sd if not torch.equal(got[k], sd[k])]
        Path(out + ".recv").write_text(json.dumps({"bad": bad, "n": len(got)}))
    grp.close()


def _gpus() -> int:
    import torch

    return int(torch.cuda.device_count())


ONE_GPU = "NCCL takes one device per rank, and this machine has one GPU"


def check_nccl_group(cpu: bool) -> str:
    backend = "gloo" if cpu else "nccl"
    if not cpu and _gpus() < 2:
        raise Skip(ONE_GPU)
    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/res"
        procs = [subprocess.Popen([sys.executable, __file__, "--peer", str(r), backend, out])
                 for r in (0, 1)]  # fmt: skip
        for p in procs:
            if p.wait(120) != 0:
                raise AssertionError(f"a peer exited {p.returncode}")
        sent = json.loads(Path(out).read_text())
        recv = json.loads(Path(out + ".recv").read_text())
    assert not recv["bad"] and recv["n"] == 7, recv
    assert sent["num_buckets"] > 1, sent
    return f"{backend}: {sent['num_tensors']} tensors, {sent['num_bytes']} B in {sent['num_buckets']} buckets, bit-exact"  # noqa: E501


def _job(gpu: bool) -> dict[str, Any]:
    samp: dict[str, Any] = {"job_type": "sampling", "dtype": "float32"}
    if gpu:  # one GPU for both: the sampler leaves the trainer room
        samp["inference_config"] = {"vllm_config": {"gpu_memory_utilization": 0.35}}
    return {
        "sub_job_configs": [
            {"job_type": "training", "dtype": "float32",
             "training_config": {"zero_stage": 0, "optimizer": {"name": "sgd", "lr": 1e-2}}},
            samp,
        ],
        "experiment_name": "gpu-check",
    }  # fmt: skip


async def _sync_check(method: str, cpu: bool, sleep_wake: bool = False) -> str:
    sys.path.insert(0, str(ROOT / "bench"))
    from common.scaleout import servers
    from weight_sync import agreement, train_body

    tmp = Path(tempfile.mkdtemp(prefix="gpucheck-"))
    where: dict[str, Any] = {"kind": "onprem"}
    if method == "nccl":  # the GPUs assigned by Ray, one each
        where = {"kind": "gateway", "ray_gpus": _gpus()}
    with servers(where.pop("kind"), tmp, threads=2, **where) as srv:
        async with srv.client() as c:
            await c.create_job(_job(not cpu))
            await c.wait_until_running(timeout=600)
            await c.forward_backward(train_body())
            await c.step()
            if sleep_wake:
                return await _sleep_wake(c)
            first = dict(await c.sync_weights(method=method))
            d, n = await agreement(c)
            await c.forward_backward(train_body())
            await c.step()
            second = dict(await c.sync_weights(method=method))
            d2, _ = await agreement(c)
            await c.cancel_job()
    want = "nccl" if method == "nccl" else ("gloo" if method == "collective" else "")
    assert first.get("backend", "") == want, first
    assert d <= 1e-4 and d2 <= 1e-4, (d, d2)
    if method != "cuda_ipc":
        assert second["setup_seconds"] == 0.0, second
    return (f"{first['method']}/{first.get('backend') or '-'}: {first['num_bytes']} B, "
            f"{first['seconds']:.3f} s then {second['seconds']:.3f} s; max|d| {max(d, d2):.2g} "
            f"over {n} tokens")  # fmt: skip


async def _sleep_wake(c: Any) -> str:
    before = gpu_mem_used_mib()
    slept = await c.sleep_inference()
    await asyncio.sleep(2)
    asleep = gpu_mem_used_mib()
    woke = await c.wake_inference()
    gen = await c.generate(prompts=[[1, 2, 3]], sampling_params={"max_tokens": 4})
    await c.cancel_job()
    assert slept["applied"] and woke["applied"], (slept, woke)
    assert asleep < before - 256, f"used {before} MiB before sleep, {asleep} MiB asleep"
    assert gen["results"][0]["samples"][0]["token_ids"], gen
    return f"used {before} MiB -> {asleep} MiB asleep -> woke and generated"


def check_sync_nccl(cpu: bool) -> str:
    if not cpu and _gpus() < 2:
        raise Skip(ONE_GPU + " (a one-GPU host syncs by cuda_ipc: sync_cuda_ipc)")
    return asyncio.run(_sync_check("collective" if cpu else "nccl", cpu))


def check_sync_cuda_ipc(cpu: bool) -> str:
    return asyncio.run(_sync_check("cuda_ipc", cpu))


def check_sleep_wake(cpu: bool) -> str:
    return asyncio.run(_sync_check("", cpu, sleep_wake=True))


def _bench(argv: list[str]) -> str:
    res = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True,
                         timeout=900)  # fmt: skip
    if res.returncode != 0:
        raise AssertionError(res.stdout[-1500:] + res.stderr[-1500:])
    return res.stdout.strip().splitlines()[-1][:200] if res.stdout.strip() else "ok"


def check_bench_concurrency(cpu: bool) -> str:
    return _bench(["bench/concurrency.py", "--smoke"])


def check_bench_weight_sync(cpu: bool) -> str:
    full = os.environ.get("ARCTIC_GPU_CHECK_FULL") == "1"
    args = ["--reps", "3"] if full else ["--smoke"]
    args += ["--phases", "onprem,floor", "--kinds", "full" if cpu else "full,lora"]
    if not cpu:
        args += ["--onprem-methods", "cuda_ipc,safetensors"]
    return _bench(["bench/weight_sync.py", *args, "--json", "out/gpu_weight_sync.json"])


RUNNERS: dict[str, Callable[[bool], str]] = {
    "cuda": check_cuda, "nccl_group": check_nccl_group, "sync_nccl": check_sync_nccl,
    "sync_cuda_ipc": check_sync_cuda_ipc, "sleep_wake": check_sleep_wake,
    "bench_concurrency": check_bench_concurrency, "bench_weight_sync": check_bench_weight_sync,
}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpu", action="store_true", help="the CPU forms; GPU-only checks SKIP")
    ap.add_argument("--only", default="", help="comma-separated checks (default: all)")
    ap.add_argument("--list", action="store_true", help="list the checks and exit")
    ap.add_argument("--json", type=Path, default=ROOT / "out" / "gpu_check.json")
    ap.add_argument("--peer", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.peer:
        _group_peer(int(args.peer[0]), 0, args.peer[1], args.peer[2])
        return 0
    names = [n for n in args.only.split(",") if n] or CHECKS
    unknown = [n for n in names if n not in RUNNERS]
    if unknown:
        ap.error(f"unknown checks {unknown}; known: {CHECKS}")
    if args.list:
        print("\n".join(f"{n}{' (GPU only)' if n in GPU_ONLY else ''}" for n in names))
        return 0
    results: list[dict[str, Any]] = []
    for name in names:
        t0 = time.monotonic()
        try:
            if args.cpu and name in GPU_ONLY:
                raise Skip("GPU only")
            detail, status = RUNNERS[name](args.cpu), "PASS"
        except Skip as exc:
            detail, status = str(exc), "SKIP"
        except Exception as exc:  # one line per check, whatever failed
            detail, status = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:600], "FAIL"
        secs = time.monotonic() - t0
        results.append({"check": name, "status": status, "seconds": secs, "detail": detail})
        print(f"{status} {name} ({secs:.0f} s): {detail}", flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        args.json.write_text(json.dumps(results, indent=1))
    return 1 if any(r["status"] == "FAIL" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
