"""Start the fake gateway in the running event loop (`start_fake`) or in a thread.

In a coroutine::

    fake = await start_fake(token="t", admin=True)
    ... fake.prefix_url ... fake.grpc_target ... fake.servicer.job_state("job-1") ...
    await fake.close()

In synchronous code (`BackgroundFake`)::

    with BackgroundFake(admin=True) as fake:
        requests.get(fake.prefix_url + "/capabilities")
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from dataclasses import dataclass, field
from typing import Any, ClassVar

from aiohttp import web

from arctic_servers.protocol.config import ProtocolConfig, ProtocolLimits
from arctic_servers.protocol.core import ProtocolCore
from arctic_servers.serving.serve import ServerHandle, start_server

from . import behaviour
from .admin import Admin
from .faults import FaultRegistry
from .injection import FaultInterceptor, fault_middleware
from .jobs import JobDelays, JobManager
from .openai import install as install_openai
from .servicer import DEFAULT_VOCAB_SIZE, FakeServicer

#: The prefix path the fake's URLs use (any db/schema/endpoint values are served).
DEFAULT_PATH = "/api/v2/databases/fake_db/schemas/fake_schema/cortex-training"
VERSION = "0.1.0"


@dataclass
class RunningFake(ServerHandle):
    servicer: FakeServicer = field(kw_only=True)
    faults: FaultRegistry = field(kw_only=True)
    prefix_path: ClassVar[str] = DEFAULT_PATH  # `{base}/api/v2/databases/fake_db/...`

    async def close(self) -> None:
        await self.server.close(grace=0.2)


def fake_config(
    *, tokens: frozenset[str], answer_mode: str, limits: ProtocolLimits, **overrides: Any
) -> ProtocolConfig:
    base = ProtocolConfig(
        server="fake",
        server_version=VERSION,
        limits=limits,
        tokens=tokens,
        answer_mode=answer_mode,
        openai=True,  # /v1/... over its jobs on the same listener (fake/openai.py)
        leases=True,
        lease_default_seconds=0,
        lease_max_seconds=86_400,
    )
    return dataclasses.replace(base, **overrides)


async def start_fake(
    *,
    token: str | None = None,
    tokens: tuple[str, ...] = (),
    admin: bool = False,
    grpc: bool = True,
    host: str = "127.0.0.1",
    port: int = 0,
    grpc_port: int = 0,
    delays: JobDelays | None = None,
    max_total_gpus: int = 64,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    answer_mode: str = "auto",
    limits: ProtocolLimits | None = None,
    **config: Any,
) -> RunningFake:
    """Serve the fake gateway on HTTP (and gRPC unless `grpc=False`); port 0 = a free port.

    `token`/`tokens` turn PAT auth on; `admin` serves `/_admin/` (faults, job state, reset);
    `delays` slow the job state machine down; other keywords go to `ProtocolConfig`.
    """
    accepted = frozenset((token,) if token else ()) | frozenset(tokens)
    jobs = JobManager(
        max_total_gpus=max_total_gpus,
        delays=delays or JobDelays(),
        lease_max_seconds=int(config.get("lease_max_seconds", 86_400)),
    )
    servicer = FakeServicer(jobs, vocab_size=vocab_size, auth=bool(accepted))
    registry = FaultRegistry()
    cfg = fake_config(
        tokens=accepted, answer_mode=answer_mode, limits=limits or ProtocolLimits(), **config
    )

    def configure(app: web.Application, core: ProtocolCore) -> None:
        servicer.core = core
        if cfg.openai:
            install_openai(app, core)
        if admin:
            app.middlewares.insert(0, fault_middleware(registry))
            Admin(servicer, registry, core).add_routes(app)
            behaviour.install(app, core, servicer)

    server = await start_server(
        servicer,
        cfg,
        host=host,
        http_port=port,
        grpc_port=grpc_port if grpc else None,
        configure_app=configure,
        grpc_interceptors=[FaultInterceptor(registry)] if admin else [],
    )
    return RunningFake(server, admin, servicer=servicer, faults=registry)


class BackgroundFake:
    """The fake gateway in its own thread and event loop, for synchronous code and tests."""

    def __init__(self, **kwargs: Any) -> None:
        self._kwargs = kwargs
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, daemon=True, name="arctic-fake-gateway"
        )
        self.fake: RunningFake | None = None

    def start(self) -> RunningFake:
        self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(start_fake(**self._kwargs), self._loop)
        self.fake = fut.result(timeout=30)
        return self.fake

    def run(self, coro: Any, timeout: float = 30) -> Any:
        """Run a coroutine on the fake's loop (servicer state is not thread-safe)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def call(self, fn: Any, *args: Any) -> Any:
        """Call a function on the fake's loop and return its result."""

        async def wrapper() -> Any:
            return fn(*args)

        return self.run(wrapper())

    def stop(self) -> None:
        if self.fake is not None:
            asyncio.run_coroutine_threadsafe(self.fake.close(), self._loop).result(30)
            self.fake = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or self.fake is None:
            raise AttributeError(name)
        return getattr(self.fake, name)

    def __enter__(self) -> BackgroundFake:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
