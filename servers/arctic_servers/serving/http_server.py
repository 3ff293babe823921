"""The aiohttp listener of every server: the spec's error body for what aiohttp refuses itself,
read timeouts for slow clients, and a shutdown bounded by the drain timeout (PROTOCOL.md §13).

- aiohttp's HTTP parser refuses malformed requests (oversized or invalid headers, duplicate or
  bad `Content-Length`, `Content-Length` with `Transfer-Encoding`, bad chunked encoding, control
  characters) before any route runs, with a plain-text 400. `SpecRequestHandler.handle_error`
  answers them with `{"error": {"code": "invalid_argument", ...}}` instead (`details.http_error`
  names aiohttp's exception), and closes the connection as aiohttp does.
- Headers: a connection must deliver a request's headers within `header_read_timeout_seconds`
  of opening (or of its previous answer, when kept alive), else it is closed: aiohttp's
  keep-alive timer, which only fires while no request is being handled, is set to that value.
  The body deadline (`body_read_timeout_seconds`, 408 `request_timeout`) is the binding's
  (`http_app.HttpBinding`).
- `make_runner(..., shutdown_timeout=)`: how long a stopping server waits for handlers still
  running after the drain (aiohttp's default is 60 s).
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

from aiohttp import web, web_protocol
from aiohttp.web_request import BaseRequest

from ..protocol.config import ProtocolLimits
from ..rules.errors import ProtocolError

log = logging.getLogger("arctic_servers.http")

__all__ = ["SpecRequestHandler", "make_runner"]


def parser_error(status: int, exc: BaseException | None, message: str | None) -> ProtocolError:
    """The spec's error for a request aiohttp refused (status 400) or failed on (500)."""
    if status >= 500:
        return ProtocolError("internal", f"{type(exc).__name__ if exc else 'error'}: {message}")
    text = str(getattr(exc, "message", None) or message or "malformed request").strip()
    text = " ".join(text.split())  # aiohttp's messages span lines
    text = text if len(text) <= 200 else text[:197] + "..."
    return ProtocolError(
        "invalid_argument",
        f"the HTTP request is malformed: {text}",
        field="http",
        http_error=type(exc).__name__ if exc is not None else "BadHttpMessage",
        expected="an HTTP/1.1 request (RFC 9112)",
    )


class SpecRequestHandler(web_protocol.RequestHandler):
    """aiohttp's connection handler, answering its own refusals with the spec's error body."""

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:
            raise ConnectionError("an answer is already being sent; cannot send an error")
        err = parser_error(status, exc, message)
        rid = uuid.uuid4().hex  # no route ran: the id of this answer alone
        log.info("refused a malformed request: %s [%s] %s (request %s)", err.http_status,
                 err.code, err.message, rid)  # fmt: skip
        resp = web.Response(
            text=json.dumps(err.body()),
            status=err.http_status,
            content_type="application/json",
            headers={"X-Request-Id": rid},
        )
        resp.force_close()
        return resp


class _SpecServer(web.Server):
    def __call__(self) -> web_protocol.RequestHandler:
        return SpecRequestHandler(self, loop=self._loop, **self._kwargs)


class _SpecAppRunner(web.AppRunner):
    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _SpecServer  # the same server; only its connection handler differs
        return server


def make_runner(
    app: web.Application, limits: ProtocolLimits, *, shutdown_timeout: float = 5.0, **kw: Any
) -> web.AppRunner:
    """The runner every server starts its HTTP listener with."""
    return _SpecAppRunner(
        app,
        access_log=None,
        keepalive_timeout=limits.header_read_timeout_seconds,
        # after an early answer (408, 413, 503) the rest of a body is read and dropped for at
        # most this long before the connection closes (aiohttp's default: 10 s)
        lingering_time=min(2.0, limits.header_read_timeout_seconds),
        shutdown_timeout=shutdown_timeout,
        **kw,
    )
