"""The Tinker surface on a listener of its own over a protocol core of this process (tests); a
protocol server mounts the surface on its own listener with `mount.mount` instead."""

from __future__ import annotations

from aiohttp import web

from ..protocol.core import ProtocolCore
from .backend import Backend
from .routes import TinkerRoutes, add_tinker_routes
from .settings import TinkerSettings

__all__ = ["start_tinker_server"]


async def start_tinker_server(
    core: ProtocolCore,
    settings: TinkerSettings,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
) -> tuple[web.AppRunner, str, TinkerRoutes]:
    """The Tinker routes on their own listener, calling `core` in process (run it on the
    core's event loop)."""
    # the protocol's body limit (PROTOCOL.md §13), after decoding, as on our servers
    app = web.Application(client_max_size=core.config.limits.max_body_bytes + 1)
    routes = add_tinker_routes(app, Backend(core), settings)  # callers: the core's tokens
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    sock = site._server.sockets[0].getsockname()  # type: ignore[union-attr]
    return runner, f"http://{host}:{sock[1]}", routes
