"""The sampling worker's continuous batch over its pipe, without vLLM: the worker's serve loop
(`engines/worker/worker.py`) with a toy engine in the shape of `engines/vllm/sampling.py` (one
token per request per step), and the server's side (`engines/worker/procs.py` `WorkerHandle`)
reading it.

What it proves: whole generates and streams are submitted as they arrive and share engine steps;
any other command (a weight load) waits until the batch is empty and the batched commands sent
after it wait behind it (pause, swap, resume), so every result ran on one version of the weights;
leaving a stream or cancelling a call removes its requests from the engine. The same loop drives
the vLLM engine (`tests/onprem/test_concurrency.py` and `tests/openai/test_onprem.py` run that).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from multiprocessing import Pipe
from typing import Any

import pytest

from arctic_servers.engines.errors import WorkerError
from arctic_servers.engines.worker.engine_base import EngineBase
from arctic_servers.engines.worker.messages import STREAM_CMD
from arctic_servers.engines.worker.procs import WorkerHandle
from arctic_servers.engines.worker.worker import serve
from arctic_servers.rules.errors import ProtocolError

STEP_S = 0.002


@dataclass
class Req:
    max: int
    stream: bool
    version: int
    tokens: list[int] = field(default_factory=list)  # each token: the weight version made it


class ToyEngine(EngineBase):
    """One token per request per step; a token is the weight version of the step that made it
    (so a result that spans a weight swap shows two values). `load_weights` records how many
    requests were in the engine when it ran (the serve loop must make that 0)."""

    def __init__(self) -> None:
        self.reqs: dict[int, Req] = {}
        self.version = 0
        self.steps = 0
        self.peak = 0
        self.aborted: list[tuple[int, int]] = []  # (msg id, tokens produced)
        self.loads_saw: list[int] = []
        self.closed = False

    def submits(self, cmd: str) -> bool:
        return cmd in ("generate", STREAM_CMD)

    def submit(self, msg_id: int, cmd: str, args: Mapping[str, Any]) -> dict[str, Any] | None:
        prompt = args.get("prompt", args.get("prompts"))
        if not prompt:
            raise WorkerError("invalid_argument", "field prompt: empty", field="prompt")
        n = int(args["sampling_params"]["max_tokens"])
        self.reqs[msg_id] = Req(n, cmd == STREAM_CMD, self.version)
        return None

    def busy(self) -> bool:
        return bool(self.reqs)

    def abort(self, msg_id: int) -> list[dict[str, Any]]:
        r = self.reqs.pop(msg_id, None)
        if r is None:
            return []
        self.aborted.append((msg_id, len(r.tokens)))
        if not r.stream:  # as engine_batch.py: a whole generate ends cancelled
            err = {"code": "request_cancelled", "message": "aborted", "details": {}}
            return [{"id": msg_id, "ok": False, "error": err}]
        return [{"id": msg_id, "ok": True, "result": {"finished": True, "finish_reason": "abort"}}]

    def pump(self, send: Callable[[dict[str, Any]], None]) -> None:
        time.sleep(STEP_S)
        self.steps += 1
        self.peak = max(self.peak, len(self.reqs))
        for mid, r in list(self.reqs.items()):
            r.tokens.append(self.version)
            part = {"token_ids": r.tokens[-1:], "at": time.time()}
            done = len(r.tokens) >= r.max
            if done:
                del self.reqs[mid]
            if r.stream:
                msg = {"ok": True, "result": {**part, "finished": True}} if done else None
                send({"id": mid, **(msg or {"partial": part})})
            elif done:
                send({"id": mid, "ok": True,
                      "result": {"tokens": r.tokens, "weight_version": r.version}})  # fmt: skip

    def commands(self) -> dict[str, Any]:
        return {"load_weights": self.op_load_weights, "echo": self.op_echo}

    def op_load_weights(self, weight_version: int) -> dict[str, Any]:
        self.loads_saw.append(len(self.reqs))
        self.version = weight_version
        return {"loaded": weight_version}

    def op_echo(self, n: int) -> dict[str, Any]:
        return {"echo": n}

    def close(self) -> None:
        self.closed = True


@pytest.fixture
async def worker() -> AsyncIterator[tuple[WorkerHandle, ToyEngine]]:
    parent, child = Pipe()
    engine = ToyEngine()
    loop_thread = threading.Thread(target=serve, args=(child, engine), daemon=True)
    loop_thread.start()
    h = WorkerHandle("sampling", "vllm", python="python", threads=1)
    h.sub_job_id = "s-toy"
    h._loop = asyncio.get_running_loop()
    h._conn = parent
    threading.Thread(target=h._read_replies, daemon=True).start()
    yield h, engine
    await h.call("shutdown")
    loop_thread.join(5)
    assert engine.closed and not loop_thread.is_alive()
    parent.close()


async def _collect(h: WorkerHandle, max_tokens: int) -> list[dict[str, Any]]:
    sp = {"max_tokens": max_tokens}
    return [m async for m in h.stream(STREAM_CMD, prompt=[1, 2], sampling_params=sp)]


async def _generate(h: WorkerHandle, max_tokens: int, delay: float = 0.0) -> Any:
    await asyncio.sleep(delay)
    return await h.call("generate", prompts=[[1]], sampling_params={"max_tokens": max_tokens})


def _tokens(msgs: list[dict[str, Any]]) -> list[int]:
    return [t for m in msgs for t in m["token_ids"]]


async def test_stream_yields_as_the_engine_steps(worker: tuple[WorkerHandle, ToyEngine]) -> None:
    """Every step's token arrives, in order; what piled up while the consumer was busy comes
    as one item (`merge_stream`), so a slow consumer gets fewer, larger items."""
    h, _ = worker
    msgs = [m async for m in h.stream(STREAM_CMD, prompt=[1], sampling_params={"max_tokens": 40})]
    assert _tokens(msgs) == [0] * 40 and len(msgs) >= 2
    assert msgs[-1]["finished"] and not any(m.get("finished") for m in msgs[:-1])
    assert [m["at"] for m in msgs] == sorted(m["at"] for m in msgs)
    slow = []
    async for m in h.stream(STREAM_CMD, prompt=[1], sampling_params={"max_tokens": 40}):
        slow.append(m)
        await asyncio.sleep(20 * STEP_S)  # a consumer slower than the engine
    assert _tokens(slow) == [0] * 40 and len(slow) < 40 and slow[-1]["finished"]


def test_merge_stream_keeps_every_token_and_the_last_fields() -> None:
    from arctic_servers.engines.worker.messages import merge_stream

    a = {"token_ids": [1], "text": "a", "logprobs": [-1.0], "at": 1.0, "weight_version": 3}
    b = {"token_ids": [2, 3], "text": "bc", "logprobs": [-2.0, -3.0], "at": 2.0}
    end = {"token_ids": [4], "text": "d", "logprobs": [-4.0], "at": 3.0, "finished": True,
           "finish_reason": "length"}  # fmt: skip
    got = merge_stream([a, b, end])
    assert got["token_ids"] == [1, 2, 3, 4] and got["text"] == "abcd"
    assert got["logprobs"] == [-1.0, -2.0, -3.0, -4.0] and got["at"] == 3.0
    assert got["finished"] and got["finish_reason"] == "length"
    assert merge_stream([{**a, "logprobs": None}, b])["logprobs"] is None
    assert merge_stream([a]) is a


async def test_generates_and_streams_share_engine_steps(
    worker: tuple[WorkerHandle, ToyEngine],
) -> None:
    """8 whole generates and 2 streams sent at once: one batch, not one request after another."""
    h, engine = worker
    n = 40
    out = await asyncio.gather(*(_generate(h, n) for _ in range(8)), _collect(h, n), _collect(h, n))
    assert all(len(r["tokens"]) == n for r in out[:8]) and all(
        len(_tokens(s)) == n for s in out[8:]
    )
    assert engine.peak == 10  # all ten were in the engine at once
    assert engine.steps < 2 * n  # one after another would take 10 * n steps


async def test_a_weight_load_waits_for_the_batch_and_pauses_later_generates(
    worker: tuple[WorkerHandle, ToyEngine],
) -> None:
    """pause -> swap -> resume: the load runs with no request in the engine; the generates sent
    before it report the old version, those sent after it the new one, none has two."""
    h, engine = worker
    before = [asyncio.create_task(_generate(h, 30)) for _ in range(4)]
    await asyncio.sleep(0.01)
    load = asyncio.create_task(h.call("load_weights", weight_version=1))
    await asyncio.sleep(0.001)
    after = [asyncio.create_task(_generate(h, 10)) for _ in range(4)]
    old, new = await asyncio.gather(*before), await asyncio.gather(*after)
    assert await load == {"loaded": 1}
    assert engine.loads_saw == [0]
    for results, version in ((old, 0), (new, 1)):
        for r in results:
            assert r["weight_version"] == version and set(r["tokens"]) == {version}


async def test_other_commands_run_alone_in_order(worker: tuple[WorkerHandle, ToyEngine]) -> None:
    h, _ = worker
    gen = asyncio.create_task(_generate(h, 20))
    await asyncio.sleep(0.005)
    echoes = await asyncio.gather(*(h.call("echo", n=i) for i in range(3)))
    assert echoes == [{"echo": 0}, {"echo": 1}, {"echo": 2}]
    assert gen.done()  # the echoes waited for the generate in the engine


async def test_leaving_a_stream_aborts_it(worker: tuple[WorkerHandle, ToyEngine]) -> None:
    h, engine = worker
    got = 0
    stream = h.stream(STREAM_CMD, prompt=[1], sampling_params={"max_tokens": 10**6})
    async for _ in stream:
        got += 1
        if got == 3:
            break
    await stream.aclose()  # what a cancelled consumer does
    await _until(lambda: bool(engine.aborted))
    ((_, produced),) = engine.aborted
    assert produced < 1000 and not engine.reqs
    assert (await _generate(h, 1))["tokens"] == [0]  # the worker serves on


async def test_cancelling_a_whole_generate_aborts_it(
    worker: tuple[WorkerHandle, ToyEngine],
) -> None:
    """A generate whose caller went away (HTTP client gone, request cancelled) stops costing
    engine steps."""
    h, engine = worker
    task = asyncio.create_task(_generate(h, 10**6))
    await _until(lambda: engine.steps > 3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await _until(lambda: bool(engine.aborted))
    assert not engine.reqs and not h._pending
    assert (await _generate(h, 2))["tokens"] == [0, 0]


async def test_submit_error(worker: tuple[WorkerHandle, ToyEngine]) -> None:
    h, _ = worker
    with pytest.raises(Exception, match="field prompt: empty"):
        async for _ in h.stream(STREAM_CMD, prompt=[], sampling_params={}):
            pass
    with pytest.raises(Exception, match="field prompt: empty"):
        await h.call("generate", prompts=[], sampling_params={"max_tokens": 1})


async def _until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out waiting for the worker"
        await asyncio.sleep(0.005)


def test_every_engine_build_uses_this_interpreters_op_cache(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On-prem and gateway workers alike build their engine here: DeepSpeed's JIT ops load from
    the per-interpreter cache (`torch_extensions_dir`, prebuilt by tools/install_engines.sh), not
    torch's shared default, which two environments rebuild for each other (4 min measured on a
    loaded machine for a gateway trainer's start)."""
    import os

    from arctic_servers.engines.registry import build_engine
    from arctic_servers.engines.worker.process_env import torch_extensions_dir

    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    with pytest.raises(WorkerError):
        build_engine("training", {"engine": "no-such-engine"})
    assert os.environ["TORCH_EXTENSIONS_DIR"] == torch_extensions_dir()


async def test_an_unreadable_reply_fails_every_call_in_flight() -> None:
    """A reply that cannot be unpickled is a lost answer: the on-prem client fails the calls in
    flight with the reason (they would wait forever otherwise) and reads no further."""
    parent, child = Pipe()
    h = WorkerHandle("sampling", "vllm", python="python", threads=1)
    h.sub_job_id = "s-garbled"
    h._loop = asyncio.get_running_loop()
    h._conn = parent
    reader = threading.Thread(target=h._read_replies, daemon=True)
    reader.start()
    task = asyncio.create_task(h.call("echo", n=1))
    request = await asyncio.to_thread(child.recv)
    assert request["cmd"] == "echo"
    child.send_bytes(b"not a pickle")
    with pytest.raises(ProtocolError) as err:
        await asyncio.wait_for(task, 10)
    assert err.value.code == "sub_job_failed" and "unreadable reply" in str(err.value)
    reader.join(5)
    assert not reader.is_alive()
    child.close()
    parent.close()
