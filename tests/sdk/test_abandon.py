"""An abandoned call cancels its request on the server (PROTOCOL.md §3.3 "Abandoned calls").

A long generate on the fake gateway (30 s of latency) is abandoned by the sync client with
Ctrl-C (`KeyboardInterrupt` raised in the main thread, as SIGINT does) and by the async client
with a cancelled task, over HTTP, gRPC and in process: the caller's exception names the request
id, and the server has recorded the request cancelled before the exception reaches the caller,
its work never started. Both while the request is polled (its id known) and while the server
still holds the submission's answer (its id unknown: the SDK replays it with
`Prefer: respond-async`). A cancel the server does not answer holds the caller no longer than
the bound.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from arctic_sdk import AsyncClient, Client
from arctic_sdk._core import calls
from arctic_sdk._core.abandon import CANCEL_BOUND_S
from arctic_servers.protocol.config import ProtocolConfig
from conformance.fake import BackgroundFake, FakeServicer

from .conftest import FAST, JOB, TOKEN, admin

LATENCY_S = 30.0
ABANDON_AFTER_S = 0.8
PROMPT = {"prompts": [np.arange(4, dtype=np.int64)], "sampling_params": {"max_tokens": 4}}


@pytest.fixture(scope="module", params=["polled", "held"])
def server(request: pytest.FixtureRequest) -> Iterator[tuple[str, BackgroundFake]]:
    """`polled`: a 0.25 s inline wait, so the call is abandoned while it polls (its id known);
    `held`: the server holds the answer for the whole call (`inline` mode), so it is abandoned
    before any answer named its request."""
    if request.param == "polled":
        kw: dict[str, Any] = {"inline_wait_seconds": 0.25}
    else:
        kw = {"answer_mode": "inline"}
    with BackgroundFake(token=TOKEN, admin=True, max_total_gpus=1_000_000, **kw) as f:
        yield str(request.param), f


@pytest.fixture(autouse=True)
def _reset(server: tuple[str, BackgroundFake]) -> Iterator[None]:
    yield
    fake = server[1]
    admin(fake, "DELETE", "/faults")
    admin(fake, "POST", "/behaviour", {"latency_s": None})


@dataclass
class Setup:
    """A client's arguments, and the server's behaviour and state, for one transport."""

    mode: str
    fake: BackgroundFake
    transport: str
    servicer: FakeServicer | None = None

    def kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {"token": TOKEN, "transport": self.transport, "config": dict(FAST)}
        if self.transport == "inproc":
            self.servicer = FakeServicer(auth=True)
            kw["servicer"] = self.servicer
            if self.mode == "polled":
                protocol = ProtocolConfig(tokens=frozenset({TOKEN}), inline_wait_seconds=0.25)
            else:
                protocol = ProtocolConfig(tokens=frozenset({TOKEN}), answer_mode="inline")
            kw["config"]["inproc"] = {"protocol": protocol}
            return kw
        kw["base_url"] = self.fake.base_url
        if self.transport == "grpc":
            kw["grpc_target"] = self.fake.grpc_target
        return kw

    def slow_generate(self) -> None:
        if self.servicer is not None:
            self.servicer.behaviour["latency_s"] = {"generate": LATENCY_S}
        else:
            admin(self.fake, "POST", "/behaviour", {"latency_s": {"generate": LATENCY_S}})

    def generates_run(self, job_id: str) -> int:
        """How many generate calls got past their latency into the engine."""
        if self.servicer is not None:
            state = self.servicer.job_state(job_id)
        else:
            state = admin(self.fake, "GET", f"/jobs/{job_id}/state")
        return sum(1 for e in state["execution_log"] if e["op"] == "generate")


@pytest.fixture(params=["http", "grpc", "inproc"])
def setup(server: tuple[str, BackgroundFake], request: pytest.FixtureRequest) -> Setup:
    return Setup(server[0], server[1], str(request.param))


def _checked(exc: BaseException, left: float, setup: Setup) -> str:
    """The request id `exc` names; its note says the server cancelled it, in time."""
    rid = str(getattr(exc, "request_id", ""))
    assert rid, f"the {type(exc).__name__} names no request id"
    notes = "\n".join(getattr(exc, "__notes__", []))
    assert rid in notes and "cancelled on the server" in notes, notes
    what = f"{setup.mode}/{setup.transport}"
    assert left < CANCEL_BOUND_S + 0.5, f"{what}: cancelling took {left:.2f} s"
    return rid


def _ctrl_c_after(seconds: float) -> tuple[threading.Timer, list[float]]:
    """Ctrl-C after `seconds`: SIGINT to the main thread (a blocking read there is interrupted,
    as in a terminal); when it fired."""
    fired: list[float] = []
    main = threading.main_thread().ident
    assert main is not None and threading.current_thread() is threading.main_thread()

    def interrupt() -> None:
        fired.append(time.monotonic())
        signal.pthread_kill(main, signal.SIGINT)

    timer = threading.Timer(seconds, interrupt)
    timer.start()
    return timer, fired


def test_ctrl_c_cancels_the_request(setup: Setup) -> None:
    with Client(**setup.kwargs()) as client:
        client.create_job(JOB)
        client.wait_until_running()
        job_id = str(client.job_id)
        setup.slow_generate()
        timer, fired = _ctrl_c_after(ABANDON_AFTER_S)
        try:
            with pytest.raises(KeyboardInterrupt) as info:
                client.generate(PROMPT)
            left = time.monotonic() - fired[0]
        finally:
            timer.cancel()
        rid = _checked(info.value, left, setup)
        # recorded before the caller got control back, and the work never ran
        assert client.get_request(request_id=rid)["status"] == "cancelled"
        assert setup.generates_run(job_id) == 0


async def test_cancelled_task_cancels_the_request(setup: Setup) -> None:
    client = AsyncClient(**setup.kwargs())
    try:
        await client.create_job(JOB)
        await client.wait_until_running()
        job_id = str(client.job_id)
        setup.slow_generate()
        task = asyncio.ensure_future(client.generate(PROMPT))
        await asyncio.sleep(ABANDON_AFTER_S)
        t0 = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError) as info:
            await task
        rid = _checked(info.value, time.monotonic() - t0, setup)
        assert (await client.get_request(request_id=rid))["status"] == "cancelled"
        assert setup.generates_run(job_id) == 0
    finally:
        await client.close()


def test_unanswered_cancel_is_bounded(setup: Setup) -> None:
    """The server holds every cancel-request (and every replay) 30 s: Ctrl-C still returns
    within the bound, and the note says the request may keep running and how to cancel it."""
    if setup.transport == "inproc":
        pytest.skip("fault injection is served over HTTP and gRPC only")
    with Client(**setup.kwargs()) as client:
        client.create_job(JOB)
        client.wait_until_running()
        setup.slow_generate()
        for route in ("cancel-request", "generate"):
            fault = {"route": route, "kind": "delay", "delay_s": 30, "count": 5}
            admin(setup.fake, "POST", "/faults", {**fault, "transport": setup.transport})
        timer, fired = _ctrl_c_after(ABANDON_AFTER_S)
        try:
            with pytest.raises(KeyboardInterrupt) as info:
                client.generate(PROMPT)
            left = time.monotonic() - fired[0]
        finally:
            timer.cancel()
    what = f"{setup.mode}/{setup.transport}"
    assert left < CANCEL_BOUND_S + 1.0, f"{what}: the caller waited {left:.2f} s"
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "may" in notes and "run" in notes, notes


@pytest.mark.parametrize("server", ["held"], indirect=True)
async def test_grpc_call_cancellation_alone_cancels(
    server: tuple[str, BackgroundFake], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server side of gRPC's cancellation: with the SDK's own cancel switched off, a gRPC
    call cancelled while the server holds its answer still ends its request cancelled, the work
    never run (what a plain gRPC client relies on)."""
    setup = Setup(server[0], server[1], "grpc")

    def no_cancel(*_: Any) -> Iterator[Any]:
        return
        yield

    monkeypatch.setattr(calls, "abandon", no_cancel)
    client = AsyncClient(**setup.kwargs())
    try:
        await client.create_job(JOB)
        await client.wait_until_running()
        job_id = str(client.job_id)
        setup.slow_generate()
        task = asyncio.ensure_future(client.generate(PROMPT))
        await asyncio.sleep(ABANDON_AFTER_S)
        t0 = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        cancelled: list[str] = []
        while not cancelled and time.monotonic() - t0 < CANCEL_BOUND_S:
            log = admin(setup.fake, "GET", f"/jobs/{job_id}/state")["execution_log"]
            cancelled = [e["cancelled_request_id"] for e in log if "cancelled_request_id" in e]
            await asyncio.sleep(0.05)
        assert cancelled, "the server did not cancel the request of the cancelled gRPC call"
        assert (await client.get_request(request_id=cancelled[0]))["status"] == "cancelled"
        assert setup.generates_run(job_id) == 0
    finally:
        await client.close()
