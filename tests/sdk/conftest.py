"""Fixtures: the fake gateway (HTTP, gRPC, in process), clients of every kind, admin helpers.

Integration tests take `kind` (sync or async, openai-python's pattern) and `transport`
(http, grpc, inproc) and drive one test body through every combination:

    async def test_step(env):
        client = env.client()
        out = await env.run(client.step())
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests

from arctic_sdk import AsyncClient, Client
from conformance.fake import BackgroundFake, FakeServicer

TOKEN = "tok-SECRET-7f3a9c"
JOB = {
    "sub_job_configs": [
        {"job_type": "training", "model_name": "tiny"},
        {"job_type": "sampling", "model_name": "tiny"},
    ]
}
INLINE_WAIT_S = 0.25
FAST = {
    "poll": {"initial": 0.02, "multiplier": 1.5, "max_interval": 0.2},
    "retry": {"initial_backoff": 0.02, "max_backoff": 0.2},
    "timeout": 60.0,
    "progress": False,
}


@pytest.fixture(scope="session")
def fake() -> Iterator[BackgroundFake]:
    # A short inline wait: slow calls answer 202 and are polled, as on a busy gateway.
    with BackgroundFake(
        token=TOKEN, admin=True, inline_wait_seconds=INLINE_WAIT_S, max_total_gpus=1_000_000
    ) as f:
        yield f


@dataclass
class Env:
    """One (sync|async) x (http|grpc|inproc) combination."""

    sync: bool
    transport: str
    fake: BackgroundFake
    clients: list[Any] = field(default_factory=list)
    servicer: FakeServicer | None = None

    @property
    def faults(self) -> bool:
        return self.transport != "inproc"

    def kwargs(self, **overrides: Any) -> dict[str, Any]:
        kw: dict[str, Any] = {"token": TOKEN, "transport": self.transport, "config": dict(FAST)}
        if self.transport == "inproc":
            from arctic_servers.protocol.config import ProtocolConfig

            if self.servicer is None:
                self.servicer = FakeServicer(auth=True)
            kw["servicer"] = self.servicer
            protocol = ProtocolConfig(tokens=frozenset({TOKEN}), inline_wait_seconds=INLINE_WAIT_S)
            kw["config"]["inproc"] = {"protocol": protocol}
        else:
            kw["base_url"] = self.fake.base_url
            if self.transport == "grpc":
                kw["grpc_target"] = self.fake.grpc_target
        kw.update(overrides)
        return kw

    def client(self, **overrides: Any) -> Any:
        cls = Client if self.sync else AsyncClient
        c = cls(**self.kwargs(**overrides))
        self.clients.append(c)
        return c

    @staticmethod
    async def run(value: Any) -> Any:
        """The value of a sync call, or the awaited value of an async one."""
        return await value if inspect.isawaitable(value) else value

    @staticmethod
    async def result(fut: Any) -> Any:
        return await fut if inspect.isawaitable(fut) else fut.result(timeout=60)

    async def job(self, client: Any, **body: Any) -> str:
        await self.run(client.create_job({**JOB, **body}))
        await self.run(client.wait_until_running())
        return str(client.job_id)

    # ------------------------------------------------------------------ fake state

    def job_state(self, job_id: str) -> dict[str, Any]:
        if self.transport == "inproc":
            assert self.servicer is not None
            return self.servicer.job_state(job_id)
        return admin(self.fake, "GET", f"/jobs/{job_id}/state")

    def executed(self, job_id: str, op: str) -> list[dict[str, Any]]:
        return [e for e in self.job_state(job_id)["execution_log"] if e["op"] == op]

    def arm(self, **fault: Any) -> dict[str, Any]:
        if not self.faults:
            pytest.skip("fault injection is served over HTTP and gRPC only")
        fault.setdefault("transport", self.transport)
        return admin(self.fake, "POST", "/faults", fault)

    def fired(self) -> int:
        if not self.faults:
            return 0
        return sum(f["fired"] for f in admin(self.fake, "GET", "/faults")["faults"])

    def behaviour(self, **values: Any) -> None:
        if self.transport == "inproc":
            assert self.servicer is not None
            self.servicer.behaviour.update(values)
        else:
            admin(self.fake, "POST", "/behaviour", values)


def admin(fake: BackgroundFake, verb: str, path: str, body: Any = None) -> Any:
    r = requests.request(
        verb,
        fake.admin_url + path,
        json=body,
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=10,
    )
    r.raise_for_status()
    return r.json()


@pytest.fixture(params=[True, False], ids=["sync", "async"])
def sync(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The `sync` half of the harness calls the sync client from the test's coroutine on
    purpose (one body for both clients): the in-loop warning (`test_loop_guard.py`) is expected
    there, not a failure."""
    quiet = pytest.mark.filterwarnings("ignore::arctic_sdk.SyncClientInEventLoopWarning")
    here = Path(__file__).parent
    for item in items:
        if here not in item.path.parents:
            continue
        params = getattr(getattr(item, "callspec", None), "params", {})
        if params.get("sync") is True or params.get("kind") == "sync":
            item.add_marker(quiet)


@pytest.fixture(params=["http", "grpc", "inproc"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def env(sync: bool, transport: str, fake: BackgroundFake) -> AsyncIterator[Env]:
    e = Env(sync, transport, fake)
    try:
        yield e
    finally:
        if e.faults:
            admin(fake, "DELETE", "/faults")
            admin(fake, "POST", "/behaviour", {"latency_s": None})
        for c in e.clients:
            await Env.run(c.close())
