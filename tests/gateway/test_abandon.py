"""The issue-37 scenario on the gateway: a 30 s generate (fake workers' latency) abandoned by
the sync client (Ctrl-C) or the async client (a cancelled task), over HTTP and gRPC, while the
gateway still holds its answer (0.8 s in: its id unknown to the client) or while it is polled
(3 s in). The caller is back within the bound with the request id, and the gateway has recorded
the request cancelled: the worker stopped it at its engine's next safe point.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from arctic_sdk import AsyncClient, Client
from arctic_sdk._core.abandon import CANCEL_BOUND_S

from ..sdk.test_abandon import _ctrl_c_after
from .harness import Gateway

PROMPT = {"prompts": [np.arange(4, dtype=np.int64)], "sampling_params": {"max_tokens": 4}}
JOB = {
    "sub_job_configs": [
        {"job_type": "training", "model_name": "tiny"},
        {"job_type": "sampling", "model_name": "tiny"},
    ]
}
FAST = {"poll": {"initial": 0.05, "max_interval": 0.2}, "progress": False}
CASES = [("http", 0.8), ("grpc", 3.0)]


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, str]]:
    g = Gateway(tmp_path_factory.mktemp("gw-abandon"), args=("--fake-latency", "generate=30"))
    g.start()
    try:
        with Client(g.base_url, token=g.token, config=dict(FAST)) as c:
            c.create_job(JOB)
            c.wait_until_running()
            yield g, str(c.job_id)
    finally:
        g.cleanup()


def _kwargs(g: Gateway, job_id: str, transport: str) -> dict[str, Any]:
    kw: dict[str, Any] = {"token": g.token, "job_id": job_id, "config": dict(FAST)}
    kw["transport"] = transport
    if transport == "grpc":
        kw["grpc_target"] = f"127.0.0.1:{g.grpc_port}"
    return kw


def _check(exc: BaseException, left: float) -> str:
    rid = str(getattr(exc, "request_id", ""))
    assert rid, f"the {type(exc).__name__} names no request id"
    notes = "\n".join(getattr(exc, "__notes__", []))
    assert rid in notes and "cancelled on the server" in notes, notes
    assert left < CANCEL_BOUND_S + 0.5, f"cancelling took {left:.2f} s"
    return rid


@pytest.mark.parametrize(("transport", "after"), CASES)
def test_ctrl_c_cancels_the_generate(gw: tuple[Gateway, str], transport: str, after: float) -> None:
    g, job_id = gw
    with Client(g.base_url, **_kwargs(g, job_id, transport)) as client:
        timer, fired = _ctrl_c_after(after)
        try:
            with pytest.raises(KeyboardInterrupt) as info:
                client.generate(PROMPT)
            left = time.monotonic() - fired[0]
        finally:
            timer.cancel()
        rid = _check(info.value, left)
        assert client.get_request(request_id=rid)["status"] == "cancelled"


@pytest.mark.parametrize(("transport", "after"), CASES)
async def test_cancelled_task_cancels_the_generate(
    gw: tuple[Gateway, str], transport: str, after: float
) -> None:
    g, job_id = gw
    async with AsyncClient(g.base_url, **_kwargs(g, job_id, transport)) as client:
        task = asyncio.ensure_future(client.generate(PROMPT))
        await asyncio.sleep(after)
        t0 = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError) as info:
            await task
        rid = _check(info.value, time.monotonic() - t0)
        assert (await client.get_request(request_id=rid))["status"] == "cancelled"
