"""The issue-37 scenario on the gateway: a 30 s generate (fake workers' latency) abandoned by
the sync client (Ctrl-C) or the async client (a cancelled task), over HTTP and gRPC, while the
gateway still holds its answer (0.8 s in: its id unknown to the client) or while it is polled
(3 s in). The caller is back within the bound with the request id, and the gateway has recorded
the request cancelled: the worker stopped it at its engine's next safe point. The same generate
on the OpenAI surface, left by an `openai` client whose timeout fired (streamed or not; queued
behind another or running): the worker stops it (running) or never starts it (queued).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from arctic_sdk import AsyncClient, Client
from arctic_sdk._core.abandon import CANCEL_BOUND_S
from arctic_sdk.spec.tables import methods as M

from ..sdk.test_abandon import _ctrl_c_after
from .harness import Client as Raw
from .harness import Gateway

openai = pytest.importorskip("openai")

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


# ------------------------------------------------- the OpenAI surface: a client that leaves


def _sampler_generates(g: Gateway, job_id: str) -> int:
    """How many generates the fake sampler's engine has started (its `ops` counter)."""
    workers = Raw(g.prefix_url, token=g.token).stats(g.base_url, job_id)
    return sum(int(w.get("ops", {}).get("generate", 0)) for w in workers.values())


def _worker_free_within(g: Gateway, job_id: str, bound: float) -> float:
    """A reset-prefix-cache on the sampler answers within `bound` s (it waits behind any
    generate the worker still runs: 30 s here), and how long it took."""
    raw = Raw(g.prefix_url, token=g.token, timeout=60)
    (sampler,) = [s["sub_job_id"] for s in raw.job(job_id)["sub_jobs"]
                  if "SAMPLING" in str(s["job_type"]).upper()]  # fmt: skip
    t0 = time.monotonic()
    resp = raw.call(M.RESET_PREFIX_CACHE, {}, headers={"x-arctic-sub-job": sampler}, job_id=job_id)
    took = time.monotonic() - t0
    assert resp.status == 200, resp.data
    assert took < bound, f"the sampler's worker was busy {took:.1f} s: the generate ran on"
    return took


def _openai(g: Gateway, timeout: float) -> Any:
    return openai.OpenAI(base_url=g.base_url + "/v1", api_key=g.token, max_retries=0,
                         timeout=timeout)  # fmt: skip


@pytest.mark.parametrize(("route", "stream"), [("completions", False), ("chat", True)])
def test_openai_client_timeout_stops_the_generate(
    gw: tuple[Gateway, str], route: str, stream: bool
) -> None:
    """The `openai` client gives up after 1 s (its timeout) on a 30 s generate: the gateway
    cancels the work when the connection closes, and the fake sampler's worker stops it
    between latency slices (free again at once, not after 30 s)."""
    g, job_id = gw
    started = _sampler_generates(g, job_id)
    t0 = time.monotonic()
    with _openai(g, 1.0) as client, pytest.raises(openai.APITimeoutError):
        if route == "chat":
            msgs = [{"role": "user", "content": "hi"}]
            out = client.chat.completions.create(model=job_id, messages=msgs, max_tokens=4,
                                                 stream=stream)  # fmt: skip
        else:
            out = client.completions.create(model=job_id, prompt="hi", max_tokens=4,
                                            stream=stream)  # fmt: skip
        if stream:
            for _ in out:
                pass
    gave_up = time.monotonic() - t0
    took = _worker_free_within(g, job_id, 5.0)
    assert _sampler_generates(g, job_id) == started + 1
    print(f"{route} stream={stream}: client gave up after {gave_up:.2f} s; worker free "
          f"{took:.2f} s later")  # fmt: skip


def test_openai_queued_completion_never_starts(gw: tuple[Gateway, str]) -> None:
    """Two completions on the one fake sampler: the second waits behind the first in the
    worker's queue; its client leaves (1 s timeout), then the first's (3 s). The second never
    starts, the first is stopped, the worker is free at once."""
    g, job_id = gw
    started = _sampler_generates(g, job_id)
    errors: list[BaseException] = []

    def complete(timeout: float) -> None:
        try:
            with _openai(g, timeout) as client:
                client.completions.create(model=job_id, prompt="hi", max_tokens=4)
        except BaseException as exc:
            errors.append(exc)

    first = threading.Thread(target=complete, args=(3.0,))
    first.start()
    time.sleep(0.5)
    second = threading.Thread(target=complete, args=(1.0,))
    second.start()
    second.join(30)
    first.join(30)
    assert len(errors) == 2 and all(isinstance(e, openai.APITimeoutError) for e in errors), errors
    _worker_free_within(g, job_id, 5.0)
    assert _sampler_generates(g, job_id) == started + 1, "the queued completion ran"
