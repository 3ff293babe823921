"""The sampling worker's streaming command over its pipe, without vLLM: the worker's serve loop
(`onprem/worker.py`) with a toy engine that makes one token per step, and the server's side
(`onprem/procs.py` `WorkerHandle.stream`) reading it as an async iterator.

The same loop drives the vLLM engine (`onprem/sampling.py`); `test_onprem.py` runs that one.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from multiprocessing import Pipe
from typing import Any

import pytest

from arctic_servers.onprem.procs import WorkerHandle
from arctic_servers.onprem.worker import ABORT_CMD, STREAM_CMD, WorkerError, serve

STEP_S = 0.002


class ToyEngine:
    """One token per stream per step (token = step count); `op_generate` notes whether streams
    were running when it ran (the serve loop must defer it until they end)."""

    def __init__(self) -> None:
        self.streams: dict[int, dict[str, Any]] = {}
        self.aborted: list[tuple[int, int]] = []  # (msg id, tokens produced)
        self.generate_saw_streams: list[int] = []
        self.closed = False

    def streaming(self) -> bool:
        return bool(self.streams)

    def stream_start(
        self, msg_id: int, prompt: Sequence[int], sampling_params: Mapping[str, Any]
    ) -> None:
        if not prompt:
            raise WorkerError("invalid_argument", "field prompt: empty", field="prompt")
        self.streams[msg_id] = {"max": int(sampling_params["max_tokens"]), "n": 0}

    def stream_abort(self, msg_id: int) -> list[dict[str, Any]]:
        st = self.streams.pop(msg_id, None)
        if st is None:
            return []
        self.aborted.append((msg_id, st["n"]))
        return [{"id": msg_id, "ok": True, "result": {"finished": True, "finish_reason": "abort"}}]

    def pump(self, send: Callable[[dict[str, Any]], None]) -> None:
        time.sleep(STEP_S)
        for mid, st in list(self.streams.items()):
            st["n"] += 1
            part = {"token_ids": [st["n"]], "at": time.time()}
            if st["n"] >= st["max"]:
                del self.streams[mid]
                send({"id": mid, "ok": True, "result": {**part, "finished": True}})
            else:
                send({"id": mid, "partial": part})

    def op_generate(self, n: int) -> dict[str, Any]:
        self.generate_saw_streams.append(len(self.streams))
        return {"tokens": list(range(n))}

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
    return [
        m
        async for m in h.stream(
            STREAM_CMD, ABORT_CMD, prompt=[1, 2], sampling_params={"max_tokens": max_tokens}
        )
    ]


async def test_stream_yields_every_step(worker: tuple[WorkerHandle, ToyEngine]) -> None:
    h, _ = worker
    msgs = await _collect(h, 6)
    assert [m["token_ids"] for m in msgs] == [[1], [2], [3], [4], [5], [6]]
    assert msgs[-1]["finished"] and not any(m.get("finished") for m in msgs[:-1])
    assert [m["at"] for m in msgs] == sorted(m["at"] for m in msgs)


async def test_streams_share_steps_and_other_commands_wait(
    worker: tuple[WorkerHandle, ToyEngine],
) -> None:
    h, engine = worker

    async def late_generate() -> Any:
        await asyncio.sleep(5 * STEP_S)
        return await h.call("generate", n=3)

    a, b, gen = await asyncio.gather(_collect(h, 40), _collect(h, 30), late_generate())
    assert len(a) == 40 and len(b) == 30
    assert gen == {"tokens": [0, 1, 2]}
    assert engine.generate_saw_streams == [0]  # it ran after the streams, not between steps


async def test_leaving_a_stream_aborts_it(worker: tuple[WorkerHandle, ToyEngine]) -> None:
    h, engine = worker
    got = 0
    stream = h.stream(STREAM_CMD, ABORT_CMD, prompt=[1], sampling_params={"max_tokens": 10**6})
    async for _ in stream:
        got += 1
        if got == 3:
            break
    await stream.aclose()  # what a cancelled consumer does
    deadline = time.monotonic() + 5
    while not engine.aborted:
        assert time.monotonic() < deadline, "the worker did not abort the stream"
        await asyncio.sleep(0.01)
    ((_, produced),) = engine.aborted
    assert produced < 1000 and not engine.streams
    assert await h.call("generate", n=1) == {"tokens": [0]}  # the worker serves on


async def test_stream_start_error(worker: tuple[WorkerHandle, ToyEngine]) -> None:
    h, _ = worker
    with pytest.raises(Exception, match="field prompt: empty"):
        async for _ in h.stream(STREAM_CMD, ABORT_CMD, prompt=[], sampling_params={}):
            pass
