"""Transports: the same protocol core over HTTP, gRPC or in process, each sync and async.

Choosing one is configuration (`ArcticConfig.transport`); a user script runs unchanged on all
three. `make_sync_transport` / `make_async_transport` build the transport a client uses.
"""

from __future__ import annotations

from .._core.grpc_wire import GrpcWire
from .._core.requests import HttpWire
from .._core.state import make_redactor
from .._urls import no_server
from ..config import ArcticConfig, InprocConfig
from ._driver import AsyncTransport, SyncTransport

__all__ = ["AsyncTransport", "SyncTransport", "make_async_transport", "make_sync_transport"]


def _wire(config: ArcticConfig, prefix: str | None = None) -> HttpWire | GrpcWire:
    redact = make_redactor(config.token())
    if config.transport == "grpc":
        if not config.grpc.target and config.cortex.base() is None:
            raise no_server("grpc")
        return GrpcWire(config.token(), redact, config.tensors, config.grpc.max_message_bytes)
    return HttpWire(prefix or config.cortex.prefix_url(), config.token(), redact, config.tensors)


def _inproc(config: ArcticConfig) -> tuple[ArcticConfig, object, bool]:
    from .inproc import server_for

    server, owned = server_for(config)
    effective = config.model_copy(update={"inproc": InprocConfig(server_key=server.key)})
    return effective, server, owned


def make_sync_transport(
    config: ArcticConfig, *, seq_start: dict[str, int] | None = None
) -> SyncTransport:
    if config.transport == "inproc":
        from .inproc import PREFIX, InprocServer, InprocSyncIO

        config, server, owned = _inproc(config)
        assert isinstance(server, InprocServer)
        return SyncTransport(
            config, InprocSyncIO(server, owned), _wire(config, PREFIX), seq_start=seq_start
        )
    if config.transport == "grpc":
        from .grpc import GrpcSyncIO

        return SyncTransport(config, GrpcSyncIO(config), _wire(config), seq_start=seq_start)
    from .http import RequestsIO

    return SyncTransport(config, RequestsIO(config), _wire(config), seq_start=seq_start)


def make_async_transport(
    config: ArcticConfig, *, seq_start: dict[str, int] | None = None
) -> AsyncTransport:
    if config.transport == "inproc":
        from .inproc import PREFIX, InprocAsyncIO, InprocServer

        config, server, owned = _inproc(config)
        assert isinstance(server, InprocServer)
        return AsyncTransport(
            config, InprocAsyncIO(server, owned), _wire(config, PREFIX), seq_start=seq_start
        )
    if config.transport == "grpc":
        from .grpc import GrpcAsyncIO

        return AsyncTransport(config, GrpcAsyncIO(config), _wire(config), seq_start=seq_start)
    from .http import AiohttpIO

    return AsyncTransport(config, AiohttpIO(config), _wire(config), seq_start=seq_start)
