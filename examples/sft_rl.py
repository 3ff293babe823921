"""The README's main job: SFT, then RL, on integer addition, measured on held-out problems.

    python examples/sft_rl.py [--model tiny-4l | --model HF_DIR] [--url http://HOST:PORT]
                              [--seed 0] [--out out] [--smoke] [--set KNOB=VALUE ...]

Without `--url` it starts the on-prem server (DeepSpeed trainer, vLLM sampler) and drives one job
through `arctic_sdk.AsyncClient`:

1. **SFT**: `forward_backward` (`cross_entropy`, `loss_mask` on the answer and its stop token,
   the prompt masked out) submitted together with `step`, a batch of training problems per step,
   until the mean accuracy of the last `Recipe.sft_window` evaluations on a validation split
   (disjoint from the held-out problems, which no decision reads) is at or above
   `Recipe.sft_target` (or `Recipe.sft_max_steps`); then `save_checkpoint("sft")`.
2. **RL**, twice from that checkpoint (`load_checkpoint` + `sync_weights`): the RL arm and a
   control whose every step has learning rate 0. Per step: `generate` (`Recipe.group` samples per
   prompt at `Recipe.temperature`, with the sampler's log-probs) -> exact-match reward ->
   group-relative advantages -> `forward_backward` (`grpo`, `old_log_probs_shifted` = the
   sampler's log-probs) with `step` -> `sync_weights`.
3. **Evaluation** every few steps: `sync_weights`, then greedy `generate` of every held-out
   problem on the sampling sub-job; exact match against the sum.

It shows a progress bar per phase, writes `OUT/main_job.png` (held-out accuracy over steps: SFT,
then the RL arm and the control) and `OUT/main_job.json` (every curve), prints one `check:` line
per guarantee (`checks`; exit status 1 when one fails; not with `--smoke`) and ends with the lines

    sft: held-out accuracy A0 -> A1
    rl: held-out accuracy A1 -> A2
    control lr=0: held-out accuracy A1 -> A3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import resource
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from addition import AdditionTask, Problem, accuracy, is_correct, prompts
from main_job_io import Tokenizer, local_server, plot, resolve_local_model

from arctic_sdk import AsyncClient
from arctic_sdk.rollouts import flatten_turns, forward_backward_frame, pad_rollouts


@dataclass
class Recipe:
    """Every knob of the job (the defaults are the README's run)."""

    model: str = "tiny-4l"
    seed: int = 0
    digits: int = 2
    held_out: int = 200  # the reported accuracy; no decision ever reads it
    validation: int = 200  # what SFT's stopping rule reads (disjoint from held-out and training)
    sft_lr: float = 2e-3
    sft_batch: int = 64
    sft_max_steps: int = 1500  # seed 2 rises at steps 660-980 (bench/results/*-main-job.md)
    sft_target: float = 0.3  # stop SFT once the mean validation accuracy of ...
    sft_window: int = 3  # ... the last this many validation evaluations is at or above the target
    sft_eval_every: int = 5  # validation evaluations (cheap: the window sees the rise closely)
    sft_test_every: int = 25  # held-out evaluations during SFT (the plot's SFT curve only)
    rl_steps: int = 60
    rl_lr: float = 1e-3
    rl_warmup: int = 10  # RL steps of linear learning-rate warm-up (set per step with `step`)
    rl_final_lr: float = 0.1  # then cosine decay to this fraction of `rl_lr` at the last step
    rl_prompts: int = 64
    group: int = 8
    # sampling temperature of the RL rollouts; the sampler's log-probs (vLLM's raw log-probs) and
    # the trainer's are both of the unscaled distribution, so the importance ratio stays
    # consistent
    temperature: float = 0.7
    rl_eval_every: int = 5
    eps_clip: float = 0.2

    @staticmethod
    def smoke() -> Recipe:
        """CI sizes: the same SFT, stopped at the first evaluation at a lower accuracy, and a few
        RL steps per arm (the plumbing; the run-of-evaluations stop is `reached`'s unit test).

        SFT has to reach some accuracy for RL to have a signal at all: with every sample wrong,
        no group has an advantage and no GRPO step is taken.
        """
        return Recipe(sft_target=0.1, sft_window=1, rl_steps=4, rl_prompts=16, rl_eval_every=2)

    def override(self, settings: Sequence[str]) -> None:
        """Apply `KNOB=VALUE` settings (`--set`), typed as the knob's default; unknown refused."""
        for item in settings:
            key, sep, value = item.partition("=")
            if not sep or key in ("model", "seed") or not hasattr(self, key):
                knobs = ", ".join(k for k in asdict(self) if k not in ("model", "seed"))
                raise SystemExit(f"--set {item!r}: expected KNOB=VALUE with KNOB one of {knobs}")
            kind = type(getattr(self, key))
            try:
                setattr(self, key, kind(value))
            except ValueError:
                raise SystemExit(f"--set {item!r}: {value!r} is not a {kind.__name__}") from None


@dataclass
class Curve:
    """Held-out accuracy at the given steps of one phase or arm."""

    steps: list[int] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)  # SFT: cross-entropy of every step
    reward: list[float] = field(default_factory=list)  # RL: mean sampled reward per step
    # RL: the trainer's k1 KL to the sampler's log-probs, and the clipped fraction, per step
    # (both ~0 on-policy: the sampler's and the trainer's log-probs agree after each sync)
    approx_kl: list[float] = field(default_factory=list)
    clip_fraction: list[float] = field(default_factory=list)
    updated: list[bool] = field(default_factory=list)  # RL: a GRPO step was taken (not skipped)
    # SFT: validation accuracy at `val_steps` (what the stopping rule read)
    val_steps: list[int] = field(default_factory=list)
    val_accuracy: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)  # RL: each step's learning rate
    seconds: float = 0.0

    @property
    def first(self) -> float:
        return self.accuracy[0]

    @property
    def last(self) -> float:
        return self.accuracy[-1]


def training_job(r: Recipe, model: str) -> dict[str, Any]:
    return {
        "sub_job_configs": [
            {
                "job_type": "training",
                "model_name": model,
                "seed": r.seed,
                "training_config": {
                    "zero_stage": 1,
                    "gradient_clipping": 1.0,
                    "optimizer": {"name": "adamw", "lr": r.sft_lr, "weight_decay": 0.0},
                },
            },
            {"job_type": "sampling", "model_name": model, "seed": r.seed},
        ],
        "experiment_name": "main-job-sft-rl",
        "labels": {"example": "sft_rl", "seed": str(r.seed)},
    }


async def evaluate(
    client: Any, task: AdditionTask, problems: Sequence[Problem] | None = None, sync: bool = True
) -> float:
    """Sync the trainer's weights into the sampler, then greedy exact match on `problems` (the
    held-out set by default)."""
    problems = task.held_out if problems is None else problems
    if sync:
        await client.sync_weights()
    gen = await client.generate(
        prompts=prompts(problems),
        sampling_params={"n": 1, "temperature": 0.0, "max_tokens": task.digits + 2},
    )
    texts = [r["samples"][0]["text"] for r in gen["results"]]
    return accuracy(problems, texts)


def sft_frame(tok: Tokenizer, problems: Sequence[Problem]) -> dict[str, Any]:
    """Cross-entropy on the answer and its stop token; the prompt is masked out of the loss."""
    flat = [
        flatten_turns([tok.encode(p.prompt)], [[*tok.encode(p.answer), tok.eos_id]])
        for p in problems
    ]
    padded = pad_rollouts(flat, pad_token_id=tok.pad_id)
    return {
        "kwargs": {"input_ids": padded.input_ids, "attention_mask": padded.attention_mask},
        "context": {"loss_mask": padded.loss_mask},
        "processing": {"loss_fn": "cross_entropy", "config": {"loss_agg_mode": "token-mean"}},
    }


async def run_sft(
    client: Any, task: AdditionTask, tok: Tokenizer, r: Recipe, progress: bool
) -> Curve:
    from tqdm import tqdm

    curve = Curve()
    t0 = time.perf_counter()
    curve.steps.append(0)
    curve.accuracy.append(await evaluate(client, task))
    bar = tqdm(range(1, r.sft_max_steps + 1), desc="SFT", disable=not progress, file=sys.stdout)
    for step in bar:
        # pipelined: forward-backward and step go out together; one wait for both
        fb = client.submit_forward_backward(sft_frame(tok, task.train_batch(r.sft_batch)))
        st = client.submit_step()
        loss = float((await fb)["loss"])
        await st
        curve.loss.append(loss)
        if step % r.sft_eval_every == 0 or step == r.sft_max_steps:
            curve.val_steps.append(step)
            curve.val_accuracy.append(await evaluate(client, task, task.validation))
            bar.set_postfix(loss=f"{loss:.3f}", validation=f"{curve.val_accuracy[-1]:.3f}")
            stop = reached(curve.val_accuracy, r.sft_target, r.sft_window)
            if stop or step % r.sft_test_every == 0 or step == r.sft_max_steps:
                # the held-out figure is recorded, never read by the rule (weights just synced)
                curve.steps.append(step)
                curve.accuracy.append(await evaluate(client, task, sync=False))
            if stop:
                break
    bar.close()
    curve.seconds = time.perf_counter() - t0
    return curve


def reached(accuracy: Sequence[float], target: float, window: int) -> bool:
    """SFT's stop: the mean of the last `window` validation evaluations is at or above `target`.

    Addition is learnt in a jump whose steepness depends on the float kernels; evaluations a few
    steps apart see it closely, and a window's mean neither stops on one lucky evaluation nor
    waits for the top of the jump.
    """
    if window < 1:
        raise ValueError(f"sft_window must be >= 1, not {window}")
    tail = accuracy[-window:]
    # accuracies are fractions k / n: a mean equal to the target must not miss it by a rounding
    return len(tail) == window and sum(tail) / window >= target - 1e-9


def rl_frame(
    gen: dict[str, Any], problems: Sequence[Problem], r: Recipe
) -> tuple[dict[str, Any] | None, float]:
    """The GRPO frame of one generate result, and the mean reward (None: no advantage anywhere)."""
    flat, adv, rewards = [], [], []
    for p, res in zip(problems, gen["results"], strict=True):
        rew = np.array([float(is_correct(p, s["text"])) for s in res["samples"]])
        rewards.append(rew.mean())
        # group-relative advantage, not divided by the group's std (Dr. GRPO)
        a = rew - rew.mean()
        for s, ai in zip(res["samples"], a, strict=True):
            flat.append(flatten_turns([res["prompt_token_ids"]], [s["token_ids"]], [s["logprobs"]]))
            adv.append(float(ai))
    mean_reward = float(np.mean(rewards))
    if not any(adv):
        return None, mean_reward
    cfg = {"eps_clip": r.eps_clip, "loss_agg_mode": "token-mean"}
    return forward_backward_frame(flat, adv, loss_fn="grpo", config=cfg), mean_reward


async def run_rl(
    client: Any, task: AdditionTask, r: Recipe, *, lr: float, label: str, progress: bool
) -> Curve:
    """One arm from the SFT checkpoint: `lr` on every step (0 = the control)."""
    from tqdm import tqdm

    await client.load_checkpoint(checkpoint_id="sft")
    curve = Curve()
    t0 = time.perf_counter()
    curve.steps.append(0)
    curve.accuracy.append(await evaluate(client, task))  # syncs the loaded weights first
    rng = np.random.Generator(np.random.PCG64([r.seed, 19]))  # same prompts in both arms
    bar = tqdm(range(1, r.rl_steps + 1), desc=label, disable=not progress, file=sys.stdout)
    for step in bar:
        problems = _rl_problems(task, rng, r)
        gen = await client.generate(
            prompts=prompts(problems),
            sampling_params={
                "n": r.group,
                "temperature": r.temperature,
                "max_tokens": task.digits + 2,
                "seed": r.seed * 100_003 + step,
                "logprobs": 0,
            },
        )
        frame, reward = rl_frame(gen, problems, r)
        kl = clip = 0.0
        if frame is not None:  # pipelined, as in SFT
            fb = client.submit_forward_backward(frame)
            st = client.submit_step(learning_rate=lr * lr_factor(r, step))
            metrics = (await fb)["metrics"]
            kl, clip = float(metrics["approx_kl"]), float(metrics["clip_fraction"])
            await st
        # else every group agreed: no advantage anywhere, so no gradient and no optimizer step
        # (Adam's momentum would still move the weights)
        curve.reward.append(reward)
        curve.lr.append(lr * lr_factor(r, step))
        curve.approx_kl.append(kl)
        curve.clip_fraction.append(clip)
        curve.updated.append(frame is not None)
        if step % r.rl_eval_every == 0 or step == r.rl_steps:
            curve.steps.append(step)
            curve.accuracy.append(await evaluate(client, task))
            bar.set_postfix(reward=f"{reward:.3f}", held_out=f"{curve.last:.3f}")
        else:
            await client.sync_weights()
            bar.set_postfix(reward=f"{reward:.3f}")
    bar.close()
    curve.seconds = time.perf_counter() - t0
    return curve


def lr_factor(r: Recipe, step: int) -> float:
    """RL step `step`'s (1-based) learning rate as a fraction of the arm's: a linear warm-up over
    `rl_warmup` steps, then a cosine decay to `rl_final_lr` at step `rl_steps` (late steps, near
    the policy's best, move it less)."""
    if step <= r.rl_warmup:
        return step / max(1, r.rl_warmup)
    t = (step - r.rl_warmup) / max(1, r.rl_steps - r.rl_warmup)
    return r.rl_final_lr + (1.0 - r.rl_final_lr) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, t)))


def _rl_problems(task: AdditionTask, rng: np.random.Generator, r: Recipe) -> list[Problem]:
    """The step's prompts: training problems from the arm's own seeded stream (held out never)."""
    out: list[Problem] = []
    while len(out) < r.rl_prompts:
        a, b = (int(x) for x in rng.integers(0, task.n, size=2))
        p = Problem(a, b, task.digits)
        if not task.is_held_out(p):
            out.append(p)
    return out


async def run(url: str, r: Recipe, out: Path, progress: bool = True) -> dict[str, Curve]:
    """The whole job on the server at `url`; writes `out/main_job.{json,png}`."""
    task = AdditionTask(r.digits, r.held_out, r.seed, r.validation)
    # the server resolves the same name (an embedded config) or directory; the client reads the
    # tokenizer from its own copy
    model, model_dir = resolve_local_model(r.model)
    tok = Tokenizer(model_dir)
    curves: dict[str, Curve] = {}
    async with AsyncClient(url) as client:
        await client.create_job(training_job(r, model))
        try:
            t0 = time.perf_counter()
            await client.wait_until_running(timeout=600)
            print(f"job {client.job_id} running after {time.perf_counter() - t0:.0f} s", flush=True)
            curves["sft"] = await run_sft(client, task, tok, r, progress)
            await client.save_checkpoint(checkpoint_id="sft")
            curves["rl"] = await run_rl(
                client, task, r, lr=r.rl_lr, label=f"RL lr={r.rl_lr:g}", progress=progress
            )
            curves["control"] = await run_rl(
                client, task, r, lr=0.0, label="control lr=0", progress=progress
            )
        finally:
            with contextlib.suppress(Exception):
                await client.cancel_job()
    out.mkdir(parents=True, exist_ok=True)
    (out / "main_job.json").write_text(
        json.dumps(
            {"recipe": asdict(r), "curves": {k: asdict(v) for k, v in curves.items()}}, indent=1
        )
    )
    plot(curves, out / "main_job.png", r.model)
    return curves


def summary(curves: dict[str, Curve]) -> list[str]:
    sft, rl, ctl = curves["sft"], curves["rl"], curves["control"]
    return [
        f"sft: held-out accuracy {sft.first:.3f} -> {sft.last:.3f}",
        f"rl: held-out accuracy {sft.last:.3f} -> {rl.last:.3f}",
        f"control lr=0: held-out accuracy {sft.last:.3f} -> {ctl.last:.3f}",
    ]


#: The story the full run must tell on any CPU (README "Main job"): SFT leaves room, RL gains
#: clearly, the lr = 0 control stays where SFT left it.
SFT_RANGE = (0.2, 0.6)
RL_GAIN = 0.15
CONTROL_DRIFT = 0.02


def checks(curves: dict[str, Curve]) -> list[tuple[str, bool]]:
    """Each guarantee of the full run, and whether this run met it."""
    a1, a2, a3 = curves["sft"].last, curves["rl"].last, curves["control"].last
    lo, hi = SFT_RANGE
    return [
        (f"SFT leaves room: A1 {a1:.3f} in [{lo}, {hi}]", lo <= a1 <= hi),
        (
            f"RL gains: A2 {a2:.3f} >= A1 + {RL_GAIN} = {a1 + RL_GAIN:.3f}",
            a2 >= a1 + RL_GAIN - 1e-9,
        ),
        (
            f"control flat: |A3 - A1| = {abs(a3 - a1):.3f} <= {CONTROL_DRIFT}",
            abs(a3 - a1) <= CONTROL_DRIFT + 1e-9,
        ),
    ]


async def amain(args: argparse.Namespace) -> int:
    r = Recipe.smoke() if args.smoke else Recipe()
    r.seed = args.seed
    if args.model:
        r.model = args.model
    r.override(args.set)
    t0 = time.perf_counter()
    async with contextlib.AsyncExitStack() as stack:
        url = args.url or await stack.enter_async_context(local_server())
        curves = await run(url, r, Path(args.out))
    # the server (started here) and its workers have exited: their CPU time is in the children's
    cpu = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = sum(u.ru_utime + u.ru_stime for u in cpu)
    whose = "this process" if args.url else "this process and the server's"
    c = curves
    print(
        f"SFT {c['sft'].steps[-1]} steps ({c['sft'].seconds:.0f} s), RL {r.rl_steps} steps "
        f"({c['rl'].seconds:.0f} s), control ({c['control'].seconds:.0f} s); total "
        f"{time.perf_counter() - t0:.0f} s (CPU {cpu_s:.0f} s: {whose}); "
        f"curves: {args.out}/main_job.png",
        flush=True,
    )
    results = checks(curves)
    if not args.smoke:  # CI sizes make no claims
        for text, ok in results:
            print(f"check: {text}: {'ok' if ok else 'FAILED'}", flush=True)
    print("\n".join(summary(curves)), flush=True)
    return 0 if args.smoke or all(ok for _, ok in results) else 1


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default="", help="embedded config name or a local HF directory")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="out")
    ap.add_argument("--smoke", action="store_true", help="reduced sizes (CI)")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KNOB=VALUE",
        help="change one Recipe knob (repeatable), e.g. --set rl_lr=2e-3",
    )
    ap.add_argument(
        "--url",
        default=os.environ.get("ARCTIC_ONPREM_URL", ""),
        help="a running server (default: start one)",
    )
    return asyncio.run(amain(ap.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
