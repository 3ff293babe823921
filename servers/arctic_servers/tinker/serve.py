"""Mounting the Tinker routes on a protocol server's app, or serving them standalone."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from aiohttp import web

from ..protocol.config import ProtocolLimits
from .backend import Backend
from .ops import TinkerSettings
from .routes import TinkerRoutes, add_tinker_routes

__all__ = ["install", "start_tinker_server"]


def install(
    app: web.Application,
    settings: TinkerSettings,
    tokens: Iterable[str] = (),
    token_sha256: Iterable[str] = (),
) -> TinkerRoutes:
    """Mount the Tinker routes on a protocol server's app; their protocol calls go to this same
    listener (the address the first Tinker request came in on), with the caller's token."""
    url: dict[str, str] = {}
    routes = add_tinker_routes(app, Backend(lambda: url["base"]), settings, tokens, token_sha256)

    @web.middleware
    async def learn_address(request: web.Request, handler: Any) -> Any:
        if "base" not in url and request.path.startswith("/api/v1/"):
            sock = request.transport.get_extra_info("sockname") if request.transport else None
            if sock:
                host = sock[0] if ":" not in sock[0] else f"[{sock[0]}]"
                url["base"] = f"http://{host}:{sock[1]}"
        return await handler(request)

    app.middlewares.append(learn_address)

    async def close(_: web.Application) -> None:
        await routes.ops.backend.close()

    app.on_cleanup.append(close)
    return routes


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
