"""A standalone Tinker server in front of a protocol server (tests); a protocol server mounts
the surface with `mount.mount` instead."""

from __future__ import annotations

from collections.abc import Iterable

from aiohttp import web

from ..protocol.config import ProtocolLimits
from .backend import Backend
from .routes import TinkerRoutes, add_tinker_routes
from .settings import TinkerSettings

__all__ = ["start_tinker_server"]


async def start_tinker_server(
    protocol_url: str,
    settings: TinkerSettings,
    *,
    tokens: Iterable[str] = (),
    host: str = "127.0.0.1",
    port: int = 0,
) -> tuple[web.AppRunner, str, TinkerRoutes]:
    """A standalone Tinker service in front of a protocol server at `protocol_url` (tests)."""
    # the protocol's body limit (PROTOCOL.md §13), after decoding, as on our servers
    app = web.Application(client_max_size=ProtocolLimits().max_body_bytes + 1)
    routes = add_tinker_routes(app, Backend(lambda: protocol_url), settings, tokens)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    sock = site._server.sockets[0].getsockname()  # type: ignore[union-attr]
    return runner, f"http://{host}:{sock[1]}", routes
