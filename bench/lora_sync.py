#!/usr/bin/env python3
"""A LoRA job against a full fine-tuning job on one server: bytes a sync moves, its time, and
the SFT loss curves.

    python bench/lora_sync.py                 # the embedded tiny model, rank 8, 5 syncs each
    python bench/lora_sync.py --model DIR --rank 16 --reps 3
    python bench/lora_sync.py --smoke         # one sync each (no thresholds)

One on-prem server, two jobs over the same base model (training + sampling, fp32, ZeRO-1): a
full fine-tuning job (AdamW lr `--lr-full`) and a LoRA job (`training_config.lora`, lr
`--lr-lora`: adapters take larger steps). Each rep is one cross-entropy forward-backward + step
on the same SFT batch (its loss is the curve) and one `sync-weights`; the table reports what
the servers' `SyncWeightsResult` says was moved (`num_tensors`, `num_bytes`) and its `seconds`
(export + load + prefix-cache reset, median of the reps). The ratio is LoRA over full; both jobs
run on the same loaded machine in the same run, so the ratio is what the run is for.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server import start_server

BATCH = np.array(
    [
        [84, 104, 101, 32, 113, 117, 105, 99, 107, 32, 98, 114],
        [300, 301, 302, 303, 304, 305, 306, 307, 308, 309, 310, 311],
        [10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120],
    ],
    np.int64,
)


async def measure(
    base_url: str, model: str, lora: dict[str, Any] | None, reps: int, lr: float
) -> Any:
    from arctic_sdk import AsyncClient

    opt = {"name": "adamw", "lr": lr, "weight_decay": 0.0}
    training: dict[str, Any] = {"zero_stage": 1, "optimizer": opt}
    if lora is not None:
        training["lora"] = lora
    async with AsyncClient(base_url) as client:
        await client.create_job(
            sub_job_configs=[
                {"job_type": "training", "model_name": model, "training_config": training},
                {"job_type": "sampling", "model_name": model},
            ]
        )
        await client.wait_until_running(timeout=1800)
        body = {
            "kwargs": {"input_ids": BATCH, "attention_mask": np.ones_like(BATCH)},
            "processing": {"loss_fn": "cross_entropy"},
        }
        out = []
        for _ in range(reps):
            fb = await client.forward_backward(body)
            await client.step()
            out.append({**dict(await client.sync_weights()), "loss": float(fb["loss"])})
        await client.cancel_job()
    return out


def row(name: str, syncs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "job": name,
        "num_tensors": int(syncs[-1]["num_tensors"]),
        "num_bytes": int(syncs[-1]["num_bytes"]),
        "seconds": statistics.median(float(s["seconds"]) for s in syncs),
        "weight_versions": [int(s["weight_version"]) for s in syncs],
        "losses": [round(float(s["loss"]), 4) for s in syncs],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python bench/lora_sync.py")
    ap.add_argument("--model", default="", help="a local HF model dir (default: the tiny one)")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--lr-full", type=float, default=1e-3)
    ap.add_argument("--lr-lora", type=float, default=2e-2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    reps = 1 if args.smoke else args.reps
    with tempfile.TemporaryDirectory(prefix="arctic-bench-lora-") as tmp:
        proc, info = start_server(Path(tmp), args.threads)
        try:
            url = info["base_url"]
            full = row("full", asyncio.run(measure(url, args.model, None, reps, args.lr_full)))
            lora = {"rank": args.rank}
            adapter = row(
                f"lora r={args.rank}",
                asyncio.run(measure(url, args.model, lora, reps, args.lr_lora)),
            )
        finally:
            proc.terminate()
            proc.wait(60)
    print(f"# weight sync, full vs LoRA (model {args.model or 'tiny'}, {reps} syncs each)")
    print(f"{'job':<12}{'tensors':>9}{'bytes':>14}{'seconds':>10}  versions")
    for r in (full, adapter):
        print(
            f"{r['job']:<12}{r['num_tensors']:>9}{r['num_bytes']:>14}{r['seconds']:>10.4f}  "
            f"{r['weight_versions']}"
        )
    for r in (full, adapter):
        print(f"SFT loss per step, {r['job']}: {r['losses']}")
    ratio_b = adapter["num_bytes"] / full["num_bytes"]
    ratio_t = adapter["seconds"] / full["seconds"]
    print(f"LoRA / full: bytes {ratio_b:.4f}, seconds {ratio_t:.3f}")
    if args.json:
        doc = {"full": full, "lora": adapter, "bytes_ratio": ratio_b, "seconds_ratio": ratio_t}
        args.json.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
