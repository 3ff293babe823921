"""`mount`: the on-prem server's and the gateway's one call to serve Tinker beside the protocol.

Without the `tinker` package (the `[tinker]` extra) the routes under `/api/v1/` answer 501
with a JSON body saying so, instead of the surface.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Iterable
from typing import Any

from aiohttp import web

__all__ = ["mount"]

log = logging.getLogger("arctic_servers.tinker")
MISSING = (
    "this server's Tinker-compatible surface needs the tinker package: "
    "pip install 'arctic-sdk[tinker]' (tinker==0.38.0) and restart it"
)


def mount(
    app: web.Application,
    settings: Any = None,
    *,
    tokens: Iterable[str] = (),
    token_sha256: Iterable[str] = (),
) -> Any:
    """Serve Tinker's `/api/v1/...` on `app` (its protocol calls go to the same listener, with
    the caller's token); the `TinkerRoutes`, or None when the tinker package is missing."""
    if importlib.util.find_spec("tinker") is None:

        async def missing(request: web.Request) -> web.Response:
            return web.json_response({"detail": MISSING, "code": "unimplemented"}, status=501)

        app.router.add_route("*", "/api/v1/{tail:.*}", missing)
        log.info("Tinker routes not served: %s", MISSING)
        return None
    from .ops import TinkerSettings
    from .serve import install

    return install(app, settings or TinkerSettings(), tokens, token_sha256)
