"""An agent learns a two-turn tool task through the OpenAI endpoint: tool calls, the agent
proxy's token-exact trajectories, GRPO, weight sync. Held-out success against an lr = 0 control.

    python examples/agent_rl.py [--url http://HOST:PORT --token T] [--steps 30] [--seed 0]
                                [--out out] [--smoke]

Without `--url` it starts the on-prem server (DeepSpeed trainer, vLLM sampler) on the embedded
`tiny-4l` model. Per arm (the RL arm, then a control whose every step has learning rate 0, each
a fresh job from the same seed, so the same initial weights) it runs agent episodes through
`arctic_sdk.proxy` with the unmodified `openai` client, each episode a session of its own:

    user     "Find the code of box 7."                       (tools: lookup(key), answer(value))
    turn 1   POST /v1/chat/completions  tool_choice lookup    -> lookup({"key": k})
    tool     "The code of box k is c(k)."                      (c(k) = (3 k + 7) mod 10)
    turn 2   POST /v1/chat/completions  tool_choice answer    -> answer({"value": v})
    reward   0.5 [k is the box asked for] + 0.5 [v is the code the tool answered]
    success  k is the box asked for and v = c(k)

Both calls are forced, so vLLM's structured-output decoding keeps them valid under the tools'
schemas (an integer 0..9 each); what the model learns is which digit to write: the box number
from the user's message, the code from the tool's. Training rows come from the proxy
(`proxy.row`: both turns' sampled ids verbatim, `loss_mask` 1 on them, 0 on the prompt and the
tool output, the sampler's log-probs), group-relative advantages, `forward_backward` (`grpo`)
with `step`, then `sync_weights`. Every `eval_every` steps the held-out prompts (other
phrasings than the training ones, every box) run greedily; their success rate is the curve.
It writes `OUT/agent_rl.json` and, with matplotlib, `OUT/agent_rl.png`.
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

from arctic_sdk import AsyncClient
from arctic_sdk.proxy import BackgroundProxy
from arctic_sdk.rollouts import FlatRollout, forward_backward_frame

KEY = "sk-agent-rl-example"
DIGIT = {"type": "integer", "minimum": 0, "maximum": 9}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "The code of a box.",
            "parameters": {"type": "object", "properties": {"key": DIGIT}, "required": ["key"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "answer",
            "description": "Give the final answer.",
            "parameters": {
                "type": "object",
                "properties": {"value": DIGIT},
                "required": ["value"],
            },
        },
    },
]
TRAIN = ("Find the code of box {k}.", "Box {k}: what is its code?", "Look up box {k}.")
HELD_OUT = ("Which code does box {k} hold?", "Tell me the code of box number {k}.")


def code_of(key: int) -> int:
    return (3 * key + 7) % 10


def forced(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}


@dataclass
class Recipe:
    """Every knob of the run (the defaults are examples/README.md's run)."""

    model: str = "tiny-4l"
    seed: int = 0
    steps: int = 40
    prompts: int = 8  # tasks per step
    group: int = 8  # episodes per task
    lr: float = 2e-3
    temperature: float = 1.0
    eval_every: int = 5
    max_tokens: int = 96  # per turn (a random model may spell the call one character a token)

    @staticmethod
    def smoke() -> Recipe:
        return Recipe(steps=2, prompts=2, group=8, eval_every=2)


@dataclass
class Arm:
    label: str
    lr: float
    success: list[float] = field(default_factory=list)  # held-out, at each evaluation
    probe: list[float] = field(default_factory=list)  # held-out sampled log-prob sum, per eval
    eval_steps: list[int] = field(default_factory=list)
    reward: list[float] = field(default_factory=list)  # mean training reward, per step
    grad_norm: list[float] = field(default_factory=list)
    seconds: float = 0.0


class Agent:
    """One episode = one trajectory of the proxy (its own session)."""

    def __init__(self, proxy: BackgroundProxy, model: str, r: Recipe) -> None:
        self.proxy, self.model, self.r = proxy, model, r
        self.count = 0

    async def episode(
        self, prompt: str, key: int, temperature: float, seed: int
    ) -> tuple[str, float, bool]:
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
            k = _arg(one, "key")
            if k is None:
                return traj, 0.0, False
            msg = one.choices[0].message
            msgs += [
                msg.model_dump(exclude_none=True),
                {
                    "role": "tool",
                    "tool_call_id": msg.tool_calls[0].id if msg.tool_calls else "",
                    "content": f"The code of box {k} is {code_of(k)}.",
                },
            ]
            two = await oai.chat.completions.create(
                messages=msgs, tool_choice=forced("answer"), temperature=temperature,
                seed=seed + 1, **common,
            )  # fmt: skip
            v = _arg(two, "value")
        finally:
            await oai.close()
        reward = 0.5 * (k == key) + 0.5 * (v == code_of(k))
        return traj, reward, k == key and v == code_of(key)


def _arg(resp: Any, name: str) -> int | None:
    calls = resp.choices[0].message.tool_calls or []
    try:
        value = json.loads(calls[0].function.arguments)[name]
    except (IndexError, ValueError, KeyError, TypeError):
        return None
    return int(value) if isinstance(value, int) else None


def job_body(r: Recipe, lr: float) -> dict[str, Any]:
    return {
        "sub_job_configs": [
            {
                "job_type": "training",
                "model_name": r.model,
                "seed": r.seed,
                "training_config": {
                    "zero_stage": 1,
                    "gradient_clipping": 1.0,
                    "optimizer": {"name": "adamw", "lr": r.lr, "weight_decay": 0.0},
                },
            },
            {"job_type": "sampling", "model_name": r.model, "seed": r.seed},
        ],
        "experiment_name": "agent-rl",
        "labels": {"example": "agent_rl", "seed": str(r.seed), "lr": str(lr)},
    }


async def evaluate(agent: Agent, step: int) -> tuple[float, float]:
    """Greedy held-out episodes: (success rate, sum of the sampled log-probs: a probe that moves
    exactly when the served weights do)."""
    tasks = [(t.format(k=k), k) for t in HELD_OUT for k in range(10)]
    done = await asyncio.gather(
        *(agent.episode(p, k, 0.0, 7919 * step + i) for i, (p, k) in enumerate(tasks))
    )
    probe = 0.0
    for traj, _, _ in done:
        row = agent.proxy.row(traj)
        probe += float(sum(row.logprobs or []))
    await asyncio.gather(*(asyncio.to_thread(agent.proxy.finish, t) for t, _, _ in done))
    return float(np.mean([ok for _, _, ok in done])), probe


async def run_arm(url: str, token: str, r: Recipe, arm: Arm) -> Arm:
    rng = np.random.default_rng(r.seed)
    t0 = time.perf_counter()
    async with AsyncClient(url, token=token, progress=False) as client:
        await client.create_job(job_body(r, arm.lr))
        try:
            await client.wait_until_running(timeout=900)
            with BackgroundProxy(url, token) as proxy:
                agent = Agent(proxy, str(client.job_id), r)
                for step in range(r.steps + 1):
                    if step % r.eval_every == 0 or step == r.steps:
                        await client.sync_weights()
                        ok, probe = await evaluate(agent, step)
                        arm.success.append(ok)
                        arm.probe.append(probe)
                        arm.eval_steps.append(step)
                        print(
                            f"[{arm.label}] step {step:3d}  held-out success {ok:.3f}", flush=True
                        )
                    if step == r.steps:
                        break
                    await rl_step(client, agent, r, arm, rng, step)
        finally:
            with contextlib.suppress(Exception):
                await client.cancel_job()
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
    rewards = np.array([rw for _, rw, _ in done], np.float32).reshape(r.prompts, r.group)
    adv = (rewards - rewards.mean(axis=1, keepdims=True)).reshape(-1)
    frame = forward_backward_frame(rows, adv, loss_fn="grpo", config={"eps_clip": 0.2})
    fb = client.submit_forward_backward(frame)
    st = client.submit_step(learning_rate=arm.lr)
    await fb
    res = await st
    await client.sync_weights()
    arm.reward.append(float(rewards.mean()))
    arm.grad_norm.append(float(res["metrics"].get("grad_norm") or 0.0))
    print(
        f"[{arm.label}] step {step:3d}  reward {rewards.mean():.3f}  "
        f"grad_norm {arm.grad_norm[-1]:.4f}  fell back {sum(x.fell_back for x in rows)}",
        flush=True,
    )


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def plot(arms: Sequence[Arm], out: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for a in arms:
        ax.plot(a.eval_steps, a.success, marker="o", label=a.label)
    ax.set_xlabel("RL step")
    ax.set_ylabel("held-out success")
    ax.set_ylim(-0.02, 1.02)
    ax.legend()
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
    arms = [Arm("rl", r.lr), Arm("control lr=0", 0.0)]
    try:
        for arm in arms:
            await run_arm(url, token, r, arm)
    finally:
        if server is not None:
            server.stop()
    (out / "agent_rl.json").write_text(
        json.dumps({"recipe": asdict(r), "arms": [asdict(a) for a in arms]}, indent=1)
    )
    plot(arms, out)
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
        "--smoke", action="store_true", help="CI sizes: 2 steps of 2 tasks x 8 episodes"
    )
    return asyncio.run(amain(ap.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
