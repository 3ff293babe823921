"""Run a servicer over HTTP and gRPC: in the current event loop, or in a background thread."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import grpc
from aiohttp import web

from .._generated.servicer import ServicerBase
from ..protocol.config import ProtocolConfig
from ..protocol.core import ProtocolCore
from ..protocol.stores import ChunkStore, RequestStore
from .grpc_app import start_grpc_server
from .http_app import DEFAULT_PATH, make_app
from .http_server import make_runner
from .metrics_http import MetricsListener


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class RunningServer:
    core: ProtocolCore
    host: str
    http_port: int
    grpc_port: int
    runner: web.AppRunner
    grpc_server: grpc.aio.Server | None
    metrics: MetricsListener | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    @property
    def grpc_target(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    async def close(self, grace: float = 1.0) -> None:
        self.core.start_draining()  # a body still arriving is answered 503, not cut
        if self.grpc_server is not None:
            await self.grpc_server.stop(grace)
        await self.runner.cleanup()
        if self.metrics is not None:
            await self.metrics.close()


@dataclass
class ServerHandle:
    """A started server as its starters hand it out (the fake gateway's, the on-prem server's):
    its `RunningServer`, its URLs under `prefix_path`, and whether the admin routes are on."""

    server: RunningServer
    admin: bool
    prefix_path: ClassVar[str] = DEFAULT_PATH

    @property
    def core(self) -> ProtocolCore:
        return self.server.core

    @property
    def base_url(self) -> str:
        return self.server.base_url

    @property
    def prefix_url(self) -> str:
        return self.server.base_url + self.prefix_path

    @property
    def admin_url(self) -> str:
        return self.server.base_url + "/_admin"

    @property
    def grpc_target(self) -> str:
        return self.server.grpc_target


async def start_server(
    servicer: ServicerBase,
    config: ProtocolConfig | None = None,
    *,
    host: str = "127.0.0.1",
    http_port: int = 0,
    grpc_port: int | None = 0,
    request_store: RequestStore | None = None,
    chunk_store: ChunkStore | None = None,
    configure_app: Callable[[web.Application, ProtocolCore], None] | None = None,
    grpc_interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
) -> RunningServer:
    """Serve `servicer` on HTTP (and gRPC unless `grpc_port` is None); port 0 = a free port.

    `configure_app(app, core)` may add routes and middlewares to the aiohttp app before it starts
    (the fake gateway's admin API and fault injection); `grpc_interceptors` go to the gRPC server.
    """
    config = config or ProtocolConfig()
    if grpc_port is not None and grpc_port == 0:
        grpc_port = free_port(host)
    if grpc_port is not None:
        config = dataclasses.replace(config, grpc_port=grpc_port)
    core = ProtocolCore(servicer, config, request_store=request_store, chunk_store=chunk_store)
    gserver = None
    if grpc_port is not None:
        gserver, grpc_port = await start_grpc_server(
            core, host=host, port=grpc_port, interceptors=grpc_interceptors
        )
    app = make_app(core)
    if configure_app is not None:
        configure_app(app, core)
    runner = make_runner(app, config.limits)
    await runner.setup()
    site = web.TCPSite(runner, host, http_port)
    await site.start()
    server = site._server
    sockets = getattr(server, "sockets", None) or []
    port = int(sockets[0].getsockname()[1]) if sockets else http_port
    metrics = await MetricsListener.start(core)
    return RunningServer(core, host, port, grpc_port or 0, runner, gserver, metrics)


class BackgroundServer:
    """A server in its own thread and event loop, for sync code and tests.

    with BackgroundServer(MyServicer()) as srv:
        ... srv.base_url ...
    """

    def __init__(
        self, servicer: ServicerBase, config: ProtocolConfig | None = None, **kwargs: Any
    ) -> None:
        self._args = (servicer, config)
        self._kwargs = kwargs
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, daemon=True, name="arctic-server"
        )
        self.server: RunningServer | None = None

    def start(self) -> RunningServer:
        self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(
            start_server(*self._args, **self._kwargs), self._loop
        )
        self.server = fut.result(timeout=30)
        return self.server

    def run(self, coro: Any, timeout: float = 30) -> Any:
        """Run a coroutine on the server's loop (e.g. to poke servicer state)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def stop(self) -> None:
        if self.server is not None:
            asyncio.run_coroutine_threadsafe(self.server.close(), self._loop).result(30)
            self.server = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    @property
    def base_url(self) -> str:
        assert self.server is not None
        return self.server.base_url

    def __enter__(self) -> BackgroundServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
