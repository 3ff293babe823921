"""The in-process binding (`protocol/inproc.py`): a surface's calls run through the core's auth,
limits, field rules, idempotency and records, and its results are the servicer's own values."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from arctic_sdk.spec.tables import methods as M
from arctic_servers.protocol.config import ProtocolConfig
from arctic_servers.protocol.core import ProtocolCore
from arctic_servers.protocol.inproc import CoreCalls
from arctic_servers.protocol.sqlite_store import SqliteRequestStore
from arctic_servers.rules.errors import ProtocolError

from .test_core import Toy


class Keeping(Toy):
    """Keeps the result it answered, to tell its own objects from decoded copies."""

    def __init__(self) -> None:
        super().__init__()
        self.answered: list[Any] = []
        self.bodies: list[Any] = []
        self.request_ids: list[str] = []

    async def step(self, ctx: Any, body: dict[str, Any]) -> dict[str, Any]:
        self.request_ids.append(ctx.request_id)
        return await super().step(ctx, body)

    async def forward_backward(self, ctx: Any, body: dict[str, Any]) -> dict[str, Any]:
        self.request_ids.append(ctx.request_id)
        self.bodies.append(body)
        out = await super().forward_backward(ctx, body)
        self.answered.append(out)
        return out


def _calls(toy: Toy, **cfg: Any) -> CoreCalls:
    return CoreCalls(ProtocolCore(toy, ProtocolConfig(**cfg)))


def _fb() -> dict[str, Any]:
    return {"args": [], "kwargs": {"input_ids": np.arange(12).reshape(3, 4)}}


@pytest.mark.parametrize("mode", ["async", "auto", "inline"])
async def test_tensors_reach_the_servicer_and_back_as_the_same_arrays(mode: str) -> None:
    """No frame on the way: the servicer reads the caller's arrays and the caller its result
    (in every answer mode: a 202 is awaited, not polled)."""
    toy = Keeping()
    calls = _calls(toy, answer_mode=mode)
    body = _fb()
    out = await calls.call(M.FORWARD_BACKWARD, None, body, job_id="7")
    assert toy.bodies[0]["kwargs"]["input_ids"] is body["kwargs"]["input_ids"]
    lp = out["outputs"]["logprobs_shifted"]
    assert lp is toy.answered[0]["outputs"]["logprobs_shifted"]
    rec = calls.core.requests.get("7", toy.request_ids[0])  # recorded as any call is
    assert rec is not None
    assert rec.status == "completed" and rec.result_frame is not None
    assert rec.fetched_at is not None  # retention counts from this answer


async def test_auth_is_the_cores() -> None:
    calls = _calls(Toy(), tokens=frozenset({"sekrit"}))
    for token in (None, "nope"):
        with pytest.raises(ProtocolError) as e:
            await calls.call(M.STEP, token, {}, job_id="7")
        assert e.value.code == "unauthenticated"
    assert (await calls.call(M.STEP, "sekrit", {}, job_id="7"))["metrics"]["global_step"] == 1


async def test_field_rules_and_limits_run() -> None:
    calls = _calls(Toy())
    with pytest.raises(ProtocolError) as e:
        await calls.call(M.STEP, None, {"lr": 1, "foo": 2}, job_id="7")
    assert e.value.code == "invalid_argument"
    assert e.value.details["unknown_fields"] == ["lr", "foo"]
    with pytest.raises(ProtocolError) as e:
        await calls.call(M.STEP, None, {"learning_rate": float("nan")}, job_id="7")
    assert e.value.code == "invalid_argument"
    deep: Any = {}
    for _ in range(200):
        deep = {"x": deep}
    with pytest.raises(ProtocolError) as e:
        await calls.call(M.FORWARD_BACKWARD, None, {"args": [], "kwargs": deep}, job_id="7")
    assert e.value.code == "invalid_argument"
    with pytest.raises(ProtocolError) as e:  # job-scoped without a job
        await calls.call(M.STEP, None, {})
    assert e.value.code == "missing_field"


async def test_keyed_call_runs_once_and_a_reused_key_conflicts() -> None:
    toy = Toy()
    calls = _calls(toy)
    first = await calls.call(M.STEP, None, {}, job_id="7", key="k-1")
    again = await calls.call(M.STEP, None, {}, job_id="7", key="k-1")
    assert first == again and [op for op, _ in toy.log] == ["step"]
    with pytest.raises(ProtocolError) as e:
        await calls.call(M.STEP, None, {"learning_rate": 0.1}, job_id="7", key="k-1")
    assert e.value.code == "idempotency_key_conflict"


async def test_a_failed_request_raises_its_error() -> None:
    with pytest.raises(ProtocolError) as e:
        await _calls(Toy()).call(M.SAVE_CHECKPOINT, None, {}, job_id="7")
    assert e.value.code == "internal" and "disk on fire" in e.value.message


async def test_a_durable_store_keeps_the_body_until_the_request_ends(tmp_path: Path) -> None:
    """A durable server records an in-process call's body (as a frame) before it runs, so a
    restart takes it up as it would an HTTP call's."""
    toy = Keeping()
    toy.step_delay = 0.3
    store = SqliteRequestStore(tmp_path / "r.db")
    calls = CoreCalls(ProtocolCore(toy, ProtocolConfig(), request_store=store))
    task = asyncio.ensure_future(calls.call(M.STEP, None, {"learning_rate": 0.5}, job_id="7"))
    await asyncio.sleep(0.1)
    (rec,) = store.unfinished()
    assert rec.status in ("pending", "running") and rec.body_frame is not None
    await task
    assert store.unfinished() == []
    done = store.get("7", rec.request_id)
    assert done is not None and done.status == "completed" and done.body_frame is None
