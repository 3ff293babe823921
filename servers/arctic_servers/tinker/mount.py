"""`mount`: the on-prem server's and the gateway's one call to serve Tinker beside the protocol.

The paths (`route_table.ROUTES`) are registered at start; the surface itself (`TinkerRoutes`,
which imports the `tinker` package and, through it, torch: about 3 s of CPU) is built on the
first Tinker request, off the event loop, so a server that no Tinker client calls starts
without it. Its protocol calls go to the app's protocol core in this process (`backend.py`,
`protocol/inproc.py`), with the caller's token. Without the `tinker` package (the `[tinker]`
extra) the routes under `/api/v1/` answer 404 `unimplemented` naming the extra: a status the
SDK does not retry (it retries every 5xx for 300 s), so a client fails at its first call, in
seconds.

The server's models (`catalog.py`) also serve their tokenizer files under `/hf/`
(`hf_files.py`), so `get_tokenizer()` works by the server's model names.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ..protocol.core import ProtocolCore
from ..protocol.inproc import CoreCalls
from ..serving.http_app import CORE_KEY
from .auth import NO_TOKEN, caller_token
from .catalog import Catalog
from .hf_files import add_hf_routes
from .route_table import ROUTES, Handler, P
from .settings import TinkerSettings

if TYPE_CHECKING:
    from .routes import TinkerRoutes

__all__ = ["LazyTinker", "mount"]

log = logging.getLogger("arctic_servers.tinker")
MISSING = (
    "this server's Tinker-compatible surface is not installed: it needs the tinker package, "
    "the [tinker] extra: pip install 'arctic-sdk[tinker]' (tinker==0.38.0) and restart it"
)


class LazyTinker:
    """The Tinker surface of one app, built once, on its first request."""

    def __init__(
        self,
        settings: TinkerSettings,
        core: ProtocolCore,
    ) -> None:
        self.settings, self.core = settings, core
        self.routes: TinkerRoutes | None = None
        self._handlers: dict[int, Callable[[web.Request], Any]] = {}
        self._lock = asyncio.Lock()

    async def get(self, request: web.Request) -> TinkerRoutes:
        if self.routes is None:
            async with self._lock:
                if self.routes is None:
                    self.routes = await asyncio.to_thread(self._build)
        return self.routes

    def _build(self) -> TinkerRoutes:
        from .backend import Backend
        from .routes import TinkerRoutes

        log.info("Tinker surface built on its first request")
        backend = Backend(self.core)
        return TinkerRoutes(backend, self.settings)

    def handler(self, index: int, pick: Callable[[TinkerRoutes], Handler]) -> Any:
        async def serve(request: web.Request) -> web.StreamResponse:
            fn = self._handlers.get(index)
            if fn is None:
                try:
                    routes = await self.get(request)
                except Exception as exc:  # a broken install: said, not a bare 500; tried again
                    log.exception("the Tinker surface could not be built")
                    detail = f"this server's Tinker surface could not be built: {exc}"
                    return web.json_response({"detail": detail, "code": "unavailable"}, status=503)
                fn = self._handlers[index] = routes.wrap(pick(routes))
            return await fn(request)  # type: ignore[no-any-return]

        return serve

    async def close(self, _: web.Application) -> None:
        if self.routes is not None:
            await self.routes.close()


def mount(
    app: web.Application,
    settings: TinkerSettings | None = None,
    *,
    catalog: Catalog | None = None,
    state_path: str | None = None,
    core: ProtocolCore | None = None,
) -> LazyTinker | None:
    """Serve Tinker's `/api/v1/...` on `app` over its protocol core (`core`, default the one
    `make_app` put on `app`), and `/hf/` for `catalog`'s models, the models the server's engines
    serve (`catalog.py`), keeping its state in `state_path` (`store.py`); the `LazyTinker` (its
    `routes` once a Tinker request came), or None when the tinker package is missing."""
    if importlib.util.find_spec("tinker") is None:

        async def missing(request: web.Request) -> web.Response:
            # 404, not 501: the SDK retries every 5xx for 300 s before it gives up
            return web.json_response(
                {"detail": MISSING, "code": "unimplemented", "extra": "tinker"}, status=404
            )

        app.router.add_route("*", P + "/{tail:.*}", missing)
        log.info("Tinker routes not served: %s", MISSING)
        return None
    settings = settings or TinkerSettings()
    if catalog is not None:
        settings = dataclasses.replace(settings, catalog=catalog)
    if state_path is not None and settings.state_path is None:  # the server's data directory
        settings = dataclasses.replace(settings, state_path=state_path)
    core = core or app[CORE_KEY]
    lazy = LazyTinker(settings, core)
    for index, (method, path, pick) in enumerate(ROUTES):
        app.router.add_route(method, P + path, lazy.handler(index, pick))
    if settings.catalog is not None:
        authenticate = CoreCalls(core).authenticate  # the core's tokens, the core's rule
        add_hf_routes(
            app, settings.catalog, lambda r: caller_token(r.headers, authenticate) is not NO_TOKEN
        )
    app.on_cleanup.append(lazy.close)
    return lazy
