"""Harbor's terminus-2 through the agent proxy: one trial, its trajectory as a training row.

    python examples/harbor/run_terminus.py --harbor /path/to/harbor-venv/bin/harbor \\
        [--target http://HOST:PORT --token T --model JOB_OR_MODEL] [--max-turns 3] [--out DIR]

Harbor (0.26, in its own Python 3.12 venv: `pip install 'harbor==0.26.*'`) runs its stock
`terminus-2` agent on the task in `tasks/hello-file` with this directory's host environment
(`--env arctic_host_env:HostEnvironment`: the trial's commands run on this host, see that
module). The agent's model is `hosted_vllm/<model>` at `arctic_sdk.proxy`'s `/v1`, with
Harbor's own `session_id` (the proxy keeps one server-side session per trajectory, so the
turns are token-exact) and `collect_rollout_details` (Harbor then records each turn's token ids
too: they must equal the proxy's). The proxy forwards to `--target` (an on-prem server or a
gateway, with its token; the model a sampling job id or model name); without `--target` it
serves the fake engine's OpenAI routes in this process (random printable text: terminus-2
needs only text).

A random model does not solve the task (reward 0): the point is the plumbing. terminus-2 asks
for JSON, gets none, answers with a parser error and asks again, `--max-turns` times; each
model call is a turn through the proxy. `check_trial` then verifies what the test asserts: the
row of the trajectory (`proxy.row`) holds every turn's sampled ids verbatim (`loss_mask` 1
exactly there, the sampler's log-probs, the `weight_version` of each turn), it equals the
server's own record of the session and Harbor's `rollout_details`, and it makes a GRPO frame.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arctic_sdk.proxy import BackgroundProxy, RecordedTurn
from arctic_sdk.rollouts import FlatRollout, forward_backward_frame

HERE = Path(__file__).resolve().parent
TASK = HERE / "tasks" / "hello-file"
ENV_CLASS = "arctic_host_env:HostEnvironment"
FAKE_KEY = "sk-harbor-example"
# A random model seldom ends a reply by itself, and terminus-2 re-asks on a reply cut at
# max_tokens without counting a turn (`OutputLengthExceededError`): stop strings end the replies.
STOP = ["}", "]", " "]
MAX_TOKENS = 200


@dataclass
class Trial:
    """What one Harbor trial left: its result, the proxy's record and row of the trajectory."""

    result: dict[str, Any]  # the trial's result.json
    recorded: list[RecordedTurn]
    row: FlatRollout
    server_rows: list[FlatRollout]  # the server's own record of the session
    trial_dir: Path
    seconds: float


@contextlib.contextmanager
def fake_endpoint(max_model_len: int = 16384) -> Iterator[tuple[str, str, str]]:
    """The fake engine's OpenAI routes in a background thread: (base URL, token, model)."""
    from arctic_servers.openai.fake import FakeResolver, FakeSampler
    from arctic_servers.openai.routes import start_openai_server

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    sampler = FakeSampler("fake-tiny", max_model_len=max_model_len)
    start = start_openai_server(FakeResolver(sampler), tokens=[FAKE_KEY])
    runner, url = asyncio.run_coroutine_threadsafe(start, loop).result(30)
    try:
        yield url, FAKE_KEY, "fake-tiny"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def harbor_command(
    harbor: str,
    *,
    api_base: str,
    model: str,
    session_id: str,
    jobs_dir: Path,
    job_name: str,
    max_turns: int,
    context: int,
    task: Path = TASK,
    agent: str = "terminus-2",
    seed: int = 7,
) -> list[str]:
    """`harbor run` of one trial of `agent` on `task`, on the host environment, at `api_base`."""
    call = {"stop": STOP, "max_tokens": MAX_TOKENS, "seed": seed}
    info = {
        "max_input_tokens": context,
        "max_output_tokens": MAX_TOKENS,
        "input_cost_per_token": 0,  # hosted_vllm models must say (Harbor refuses otherwise)
        "output_cost_per_token": 0,
    }
    cmd = [harbor, "run", "-p", str(task), "-a", agent, "-e", ENV_CLASS]
    cmd += ["-o", str(jobs_dir), "--job-name", job_name, "-n", "1", "-y", "-q"]
    if agent == "oracle":
        return cmd
    cmd += ["-m", f"hosted_vllm/{model}"]
    for k, v in {
        "api_base": api_base,
        "session_id": session_id,
        "collect_rollout_details": True,
        "max_turns": max_turns,
        "suppress_max_turns_warning": True,
        "record_terminal_session": False,  # asciinema is not installed here
        "enable_summarize": False,  # a summary is a second conversation: not one row
        "proactive_summarization_threshold": 0,
        "llm_call_kwargs": call,
        "model_info": info,
    }.items():
        cmd += ["--ak", f"{k}={v if isinstance(v, str) else json.dumps(v)}"]
    return cmd


def harbor_env() -> dict[str, str]:
    """Harbor's process environment: this directory importable (the host environment), no
    network look-ups for LiteLLM's model price list."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH", "")) if p)
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    env["HOSTED_VLLM_API_KEY"] = "unused-the-proxy-holds-the-token"
    return env


def run_harbor(cmd: Sequence[str], jobs_dir: Path, job_name: str, timeout: float) -> Path:
    """Run `harbor run`; the one trial's directory (a RuntimeError with Harbor's output else)."""
    p = subprocess.run(
        list(cmd), env=harbor_env(), capture_output=True, text=True, timeout=timeout, check=False
    )
    trials = sorted(d for d in (jobs_dir / job_name).glob("*__*") if d.is_dir())
    if p.returncode != 0 or len(trials) != 1 or not (trials[0] / "result.json").is_file():
        raise RuntimeError(
            f"harbor run failed (exit {p.returncode}, trials {trials}):\n"
            f"{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
        )
    return trials[0]


def run_trial(
    harbor: str,
    target: str,
    token: str,
    model: str,
    out: Path,
    *,
    trajectory: str = "harbor-terminus-1",
    max_turns: int = 3,
    context: int = 16384,
    timeout: float = 600.0,
) -> Trial:
    """One terminus-2 trial through the proxy in front of `target` (module docstring)."""
    out.mkdir(parents=True, exist_ok=True)
    with BackgroundProxy(target, token, out=out / "turns.jsonl") as proxy:
        cmd = harbor_command(
            harbor,
            api_base=proxy.v1,
            model=model,
            session_id=trajectory,
            jobs_dir=out / "jobs",
            job_name=trajectory,
            max_turns=max_turns,
            context=context,
        )
        t0 = time.perf_counter()
        trial_dir = run_harbor(cmd, out / "jobs", trajectory, timeout)
        seconds = time.perf_counter() - t0
        result = json.loads((trial_dir / "result.json").read_text())
        recorded = proxy.recorded(trajectory)
        row = proxy.row(trajectory)
        server_rows = proxy.session_rows(trajectory)
        proxy.finish(trajectory)
    return Trial(result, recorded, row, server_rows, trial_dir, seconds)


def check_trial(t: Trial, max_turns: int) -> dict[str, Any]:
    """The claims of the module docstring, asserted; a summary of the trial."""
    res = t.result
    assert res.get("exception_info") is None, res.get("exception_info")
    agent = res["agent_result"]
    episodes = agent["metadata"]["n_episodes"]
    assert episodes == max_turns, f"terminus-2 ran {episodes} episodes, not {max_turns}"
    turns = [r.turn for r in t.recorded]
    assert len(turns) >= episodes, f"{len(turns)} turns recorded for {episodes} episodes"
    # Harbor's own record of the turns (LiteLLM's token ids and log-probs) is the proxy's
    (details,) = agent["rollout_details"]
    assert details["prompt_token_ids"] == [x.prompt_token_ids for x in turns]
    assert details["completion_token_ids"] == [x.completion_token_ids for x in turns]
    assert details["logprobs"] == [x.logprobs for x in turns]
    row = t.row
    assert not row.fell_back and row.num_turns == row.trained_turns == len(turns)
    last = turns[-1]
    assert row.input_ids == last.prompt_token_ids + last.completion_token_ids
    assert row.logprobs is not None
    for x in turns:  # each turn's sampled ids verbatim at its offset, masked 1, its log-probs
        at, n = len(x.prompt_token_ids), len(x.completion_token_ids)
        assert row.input_ids[at : at + n] == x.completion_token_ids
        assert row.loss_mask[at : at + n] == [1] * n
        assert row.logprobs[at : at + n] == x.logprobs
    assert sum(row.loss_mask) == sum(len(x.completion_token_ids) for x in turns)
    assert row.weight_versions == tuple(x.weight_version for x in turns)
    assert all(v is not None for v in row.weight_versions)
    (server,) = t.server_rows  # one segment: the conversation was never re-rendered
    assert (server.input_ids, server.loss_mask) == (row.input_ids, row.loss_mask)
    assert server.logprobs == row.logprobs and server.weight_versions == row.weight_versions
    frame = forward_backward_frame([row], [1.0], loss_fn="grpo")
    assert int(frame["context"]["loss_mask"].sum()) == sum(row.loss_mask)
    return {
        "episodes": episodes,
        "turns": len(turns),
        "row_tokens": len(row.input_ids),
        "trained_tokens": sum(row.loss_mask),
        "prompt_tokens": [len(x.prompt_token_ids) for x in turns],
        "completion_tokens": [len(x.completion_token_ids) for x in turns],
        "finish_reasons": [r.finish_reason for r in t.recorded],
        "weight_versions": list(row.weight_versions),
        "reward": (res.get("verifier_result") or {}).get("rewards"),
        "seconds": round(t.seconds, 1),
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--harbor", required=True, help="the `harbor` executable of Harbor's venv")
    ap.add_argument("--target", default="", help="the endpoint (default: the fake, in-process)")
    ap.add_argument("--token", default="", help="the endpoint's token")
    ap.add_argument("--model", default="", help="the job id or model name at the endpoint")
    ap.add_argument("--context", type=int, default=16384, help="the model's context (tokens)")
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--out", default="out/harbor")
    args = ap.parse_args(argv)
    out = Path(args.out).resolve()
    with contextlib.ExitStack() as stack:
        target, token, model = args.target, args.token, args.model
        if not target:
            target, token, model = stack.enter_context(fake_endpoint(args.context))
        trial = run_trial(
            args.harbor, target, token, model, out, max_turns=args.max_turns, context=args.context
        )
    summary = check_trial(trial, args.max_turns)
    print(json.dumps({"trial": str(trial.trial_dir), **summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
