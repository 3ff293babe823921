"""An agent learns a two-turn tool task through the OpenAI endpoint: tool calls, the agent
proxy's token-exact trajectories, SFT on demonstrations, then GRPO with weight syncs. Held-out
success of the RL arm against an lr = 0 control from the same SFT checkpoint.

    python examples/agent_rl.py [--url http://HOST:PORT --token T] [--steps 40] [--seed 0]
                                [--out out] [--smoke]

Without `--url` it starts the on-prem server (DeepSpeed trainer, vLLM sampler) on the embedded
`tiny-4l` model. The task (`agent_task.py`): the user asks for the code of a box; the agent must
call `lookup(key)` with that box, then `answer(value)` with the code the tool returned. Both calls
are forced (`tool_choice` names the function), so vLLM's structured-output decoding keeps them
valid under the tools' schemas (an integer 0..9 each); what the model learns is which digit to
write: the box from the user's message, the code from the tool's.

One job, three phases:

1. **SFT** on demonstrations (`agent_task.demonstrations`: every training phrasing for every box,
   laid out as a session lays out sampled turns, each call spelled as forced decoding spells it):
   `forward_backward` (`cross_entropy` on the two calls) with `step`, until the held-out success
   reaches `Recipe.sft_target` (or `Recipe.sft_max_steps`), leaving room for RL; then
   `save_checkpoint("sft")`.
2. **RL arm** from that checkpoint (`load_checkpoint` + `sync_weights`): per step, `prompts`
   tasks x `group` episodes at `temperature` through `arctic_sdk.proxy` with the unmodified
   `openai` client, each episode a session of its own; rows from the proxy (`proxy.row`: both
   turns' sampled ids verbatim, `loss_mask` 1 on them, the sampler's log-probs), group-relative
   advantages per turn (`turn_advantages`), `forward_backward` (`grpo`) with `step`, then
   `sync_weights`.
3. **Control**: the same loop from the same checkpoint with learning rate 0 on every step.

Every `eval_every` steps the held-out prompts (other phrasings than the training ones, every box)
run greedily; their success rate is the curve. It writes `OUT/agent_rl.json` and, with
matplotlib, `OUT/agent_rl.png`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from agent_task import (
    HELD_OUT,
    TOOLS,
    TRAIN,
    call_argument,
    code_of,
    demonstrations,
    forced,
    tool_answer,
)

from arctic_sdk import AsyncClient
from arctic_sdk.proxy import BackgroundProxy
from arctic_sdk.rollouts import FlatRollout, forward_backward_frame, pad_rollouts

KEY = "sk-agent-rl-example"


@dataclass
class Recipe:
    """Every knob of the run (the defaults are examples/README.md's run)."""

    model: str = "tiny-4l"
    seed: int = 0
    sft_lr: float = 2e-3
    sft_batch: int = 32  # demonstrations per SFT step (drawn from the 30 with replacement)
    sft_max_steps: int = 400
    sft_target: float = 0.3  # stop SFT once the held-out success is at least this
    sft_eval_every: int = 5  # the rise is abrupt (0.275 -> 0.825 in 10 steps, seed 0)
    steps: int = 40  # RL steps per arm
    prompts: int = 8  # tasks per step
    group: int = 8  # episodes per task
    lr: float = 2e-3
    temperature: float = 1.0
    eval_every: int = 5
    max_tokens: int = 96  # per turn (a random model may spell the call one character a token)

    @staticmethod
    def smoke() -> Recipe:
        return Recipe(
            sft_max_steps=2, sft_target=2.0, sft_eval_every=2, steps=2, prompts=2, group=8,
            eval_every=2,
        )  # fmt: skip


@dataclass
class Sft:
    success: list[float] = field(default_factory=list)  # held-out, at each evaluation
    probe: list[float] = field(default_factory=list)  # held-out sampled log-prob sum, per eval
    eval_steps: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)  # per step
    seconds: float = 0.0


@dataclass
class Arm:
    label: str
    lr: float
    success: list[float] = field(default_factory=list)  # held-out, at each evaluation
    probe: list[float] = field(default_factory=list)  # held-out sampled log-prob sum, per eval
    eval_steps: list[int] = field(default_factory=list)
    reward: list[float] = field(default_factory=list)  # mean training reward, per step
    grad_norm: list[float] = field(default_factory=list)
    # the oldest weight version that sampled each step's episodes (on-policy: a new one a step)
    sampled_version: list[int] = field(default_factory=list)
    seconds: float = 0.0


class Agent:
    """One episode = one trajectory of the proxy (its own session)."""

    def __init__(self, proxy: BackgroundProxy, model: str, r: Recipe) -> None:
        self.proxy, self.model, self.r = proxy, model, r
        self.count = 0

    async def episode(
        self, prompt: str, key: int, temperature: float, seed: int
    ) -> tuple[str, tuple[float, float], bool]:
        """(trajectory, each turn's reward, success): turn 1 earns 1 for the box asked for,
        turn 2 earns 1 for the code the tool answered."""
        import openai

        self.count += 1
        traj = f"{self.model}-ep{self.count}"
        oai = openai.AsyncOpenAI(base_url=self.proxy.url_for(traj), api_key="x", max_retries=2)
        try:
            msgs: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
            common = {"model": self.model, "tools": TOOLS, "max_tokens": self.r.max_tokens}
            one = await oai.chat.completions.create(
                messages=msgs, tool_choice=forced("lookup"), temperature=temperature, seed=seed,
                **common,
            )  # fmt: skip
            k = call_argument(one, "key")
            if k is None:
                return traj, (0.0, 0.0), False
            msg = one.choices[0].message
            msgs += [
                msg.model_dump(exclude_none=True),
                {
                    "role": "tool",
                    "tool_call_id": msg.tool_calls[0].id if msg.tool_calls else "",
                    "content": tool_answer(k),
                },
            ]
            two = await oai.chat.completions.create(
                messages=msgs, tool_choice=forced("answer"), temperature=temperature,
                seed=seed + 1, **common,
            )  # fmt: skip
            v = call_argument(two, "value")
        finally:
            await oai.close()
        return traj, (float(k == key), float(v == code_of(k))), k == key and v == code_of(key)

    def calls(self, traj: str) -> list[list[int]]:
        """The sampled ids of each finished call of `traj` (each ends with the stop token)."""
        return [
            t.turn.completion_token_ids
            for t in self.proxy.recorded(traj)
            if t.finish_reason in ("stop", "tool_calls") and t.turn.completion_token_ids
        ]


def job_body(r: Recipe) -> dict[str, Any]:
    return {
        "sub_job_configs": [
            {
                "job_type": "training",
                "model_name": r.model,
                "seed": r.seed,
                "training_config": {
                    "zero_stage": 1,
                    "gradient_clipping": 1.0,
                    "optimizer": {"name": "adamw", "lr": r.sft_lr, "weight_decay": 0.0},
                },
            },
            {"job_type": "sampling", "model_name": r.model, "seed": r.seed},
        ],
        "experiment_name": "agent-rl",
        "labels": {"example": "agent_rl", "seed": str(r.seed)},
    }


async def evaluate(client: Any, agent: Agent, step: int) -> tuple[float, float, list[list[int]]]:
    """Sync, then greedy held-out episodes: (success rate, sum of the sampled log-probs: a probe
    that moves exactly when the served weights do, the sampled calls)."""
    await client.sync_weights()
    tasks = [(t.format(k=k), k) for t in HELD_OUT for k in range(10)]
    done = await asyncio.gather(
        *(agent.episode(p, k, 0.0, 7919 * step + i) for i, (p, k) in enumerate(tasks))
    )
    probe, calls = 0.0, []
    for traj, _, _ in done:
        probe += float(sum(agent.proxy.row(traj).logprobs or []))
        calls += agent.calls(traj)
    await asyncio.gather(*(asyncio.to_thread(agent.proxy.finish, t) for t, _, _ in done))
    return float(np.mean([ok for _, _, ok in done])), probe, calls


def sft_frame(rows: Sequence[FlatRollout]) -> dict[str, Any]:
    """Cross-entropy on the demonstrations' calls and stops; prompts and tool output masked."""
    padded = pad_rollouts(rows, pad_token_id=0)
    return {
        "kwargs": {"input_ids": padded.input_ids, "attention_mask": padded.attention_mask},
        "context": {"loss_mask": padded.loss_mask},
        "processing": {"loss_fn": "cross_entropy", "config": {"loss_agg_mode": "token-mean"}},
    }


async def run_sft(client: Any, agent: Agent, url: str, token: str, r: Recipe) -> Sft:
    sft, t0 = Sft(), time.perf_counter()
    rng = np.random.default_rng(r.seed)
    ok, probe, calls = await evaluate(client, agent, 0)
    stops = {c[-1] for c in calls}
    if len(stops) != 1:
        raise RuntimeError(f"expected one stop token in the sampled calls, saw {sorted(stops)}")
    stop = stops.pop()
    demos = await demonstrations(url, token, str(client.job_id), stop, calls[0][:-1])
    sft.eval_steps.append(0)
    sft.success.append(ok)
    sft.probe.append(probe)
    print(f"[sft] step   0  held-out success {ok:.3f}  ({len(demos)} demonstrations)", flush=True)
    for step in range(1, r.sft_max_steps + 1):
        batch = [demos[int(i)] for i in rng.integers(0, len(demos), r.sft_batch)]
        fb = client.submit_forward_backward(sft_frame(batch))
        st = client.submit_step(learning_rate=r.sft_lr)
        sft.loss.append(float((await fb)["loss"]))
        await st
        if step % r.sft_eval_every == 0 or step == r.sft_max_steps:
            ok, probe, _ = await evaluate(client, agent, step)
            sft.eval_steps.append(step)
            sft.success.append(ok)
            sft.probe.append(probe)
            print(
                f"[sft] step {step:3d}  loss {sft.loss[-1]:.4f}  held-out success {ok:.3f}",
                flush=True,
            )
            if ok >= r.sft_target:
                break
    sft.seconds = time.perf_counter() - t0
    return sft


async def run_arm(client: Any, agent: Agent, r: Recipe, arm: Arm) -> Arm:
    rng = np.random.default_rng(r.seed + 1)  # both arms draw the same tasks
    t0 = time.perf_counter()
    await client.load_checkpoint(checkpoint_id="sft")
    for step in range(r.steps + 1):
        if step % r.eval_every == 0 or step == r.steps:
            ok, probe, _ = await evaluate(client, agent, step)
            arm.success.append(ok)
            arm.probe.append(probe)
            arm.eval_steps.append(step)
            print(f"[{arm.label}] step {step:3d}  held-out success {ok:.3f}", flush=True)
        if step == r.steps:
            break
        await rl_step(client, agent, r, arm, rng, step)
    arm.seconds = time.perf_counter() - t0
    return arm


async def rl_step(
    client: Any, agent: Agent, r: Recipe, arm: Arm, rng: np.random.Generator, step: int
) -> None:
    keys = rng.integers(0, 10, r.prompts)
    temps = rng.integers(0, len(TRAIN), r.prompts)
    jobs = [
        agent.episode(TRAIN[int(t)].format(k=int(k)), int(k), r.temperature, 1000 * step + 10 * g)
        for k, t in zip(keys, temps, strict=True)
        for g in range(r.group)
    ]
    done = await asyncio.gather(*jobs)
    rows: list[FlatRollout] = [agent.proxy.row(traj) for traj, _, _ in done]
    await asyncio.gather(*(asyncio.to_thread(agent.proxy.finish, t) for t, _, _ in done))
    turn_rewards = np.array([rw for _, rw, _ in done], np.float32).reshape(r.prompts, r.group, 2)
    rewards = turn_rewards.mean(axis=2)  # the episode's reward: half a point a turn
    # group-relative per turn: each turn's tokens are credited with that turn's reward only
    adv = 0.5 * (turn_rewards - turn_rewards.mean(axis=1, keepdims=True)).reshape(-1, 2)
    frame = forward_backward_frame(
        rows, turn_advantages(rows, adv), loss_fn="grpo", config={"eps_clip": 0.2}
    )
    fb = client.submit_forward_backward(frame)
    st = client.submit_step(learning_rate=arm.lr)
    await fb
    res = await st
    await client.sync_weights()  # the next step samples from the weights this one made
    arm.reward.append(float(rewards.mean()))
    arm.sampled_version.append(min(v or 0 for x in rows for v in x.weight_versions))
    arm.grad_norm.append(float(res["metrics"].get("grad_norm") or 0.0))
    print(
        f"[{arm.label}] step {step:3d}  reward {rewards.mean():.3f}  "
        f"grad_norm {arm.grad_norm[-1]:.4f}  fell back {sum(x.fell_back for x in rows)}",
        flush=True,
    )


def turn_advantages(rows: Sequence[FlatRollout], adv: np.ndarray) -> np.ndarray:
    """`[B, S]` advantages (S: the longest row): each run of trained tokens (one sampled turn)
    gets its turn's advantage, counted from the last turn (a row that fell back holds only it)."""
    out = np.zeros((len(rows), max(len(x.input_ids) for x in rows)), np.float32)
    for i, row in enumerate(rows):
        mask = np.asarray(row.loss_mask) != 0
        edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.astype(np.int8), [0]))))
        spans = list(zip(edges[::2], edges[1::2], strict=True))
        for (a, b), value in zip(reversed(spans), reversed(adv[i]), strict=False):
            out[i, a:b] = value
    return out


async def run(url: str, token: str, r: Recipe) -> tuple[Sft, list[Arm]]:
    arms = [Arm("rl", r.lr), Arm("control lr=0", 0.0)]
    async with AsyncClient(url, token=token, progress=False) as client:
        await client.create_job(job_body(r))
        try:
            await client.wait_until_running(timeout=900)
            with BackgroundProxy(url, token) as proxy:
                agent = Agent(proxy, str(client.job_id), r)
                sft = await run_sft(client, agent, url, token, r)
                await client.save_checkpoint(checkpoint_id="sft")
                for arm in arms:
                    await run_arm(client, agent, r, arm)
        finally:
            with contextlib.suppress(Exception):
                await client.cancel_job()
    return sft, arms


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def plot(sft: Sft, arms: Sequence[Arm], out: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5), sharey=True)
    left.plot(sft.eval_steps, sft.success, marker="o", color="gray")
    left.set_xlabel("SFT step")
    left.set_ylabel("held-out success")
    left.set_ylim(-0.02, 1.02)
    for a in arms:
        right.plot(a.eval_steps, a.success, marker="o", label=a.label)
    right.set_xlabel("RL step (from the SFT checkpoint)")
    right.legend()
    fig.tight_layout()
    fig.savefig(out / "agent_rl.png", dpi=120)


async def amain(args: argparse.Namespace) -> int:
    r = Recipe.smoke() if args.smoke else Recipe()
    r.seed = args.seed
    if args.steps:
        r.steps = args.steps
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    server = None
    url, token = args.url, args.token
    if not url:
        from arctic_sdk.compat import launch_onprem

        token = KEY
        server = await asyncio.to_thread(launch_onprem, "127.0.0.1", free_port(), tokens=(KEY,))
        url = server.base_url
    try:
        sft, arms = await run(url, token, r)
    finally:
        if server is not None:
            server.stop()
    (out / "agent_rl.json").write_text(
        json.dumps(
            {"recipe": asdict(r), "sft": asdict(sft), "arms": [asdict(a) for a in arms]}, indent=1
        )
    )
    plot(sft, arms, out)
    print(f"sft: held-out success {sft.success[0]:.3f} -> {sft.success[-1]:.3f} "
          f"({sft.eval_steps[-1]} steps, {sft.seconds:.0f} s)")  # fmt: skip
    for a in arms:
        print(f"{a.label}: held-out success {a.success[0]:.3f} -> {a.success[-1]:.3f} "
              f"({a.seconds:.0f} s)")  # fmt: skip
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--url", default="", help="a running on-prem server (default: start one)")
    ap.add_argument("--token", default="", help="its token")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=0, help="RL steps per arm (default: recipe's)")
    ap.add_argument("--out", default="out")
    ap.add_argument(
        "--smoke", action="store_true", help="CI sizes: 2 SFT steps, 2 RL steps of 2 tasks x 8"
    )
    return asyncio.run(amain(ap.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
