#!/usr/bin/env python3
"""N LoRA tenants on one base model: a LoRA pool against N separate jobs.

    python bench/multi_tenant.py                # N = 1, 4, 16 pooled; N = 1, 4 separate
    python bench/multi_tenant.py --smoke        # N = 1, 2 pooled, N = 1 separate, one step
    python bench/multi_tenant.py --pooled 1,4,16 --separate 1,4 --steps 8 --json out.json

Two on-prem servers on the embedded tiny model (fp32, one thread per engine, no pre-warmed
workers, so the memory is the jobs' own): one with `--lora-pool *=MAX` (every tenant's adapter
in ONE trainer process and ONE vLLM sampler over one copy of the base model), one without (each
LoRA job starts its own DeepSpeed trainer and vLLM sampler). Tenants are added until each N of
the list is reached; at each N:

- memory: the proportional set size (PSS, so pages shared between processes count once) of the
  server and every process it started (its workers and their engines), after every tenant has
  trained, synced its adapter and sampled with it;
- CreateJob → first result: from CreateJob to the answer of the tenant's first forward-backward
  (training + sampling sub-jobs, rank 8): the first tenant of a pool starts its engines (cold);
  a tenant that joins a warm pool only attaches its adapter;
- step throughput: every tenant runs `--steps` forward-backward + step pairs at once (a 4 x 64
  batch); steps per second per tenant (the median tenant's) and in all.

Targets (issue 34): the memory of 16 pooled tenants at most 1.5 x one separate job's; a new
tenant on a warm pool answers its first forward-backward in under 2 s on this machine. N = 16
separate jobs (32 engine processes) is not run on a small machine by default: its row is 16 x
one separate job's memory, marked as extrapolated.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common.proc_cpu import MARK_VAR, marked, new_mark

ROOT = Path(__file__).resolve().parent.parent
LORA = {"rank": 8}
BATCH = np.random.default_rng(0).integers(3, 500, (4, 64)).astype(np.int64)
FB = {"kwargs": {"input_ids": BATCH}, "processing": {"loss_fn": "cross_entropy"}}
GEN = {"prompts": [[5, 6, 7, 8]], "sampling_params": {"max_tokens": 8, "temperature": 0.0}}


def job_body(seed: int) -> dict[str, Any]:
    return {
        "sub_job_configs": [
            {
                "job_type": "training",
                "seed": seed,
                "training_config": {"optimizer": {"name": "adamw", "lr": 1e-2}, "lora": LORA},
            },
            {"job_type": "sampling"},
        ],
        "experiment_name": "bench-multi-tenant",
    }


def start(tmp: Path, name: str, *extra: str) -> tuple[subprocess.Popen[bytes], str, str]:
    ready, mark = tmp / f"{name}.ready.json", new_mark()
    log = open(tmp / f"{name}.log", "wb")  # noqa: SIM115 - closed below, the child keeps its own
    proc = subprocess.Popen(
        [sys.executable, "-m", "arctic_servers.onprem", "serve", "--port", "0", "--no-grpc",
         "--threads", "1", "--prewarm", "", "--max-slots", "64", "--data-dir",
         str(tmp / f"{name}-data"), "--ready-file", str(ready), *extra],
        stdout=log, stderr=subprocess.STDOUT,
        env={**os.environ, MARK_VAR: mark,
             "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "servers"), str(ROOT / "sdk"),
                                                        os.environ.get("PYTHONPATH", "")) if p)},
    )  # fmt: skip
    log.close()
    deadline = time.monotonic() + 180
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError((tmp / f"{name}.log").read_text()[-3000:])
        time.sleep(0.05)
    return proc, json.loads(ready.read_text())["base_url"], mark


def pss_mib(mark: str) -> float:
    """PSS of every process carrying the server's mark (the server, its workers, engines)."""
    total = 0
    for pid in marked(mark):
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


async def add_tenant(url: str, seed: int) -> tuple[Any, float]:
    """A new tenant: its client and the seconds from CreateJob to its first forward-backward."""
    from arctic_sdk import AsyncClient

    client = AsyncClient(url, timeout=3600)
    t0 = time.perf_counter()
    await client.create_job(job_body(seed))
    await client.wait_until_running(timeout=3600)
    await client.forward_backward(FB)
    return client, time.perf_counter() - t0


async def tenant_steps(client: Any, steps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(steps):
        await client.forward_backward(FB)
        await client.step()
    return time.perf_counter() - t0


async def run_mode(url: str, mark: str, counts: list[int], steps: int) -> list[dict[str, Any]]:
    clients: list[Any] = []
    firsts: list[float] = []
    rows = []
    try:
        for n in counts:
            while len(clients) < n:
                client, took = await add_tenant(url, seed=len(clients))
                clients.append(client)
                firsts.append(took)
                print(
                    f"  tenant {len(clients)}: CreateJob -> first result {took:.2f} s", flush=True
                )
            t0 = time.perf_counter()
            spent = await asyncio.gather(*(tenant_steps(c, steps) for c in clients))
            wall = time.perf_counter() - t0
            for c in clients:  # each tenant's adapter in its sampler
                await c.sync_weights()
                await c.generate(GEN)
            per_tenant = statistics.median(steps / s for s in spent)
            rows.append(
                {
                    "n": n,
                    "memory_mib": round(pss_mib(mark), 1),
                    "first_cold_s": round(firsts[0], 2),
                    "first_next_s": [round(x, 2) for x in firsts[1:]],
                    "steps_per_s_per_tenant": round(per_tenant, 3),
                    "steps_per_s_total": round(n * steps / wall, 3),
                }
            )
            print(f"  N={n}: {rows[-1]}", flush=True)
    finally:
        for c in clients:
            try:
                await c.cancel_job()
            finally:
                await c.close()
    return rows


def measure(tmp: Path, mode: str, counts: list[int], steps: int) -> list[dict[str, Any]]:
    if not counts:
        return []
    extra = ("--lora-pool", f"*={max(counts)}") if mode == "pooled" else ()
    proc, url, mark = start(tmp, mode, *extra)
    try:
        return asyncio.run(run_mode(url, mark, counts, steps))
    finally:
        proc.terminate()
        proc.wait(120)


def table(pooled: list[dict[str, Any]], separate: list[dict[str, Any]], extrapolate: int) -> str:
    one = next((r["memory_mib"] for r in separate if r["n"] == 1), None)
    lines = [
        "# LoRA tenants on one base model: a pool vs separate jobs (tiny model, fp32)",
        f"{'mode':<10}{'N':>4}{'memory MiB':>12}{'x one job':>11}{'first, cold s':>15}"
        f"{'next, median / max s':>22}{'steps/s/tenant':>16}{'steps/s all':>13}",
    ]
    rows = [("pooled", r) for r in pooled] + [("separate", r) for r in separate]
    for mode, r in rows:
        nxt = r["first_next_s"]
        later = f"{statistics.median(nxt):.2f} / {max(nxt):.2f}" if nxt else "-"
        ratio = f"{r['memory_mib'] / one:.2f}" if one else "-"
        lines.append(
            f"{mode:<10}{r['n']:>4}{r['memory_mib']:>12.1f}{ratio:>11}{r['first_cold_s']:>15.2f}"
            f"{later:>22}{r['steps_per_s_per_tenant']:>16.3f}{r['steps_per_s_total']:>13.3f}"
        )
    if one and extrapolate:
        mem = one * extrapolate
        lines.append(
            f"{'separate':<10}{extrapolate:>4}{mem:>12.1f}{mem / one:>11.2f}"
            "   (extrapolated: N x one job's memory; not run)"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python bench/multi_tenant.py")
    ap.add_argument("--pooled", default="1,4,16", help="tenant counts of the pool")
    ap.add_argument("--separate", default="1,4", help="tenant counts of separate jobs")
    ap.add_argument("--steps", type=int, default=6, help="fb + step pairs per tenant per N")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    pooled_n = [int(x) for x in args.pooled.split(",") if x]
    separate_n = [int(x) for x in args.separate.split(",") if x]
    steps = args.steps
    if args.smoke:
        pooled_n, separate_n, steps = [1, 2], [1], 1
    with tempfile.TemporaryDirectory(prefix="arctic-bench-tenants-") as tmp:
        print("pooled:", flush=True)
        pooled = measure(Path(tmp), "pooled", pooled_n, steps)
        print("separate:", flush=True)
        separate = measure(Path(tmp), "separate", separate_n, steps)
    extrapolate = max(pooled_n) if max(pooled_n) not in separate_n else 0
    print(table(pooled, separate, extrapolate))
    one = next((r["memory_mib"] for r in separate if r["n"] == 1), None)
    biggest = pooled[-1]
    warm = [x for r in pooled for x in r["first_next_s"]]
    if one:
        print(f"memory: {biggest['n']} pooled tenants = {biggest['memory_mib'] / one:.2f} x one "
              "job's (target <= 1.5)")  # fmt: skip
    if warm:
        print(f"a new tenant on a warm pool: first result in {statistics.median(warm):.2f} s "
              f"(median), {max(warm):.2f} s (max) (target < 2 s)")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"pooled": pooled, "separate": separate}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
