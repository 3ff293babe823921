#!/usr/bin/env python3
"""Latency of the foreign surfaces against the arctic.v1 call they stand for, on one server.

    python bench/surfaces.py            # 60 timed calls of each (bench/README.md "surfaces")
    python bench/surfaces.py --smoke    # 5 of each, a few seconds of calls; CI runs it (no
                                        # thresholds)

It starts `python -m arctic_servers.gateway --engine fake` (its own process and GIL, a fresh
SQLite file in a temporary directory) and times, one call after another, each awaited to its
answer:

1. `tinker`: one small `forward_backward` (cross_entropy, one datum of 16 tokens) through the
   unmodified `tinker` 0.38 client's training client (a LoRA model of `fake-model`);
2. `openai`: one chat completion (3 tokens, seeded) through the unmodified `openai` client on
   the gateway's `/v1`, on a sampling job of `fake-model`;
3. the baselines, on the same server in the same run: the arctic.v1 call each surface makes —
   a forward-backward of the body the Tinker surface builds for that datum, and a generate of
   3 tokens — through the `arctic_sdk` client.

Each row: median and p90 latency over the timed calls (after warm-up calls), and `x native`:
the median over its baseline's median (the surface's overhead as a factor: 1.0 = free).
Target (issue 32; reported, not asserted): the Tinker row at least 2x faster than before the
surface called the core in process (bench/README.md: before and after).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "sdk"), str(ROOT / "servers")]

from arctic_sdk.spec.tables import methods as M  # noqa: E402
from bench.common.fake_gateway import fake_gateway  # noqa: E402

TOKEN = "bench-token"
MODEL = "fake-model"
TOKENS = list(range(5, 22))  # a datum of 16 input tokens and 16 targets
FB, GEN = M.FORWARD_BACKWARD.python_name, M.GENERATE.python_name  # the rows' names
MESSAGES = [{"role": "user", "content": "Say something."}]


def timed(fn: Callable[[], Any], n: int, warm: int) -> list[float]:
    for _ in range(warm):
        fn()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def fb_body() -> dict[str, Any]:
    """The forward-backward the Tinker surface sends for the datum (tinker/losses.py)."""
    n = len(TOKENS) - 1
    ids = np.array([TOKENS], np.int64)
    weights = np.zeros((1, n + 1), np.float32)
    weights[0, 1:] = 1.0
    return {
        "args": [],
        "kwargs": {"input_ids": ids, "attention_mask": np.ones((1, n + 1), np.int64)},
        "context": {"weights": weights},
        "processing": {
            "loss_fn": "cross_entropy",
            "config": {"loss_agg_mode": "sum"},
            "post": ["compute_logprobs"],
        },
    }


def bench_native(base: str, n: int, warm: int) -> dict[str, list[float]]:
    from arctic_sdk import Client

    # polled tightly (the gateway answers every data-plane call 202, `--answer-mode async`;
    # the SDK's deployed first poll is 0.5 s): the floor of the call over HTTP
    poll = {"initial": 0.002, "multiplier": 1.25, "max_interval": 0.02}
    cfg = {"poll": poll, "progress": False}
    with Client(base, token=TOKEN, config=cfg) as c:
        c.create_job(
            sub_job_configs=[
                {"job_type": "training", "model_name": MODEL},
                {"job_type": "sampling", "model_name": MODEL},
            ]
        )
        c.wait_until_running()
        body = fb_body()
        params = {"max_tokens": 3, "seed": 1, "temperature": 1.0}
        return {
            FB: timed(lambda: c.forward_backward(body), n, warm),
            GEN: timed(lambda: c.generate(prompts=[[5, 6, 7, 8]], sampling_params=params), n, warm),
        }


def bench_tinker(base: str, n: int, warm: int) -> list[float]:
    import tinker
    from tinker import types

    datum = types.Datum(
        model_input=types.ModelInput.from_ints(TOKENS[:-1]),
        loss_fn_inputs={"target_tokens": TOKENS[1:]},
    )
    with tinker.ServiceClient(base_url=base, api_key="tml-" + TOKEN) as svc:
        tc = svc.create_lora_training_client(MODEL, rank=8).result()
        return timed(lambda: tc.forward_backward([datum], "cross_entropy").result(), n, warm)


def bench_openai(base: str, n: int, warm: int) -> list[float]:
    import openai

    from arctic_sdk import Client

    with Client(base, token=TOKEN, progress=False) as c:
        c.create_job(sub_job_configs=[{"job_type": "sampling", "model_name": MODEL}])
        c.wait_until_running()
        job = c.job_id
    client = openai.OpenAI(base_url=base + "/v1", api_key=TOKEN, max_retries=0)
    try:

        def chat() -> None:
            out = client.chat.completions.create(
                model=str(job),
                messages=MESSAGES,
                max_tokens=3,
                seed=1,  # type: ignore[arg-type]
            )
            assert out.choices[0].message is not None

        return timed(chat, n, warm)
    finally:
        client.close()


def row(name: str, xs: list[float], base: list[float] | None) -> str:
    med = statistics.median(xs)
    p90 = sorted(xs)[min(len(xs) - 1, int(0.9 * len(xs)))]
    ratio = f"{med / statistics.median(base):8.2f}" if base else "    1.00"
    return f"{name:<40} {med * 1e3:9.2f} ms {p90 * 1e3:9.2f} ms {ratio}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="5 calls of each (CI)")
    ap.add_argument("-n", type=int, default=60, help="timed calls of each")
    args = ap.parse_args()
    n, warm = (5, 2) if args.smoke else (args.n, 5)
    os.environ.setdefault("TINKER_TELEMETRY", "0")
    with (
        tempfile.TemporaryDirectory() as d,
        fake_gateway(Path(d), TOKEN, ["--gpus", "16", "--tinker-models", MODEL]) as base,
    ):
        native = bench_native(base, n, warm)
        tink = bench_tinker(base, n, warm)
        chat = bench_openai(base, n, warm)
    import tinker

    print("# surfaces: one call at a time against `python -m arctic_servers.gateway --engine fake`")
    print(
        f"python {platform.python_version()}, tinker {tinker.__version__}, "
        f"{os.cpu_count()} CPUs, {n} timed calls each"
    )
    print(f"{'call':<40} {'median':>12} {'p90':>12} {'x native':>8}")
    print(row(f"arctic.v1 {FB} (arctic_sdk)", native[FB], None))
    print(row(f"tinker {FB}", tink, native[FB]))
    print(row(f"arctic.v1 {GEN} (arctic_sdk)", native[GEN], None))
    print(row("openai chat.completions (3 tokens)", chat, native[GEN]))


if __name__ == "__main__":
    main()
