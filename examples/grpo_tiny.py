"""GRPO on the embedded tiny model, end to end through the SDK (a plumbing toy; see sft_rl.py).

    python examples/grpo_tiny.py [--steps 40] [--seed 0] [--lr 1.5e-3] [--out out/reward.png]
                                 [--url http://127.0.0.1:8080]

Without `--url` it starts the on-prem server (`python -m arctic_servers.onprem serve`) on the
embedded tiny Qwen2 model, creates a job with a DeepSpeed training sub-job and a vLLM sampling
sub-job, and runs the RL loop through `arctic_sdk.AsyncClient`:

    generate (n samples per prompt, with the sampler's log-probs)
      -> reward: the fraction of the completion's first characters that match TARGET
      -> advantages: the reward minus the mean reward of its prompt's group (GRPO, group-relative)
      -> forward-backward (loss_fn "grpo", loss_mask on the completion tokens,
         old_log_probs_shifted = the sampler's log-probs)
      -> step -> sync-weights (the sampler serves the new weights from the next step on)

It prints the mean reward of every step (with a progress bar) and writes the reward curve as a
PNG. `--lr 0` is the control: the weights never move and the reward stays at its start level.
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
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

TARGET = " a a a a a a"
LR = 1.5e-3
PROMPTS = (
    "Say the letter a twelve times.",
    "Write aaaa.",
    "Repeat after me: a a a.",
    "What comes after aaaa?",
)


def reward(text: str, target: str = TARGET) -> float:
    """Dense reward: the fraction of `target`'s characters that the completion matches in place."""
    return sum(1 for a, b in zip(text, target, strict=False) if a == b) / len(target)


@dataclass
class RunResult:
    rewards: list[float] = field(default_factory=list)  # mean reward per step
    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0
    job_id: str = ""

    def window(self, k: int = 5) -> tuple[float, float]:
        """Mean reward of the first and of the last `k` steps."""
        return float(np.mean(self.rewards[:k])), float(np.mean(self.rewards[-k:]))


def chat_prompt(tokenizer_template: str, text: str) -> str:
    return tokenizer_template.replace("{user}", text)


def build_batch(
    prompt_ids: Sequence[Sequence[int]],
    samples: Sequence[Sequence[dict[str, Any]]],
    adv: np.ndarray,
) -> dict[str, Any]:
    """The canonical forward-backward frame of one GRPO step (training.proto alignment).

    Rows are prompt + completion, right-padded. `loss_mask` and `advantages` are token-aligned
    (1 / A on the completion's tokens); `old_log_probs_shifted[:, i]` is the sampler's log-prob
    of token i + 1.
    """
    rows, plens, lps, advs = [], [], [], []
    k = 0
    for p, group in zip(prompt_ids, samples, strict=True):
        for s in group:
            rows.append(list(p) + list(s["token_ids"]))
            plens.append(len(p))
            lps.append(list(s.get("logprobs") or [0.0] * len(s["token_ids"])))
            advs.append(float(adv[k]))
            k += 1
    width = max(len(r) for r in rows)
    b = len(rows)
    ids = np.zeros((b, width), np.int64)
    attn = np.zeros((b, width), np.int64)
    mask = np.zeros((b, width), np.float32)
    a = np.zeros((b, width), np.float32)
    old = np.zeros((b, width), np.float32)
    for i, (r, pl, lp, av) in enumerate(zip(rows, plens, lps, advs, strict=True)):
        ids[i, : len(r)] = r
        attn[i, : len(r)] = 1
        mask[i, pl : len(r)] = 1.0
        a[i, pl : len(r)] = av
        old[i, pl - 1 : len(r) - 1] = lp  # prediction of token j sits in column j - 1
    return {
        "kwargs": {"input_ids": ids, "attention_mask": attn},
        "context": {"advantages": a, "loss_mask": mask, "old_log_probs_shifted": old},
        "processing": {
            "loss_fn": "grpo",
            "config": {"eps_clip": 0.2, "loss_agg_mode": "token-mean"},
        },
    }


async def run_grpo(
    client: Any,
    *,
    steps: int,
    seed: int,
    lr: float,
    n: int = 16,
    max_tokens: int = 12,
    entropy_coeff: float = 0.0,
    step_lr: float | None = None,
    progress: bool = True,
    log: Any = None,
) -> RunResult:
    """The RL loop on a client whose job is running (training + sampling sub-jobs)."""
    from tqdm import tqdm

    template = "<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
    prompts = [chat_prompt(template, p) for p in PROMPTS]
    res = RunResult(job_id=client.job_id or "")
    t0 = time.perf_counter()
    bar = tqdm(
        range(steps), desc=f"GRPO seed={seed} lr={lr:g}", disable=not progress, file=sys.stdout
    )
    for step in bar:
        gen = await client.generate(
            prompts=prompts,
            sampling_params={
                "n": n,
                "max_tokens": max_tokens,
                "temperature": 1.0,
                "seed": seed * 100_003 + step * 101,
                "logprobs": 0,
            },
        )
        groups = [r["samples"] for r in gen["results"]]
        prompt_ids = [r["prompt_token_ids"] for r in gen["results"]]
        rewards = np.array([[reward(s["text"]) for s in g] for g in groups], np.float64)
        # group-relative advantages, not divided by the group's std ("Dr. GRPO"): dividing
        # amplifies tiny reward differences and collapses this small policy within a few steps
        adv = rewards - rewards.mean(axis=1, keepdims=True)
        batch = build_batch(prompt_ids, groups, adv.reshape(-1))
        if entropy_coeff:
            batch["processing"]["config"]["entropy_coeff"] = entropy_coeff
        fb = await client.forward_backward(batch)
        # step_lr: override the job's learning rate on every step (a control run at lr 0 can
        # then share a job with the real runs)
        await client.step(learning_rate=step_lr) if step_lr is not None else await client.step()
        await client.sync_weights()
        res.rewards.append(float(rewards.mean()))
        res.losses.append(float(fb["loss"]))
        bar.set_postfix(reward=f"{rewards.mean():.3f}")
        if log is not None:
            log(
                f"step {step:3d}  reward {rewards.mean():.3f}  loss {fb['loss']:+.4f}  "
                f"weight_version {gen['weight_version']}"
            )
    res.seconds = time.perf_counter() - t0
    return res


def training_job(seed: int, lr: float, model: str = "tiny") -> dict[str, Any]:
    return {
        "sub_job_configs": [
            {
                "job_type": "training",
                "model_name": model,
                "seed": seed,
                "training_config": {
                    "zero_stage": 1,
                    "gradient_clipping": 1.0,
                    "optimizer": {"name": "adamw", "lr": lr, "weight_decay": 0.0},
                },
            },
            {"job_type": "sampling", "model_name": model, "seed": seed},
        ],
        "experiment_name": "grpo-tiny",
        "labels": {"example": "grpo_tiny", "seed": str(seed)},
    }


async def run_job(
    base_url: str,
    *,
    steps: int,
    seed: int,
    lr: float,
    progress: bool = True,
    log: Any = None,
    model: str = "tiny",
) -> RunResult:
    """Create a job on the server at `base_url`, run GRPO in it, cancel it."""
    from arctic_sdk import AsyncClient

    async with AsyncClient(base_url) as client:
        await client.create_job(training_job(seed, lr, model))
        try:
            await client.wait_until_running(timeout=600)
            return await run_grpo(client, steps=steps, seed=seed, lr=lr, progress=progress, log=log)
        finally:
            with contextlib.suppress(Exception):
                await client.cancel_job()


@contextlib.asynccontextmanager
async def local_server(python: str = sys.executable) -> AsyncIterator[str]:
    """`python -m arctic_servers.onprem serve` on free ports; yields its base URL."""
    tmp = Path(tempfile.mkdtemp(prefix="arctic-grpo-"))
    ready = tmp / "ready.json"
    proc = subprocess.Popen(
        [
            python,
            "-m",
            "arctic_servers.onprem",
            "serve",
            "--port",
            "0",
            "--no-grpc",
            "--ready-file",
            str(ready),
            "--data-dir",
            str(tmp / "data"),
        ],
        stdout=open(tmp / "server.log", "w"),  # noqa: SIM115 - lives as long as the server
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            if proc.poll() is not None:
                raise RuntimeError(
                    f"the server exited ({proc.returncode}); see {tmp / 'server.log'}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start; see {tmp / 'server.log'}")
            await asyncio.sleep(0.1)
        yield str(json.loads(ready.read_text())["base_url"])
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def plot(results: dict[str, RunResult], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, r in results.items():
        ax.plot(range(1, len(r.rewards) + 1), r.rewards, marker="o", ms=3, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel(f"mean reward (fraction of {TARGET!r} matched)")
    ax.set_title("GRPO on the tiny model (on-prem server: DeepSpeed + vLLM)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)


def _log(line: str) -> None:
    from tqdm import tqdm

    tqdm.write(line, file=sys.stdout)


async def amain(args: argparse.Namespace) -> int:
    async with contextlib.AsyncExitStack() as stack:
        url = args.url or await stack.enter_async_context(local_server())
        runs: dict[str, RunResult] = {}
        for seed in args.seeds or [args.seed]:
            r = await run_job(
                url, steps=args.steps, seed=seed, lr=args.lr, model=args.model, log=_log
            )
            first, last = r.window()
            print(
                f"seed {seed}: reward first 5 steps {first:.3f} -> last 5 steps {last:.3f} "
                f"({r.seconds:.1f} s)",
                flush=True,
            )
            runs[f"seed {seed}, lr {args.lr:g}"] = r
        if args.control:
            r = await run_job(
                url, steps=args.steps, seed=args.seed, lr=0.0, model=args.model, log=_log
            )
            first, last = r.window()
            print(
                f"control lr=0: reward first 5 steps {first:.3f} -> last 5 steps {last:.3f}",
                flush=True,
            )
            runs["control, lr 0"] = r
    if args.out:
        plot(runs, Path(args.out))
        print(f"reward curve: {args.out}")
    if args.json:
        Path(args.json).write_text(json.dumps({k: v.rewards for k, v in runs.items()}, indent=1))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", type=int, nargs="*", help="several seeds, one job each")
    ap.add_argument("--lr", type=float, default=LR)
    ap.add_argument("--control", action="store_true", help="also run an lr=0 control")
    ap.add_argument("--out", default="out/reward.png", help="reward-curve PNG ('' = none)")
    ap.add_argument("--json", default="", help="also write the per-step rewards here")
    ap.add_argument(
        "--url",
        default=os.environ.get("ARCTIC_ONPREM_URL", ""),
        help="a running server (default: start one)",
    )
    ap.add_argument(
        "--model",
        default="tiny",
        help="model on the server (default 'tiny': the on-prem server's embedded tiny model; "
        "the fake gateway takes any name)",
    )
    return asyncio.run(amain(ap.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
