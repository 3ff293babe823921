"""Client life: pickling and fresh event loops (SkyRL), secrets, leases, job start-up,
fallbacks against servers that lack routes, progress bars, the README quick start."""

from __future__ import annotations

import asyncio
import gc
import logging
import pickle
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from arctic_sdk import (
    ArcticTimeoutError,
    AsyncClient,
    AuthenticationError,
    Client,
    ConflictError,
)
from arctic_sdk._core.effects import Progress
from arctic_sdk.spec.tables import methods as M
from arctic_sdk.transports._driver import ProgressReporter
from arctic_servers._generated.servicer import ServicerBase
from arctic_servers.protocol.context import CallContext
from conformance.fake import BackgroundFake, FakeServicer, JobDelays, JobManager

from .conftest import FAST, JOB, TOKEN, Env, admin
from .test_client_ops import batch

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.filterwarnings("error::ResourceWarning")
def test_skyrl_pattern_fresh_loop_per_call_then_pickle(
    transport: str, fake: BackgroundFake
) -> None:
    env = Env(False, transport, fake)
    client = AsyncClient(**env.kwargs())
    asyncio.run(client.create_job(JOB))
    asyncio.run(client.wait_until_running())
    for i in range(20):
        out = asyncio.run(client.step())
        assert out["metrics"]["global_step"] == i + 1
    copy = pickle.loads(pickle.dumps(client))
    assert copy.job_id == client.job_id and repr(copy) == repr(client)
    assert asyncio.run(copy.step())["metrics"]["global_step"] == 21
    asyncio.run(copy.close())
    asyncio.run(client.close())
    del client, copy
    gc.collect()


def test_sync_client_pickles_and_reconnects(transport: str, fake: BackgroundFake) -> None:
    env = Env(True, transport, fake)
    with Client(**env.kwargs()) as client:
        client.create_job(JOB)
        client.wait_until_running()
        client.step()
        with pickle.loads(pickle.dumps(client)) as copy:
            assert copy.step()["metrics"]["global_step"] == 2  # numbering carries on
        again = Client(**client.reconnect_config())
        assert again.get_job()["job"]["job_id"] == client.job_id
        # attached by id, it cannot know the job's numbering: its calls go unsequenced
        assert again.step()["metrics"]["global_step"] == 3
        again.close()


def test_pat_never_appears_in_logs_reprs_or_errors(
    fake: BackgroundFake, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    for transport in ("http", "grpc"):
        env = Env(True, transport, fake)
        with Client(**env.kwargs()) as client:
            client.create_job(JOB)
            client.wait_until_running()
            admin(fake, "POST", "/faults", {"route": "step", "kind": "fail", "status": 503})
            client.step()
            texts = [
                repr(client),
                repr(client.config),
                str(client.config.model_dump()),
                repr(client.reconnect_config()),
                str(client.config.cortex),
            ]
        with Client(**env.kwargs(token="tok-WRONG-abcdef")) as bad:
            with pytest.raises(AuthenticationError) as info:
                bad.step(job_id="job-1")
            texts += [str(info.value), repr(info.value), repr(info.value.body)]
        for text in [*texts, caplog.text]:
            assert TOKEN not in text and "tok-WRONG-abcdef" not in text
    admin(fake, "DELETE", "/faults")


def test_lease_is_renewed_while_the_client_lives(fake: BackgroundFake) -> None:
    env = Env(True, "http", fake)
    client = Client(**env.kwargs())
    client.create_job({**JOB, "lease_seconds": 1})
    client.wait_until_running()
    time.sleep(1.6)
    assert client.get_job()["job"]["state"] == "running"
    job_id = client.job_id
    client.close()  # renewals stop: the lease runs out
    time.sleep(1.5)
    state = env.job_state(str(job_id))
    assert state["state"] == "cancelled" and "lease" in state["reason"]


def test_wait_until_running_shows_states_and_fails_on_terminal(
    fake: BackgroundFake, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="arctic_sdk")
    delays = JobDelays(placing=0.15, initializing=0.15, running=0.15)
    servicer = FakeServicer(JobManager(delays=delays))
    with Client(transport="inproc", servicer=servicer, config=FAST) as client:
        client.create_job(JOB)
        assert client.wait_until_running()["state"] == "running"
    shown = " ".join(r.getMessage() for r in caplog.records)
    seen = [s for s in ("pending", "placing", "initializing", "running") if f": {s} (" in shown]
    assert "running" in seen and len(seen) >= 3, shown  # each change is shown once
    env = Env(True, "http", fake)
    with Client(**env.kwargs()) as other:
        other.create_job(JOB)
        admin(fake, "POST", f"/jobs/{other.job_id}/end", {"state": "failed", "reason": "boom"})
        with pytest.raises(ConflictError, match="boom") as info:
            other.wait_until_running()
        assert info.value.code == "job_terminal"
        with pytest.raises(ArcticTimeoutError):
            Client(**env.kwargs()).wait_until_running(job_id="job-1", timeout=1e-9)


@pytest.mark.filterwarnings("ignore::arctic_sdk.SyncClientInEventLoopWarning")
async def test_connect_creates_and_waits(fake: BackgroundFake) -> None:
    env = Env(True, "http", fake)
    with Client.connect(create_job=JOB, **env.kwargs()) as client:
        assert client.get_job()["job"]["state"] == "running"
    async with await AsyncClient.connect(create_job=JOB, **env.kwargs()) as aclient:
        assert (await aclient.get_job())["job"]["state"] == "running"


class NoRoutes(FakeServicer):
    """A server without forward, log-probs, sync-weights and lifecycle routes (deployed-like):
    it forwards no `engine` op but forward-backward, which it serves as an op of its own."""

    run_on_engine = ServicerBase.run_on_engine  # so forward and log-probs are not served

    async def forward_backward(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        return await FakeServicer.run_on_engine(self, ctx, M.FORWARD_BACKWARD, body)

    sync_weights = ServicerBase.sync_weights
    sleep_inference = ServicerBase.sleep_inference
    wake_training = ServicerBase.wake_training


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_fallbacks_for_missing_routes(kind: str) -> None:
    servicer = NoRoutes()
    cls = Client if kind == "sync" else AsyncClient
    client: Any = cls(transport="inproc", servicer=servicer, config=FAST)

    async def run(x: Any) -> Any:
        return await x if asyncio.iscoroutine(x) else x

    try:
        await run(client.create_job(JOB))
        await run(client.wait_until_running())
        fwd = await run(client.forward(batch()))
        assert fwd["outputs"]["logprobs_shifted"].shape == (2, 8)
        lp = await run(client.log_probs(input_ids=batch()["kwargs"]["input_ids"]))  # type: ignore[index]
        np.testing.assert_allclose(
            lp["outputs"]["logprobs_shifted"], fwd["outputs"]["logprobs_shifted"]
        )
        assert (await run(client.sleep_inference()))["applied"] is False
        assert (await run(client.wake_training()))["applied"] is False
        synced = await run(client.sync_weights())
        assert synced["weight_version"] == 1
        log = servicer.job_state(str(client.job_id))["execution_log"]
        ops = [(e["op"], e.get("operation_type")) for e in log]
        assert [o for o, _ in ops].count("operation") >= 3
        assert "forward" not in [o for o, _ in ops]
    finally:
        await run(client.close())


def test_progress_bars_only_when_enabled(capsys: pytest.CaptureFixture[str]) -> None:
    bars: dict[str, Any] = {}
    quiet = ProgressReporter(None)  # stderr is captured: not a terminal
    quiet.handle(Progress("k", "start", desc="job 1: pending", unit="s"), bars)
    assert bars == {}
    loud = ProgressReporter(True)
    loud.handle(Progress("u", "start", desc="forward-backward upload", total=100), bars)
    loud.handle(Progress("u", "update", n=60), bars)
    loud.handle(Progress("u", "close"), bars)
    assert "forward-backward upload" in capsys.readouterr().err


def test_readme_quick_start_runs_as_written() -> None:
    text = (ROOT / "README.md").read_text()
    section = text.split("## SDK quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert blocks, "README has no python block under 'SDK quick start'"
    for code in blocks:
        exec(compile(code, "README.md", "exec"), {"__name__": "__readme__"})


@pytest.mark.filterwarnings("ignore::arctic_sdk.SyncClientInEventLoopWarning")
async def test_grpc_target_comes_from_the_capabilities(fake: BackgroundFake) -> None:
    kw = {"token": TOKEN, "transport": "grpc", "config": FAST}
    with Client(fake.base_url, **kw) as client:
        client.create_job(JOB)
        assert client.wait_until_running()["state"] == "running"
    async with AsyncClient(fake.base_url, **kw) as aclient:
        await aclient.create_job(JOB)
        assert (await aclient.get_job())["job"]["state"] in ("running", "pending", "placing")
