"""What every server's HTTP app does around its routes: `X-Request-Id` on every answer, a log
line for every failed call, the HTTP metrics, and the `/metrics` route (and its own listener).

- Request ids: each HTTP request gets the server's id (`request_id_of`), which the protocol
  binding hands to the core (`IncomingCall.request_id`). Every answer — protocol, OpenAI,
  Tinker, admin, a 404 of an unknown route, an error of any kind — carries `X-Request-Id`: the
  recorded request's id where the answer is about one (the same as `X-Arctic-Request-Id`), else
  this call's. An answer with status >= 400 is logged with it (INFO for 4xx, WARNING for 5xx),
  with the error's code and message when the answer is the spec's error body.
- `/metrics` (Prometheus text format, `ServerMetrics.exposition`) follows the server's auth: a
  server without tokens serves it to anyone; a server with tokens only to an operator token
  (`ProtocolConfig.metrics_token_sha256`, `--metrics-token-file`), never to a tenant's token.
  `--metrics-port` serves it, without auth, on a listener of its own (`MetricsListener`)
  for a network the operator controls (`--metrics-host`, default 127.0.0.1).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ..protocol.config import ProtocolConfig, token_digest
from ..rules.errors import ProtocolError
from ..rules.limits import bearer_token

if TYPE_CHECKING:
    from ..protocol.core import ProtocolCore

log = logging.getLogger("arctic_servers.http")

__all__ = [
    "METRICS_PATH",
    "REQUEST_ID_HEADER",
    "MetricsListener",
    "install",
    "log_failed",
    "note_error",
    "request_id_of",
]

METRICS_PATH = "/metrics"
REQUEST_ID_HEADER = "X-Request-Id"
_ID = web.RequestKey("arctic_request_id", str)
_STARTED = web.RequestKey("arctic_started", float)
_ERROR = web.RequestKey("arctic_error", ProtocolError)


def request_id_of(request: web.Request) -> str:
    """The server's id of this HTTP request (made on first use)."""
    rid = request.get(_ID)
    if rid is None:
        rid = request[_ID] = uuid.uuid4().hex
    return rid


def note_error(request: web.Request, exc: ProtocolError) -> None:
    """The error an answer carries, for its log line."""
    request[_ERROR] = exc


def _route(request: web.Request) -> str:
    resource = getattr(request.match_info.route, "resource", None)
    return resource.canonical if resource is not None else "unmatched"


@web.middleware
async def _timing(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    request[_STARTED] = time.perf_counter()
    request_id_of(request)
    return await handler(request)


def _prepare_hook(
    core: ProtocolCore,
) -> Callable[[web.Request, web.StreamResponse], Awaitable[None]]:
    async def stamp(request: web.Request, response: web.StreamResponse) -> None:
        if REQUEST_ID_HEADER not in response.headers:
            response.headers[REQUEST_ID_HEADER] = request_id_of(request)
        rid = response.headers[REQUEST_ID_HEADER]
        status = response.status
        started = request.get(_STARTED)
        took = time.perf_counter() - started if started is not None else 0.0
        core.metrics.http_done(_route(request), request.method, status, took)
        if status >= 400:
            exc = request.get(_ERROR)
            log_failed(f"{request.method} {request.path}", status, exc, response.reason, rid)

    return stamp


def log_failed(
    what: str, status: int, exc: ProtocolError | None, reason: str | None, request_id: str
) -> None:
    """The log line of a failed call (every transport): INFO for 4xx, WARNING for 5xx."""
    text = f"[{exc.code}] {exc.message}" if exc is not None else (reason or "")
    level = logging.WARNING if status >= 500 else logging.INFO
    log.log(level, "%s answered %d %s (request %s)", what, status, text, request_id)


def _authorize(config: ProtocolConfig, request: web.Request) -> None:
    if not (config.tokens or config.token_sha256):
        return  # a server without auth serves /metrics to anyone, as every other route
    token = bearer_token(request.headers.get("Authorization", ""))
    if not config.metrics_token_sha256:
        raise ProtocolError(
            "unauthenticated",
            "this server has tokens and no operator token for /metrics: start it with "
            "--metrics-token-file (then scrape with that token), or serve /metrics on its own "
            "listener with --metrics-port",
        )
    if not token or token_digest(token) not in config.metrics_token_sha256:
        raise ProtocolError(
            "unauthenticated", "/metrics needs the operator token (--metrics-token-file)"
        )


def _metrics_handler(core: ProtocolCore, *, auth: bool) -> Callable[[web.Request], Any]:
    async def metrics(request: web.Request) -> web.Response:
        if auth:
            _authorize(core.config, request)
        body, content_type = core.metrics.exposition(request.headers.get("Accept", ""))
        return web.Response(body=body, headers={"Content-Type": content_type})

    return metrics


def install(app: web.Application, core: ProtocolCore, *, auth: bool = True) -> None:
    """Request ids, failure log lines and HTTP metrics on every answer of `app`, and its
    `/metrics` route (under the server's auth unless `auth=False`)."""
    app.middlewares.insert(0, _timing)
    app.on_response_prepare.append(_prepare_hook(core))
    app.router.add_get(METRICS_PATH, _metrics_handler(core, auth=auth))


@dataclass
class MetricsListener:
    """`/metrics` alone, without auth, on a listener of its own (`ProtocolConfig.metrics_port`)."""

    runner: web.AppRunner
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}{METRICS_PATH}"

    @classmethod
    async def start(cls, core: ProtocolCore) -> MetricsListener | None:
        """The listener `core.config` asks for (None when it asks for none)."""
        from .http_app import error_middleware
        from .http_server import make_runner

        c = core.config
        if c.metrics_port is None:
            return None
        app = web.Application(middlewares=[error_middleware])
        install(app, core, auth=False)
        runner = make_runner(app, c.limits, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, c.metrics_host, c.metrics_port)
        await site.start()
        sockets = getattr(site._server, "sockets", None) or []
        port = int(sockets[0].getsockname()[1]) if sockets else c.metrics_port
        log.info("metrics: http://%s:%d%s (no auth)", c.metrics_host, port, METRICS_PATH)
        return cls(runner, c.metrics_host, port)

    async def close(self) -> None:
        await self.runner.cleanup()
