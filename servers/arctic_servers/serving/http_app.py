"""The HTTP binding (PROTOCOL.md §3) on aiohttp.web, over the protocol core.

Routes come from the generated route table; this module only converts aiohttp requests into
`IncomingCall`s and `Outcome`s into responses, and turns every failure into the spec's error body.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

import dssst1
from arctic_sdk.spec.model import BodyKind, MethodInfo
from arctic_sdk.spec.tables.error_codes import ERRORS

from .._generated.http_routes import add_routes
from ..protocol.core import IncomingCall, Outcome, ProtocolCore
from ..protocol.results import status_json, status_value, submit_json
from ..rules.errors import ProtocolError
from . import metrics_http
from .metrics_http import REQUEST_ID_HEADER, note_error, request_id_of

log = logging.getLogger("arctic_servers.http")

DEFAULT_PREFIX = "/api/v2/databases/{db}/schemas/{schema}/{endpoint}"
# the prefix a server prints and its launchers use: the SDK's default database, schema and
# endpoint (`arctic_sdk.config`); any db / schema / endpoint is served
DEFAULT_PATH = "/api/v2/databases/arctic/schemas/public/cortex-training"
CORE_KEY = web.AppKey("arctic_core", ProtocolCore)
_BROKEN = web.RequestKey("arctic_body_broken", bool)  # its body could not be read
OCTET = "application/octet-stream"


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def json_response(
    body: Any, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    text = json.dumps(body, default=_json_default, allow_nan=False)
    return web.Response(text=text, status=status, content_type="application/json", headers=headers)


def error_response(exc: ProtocolError) -> web.Response:
    headers = {}
    retry_after = exc.details.get("retry_after_s")
    if exc.http_status in (429, 503) and retry_after is not None:
        headers["Retry-After"] = str(max(0, int(retry_after)))
    return json_response(exc.body(), exc.http_status, headers)


@web.middleware
async def error_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Every failure becomes `{"error": {...}}` with the table's status; never a bare 500."""
    resp = await _answer_errors(request, handler)
    if request.get(_BROKEN):  # answer, then close at once (no lingering read of the body)
        resp.force_close()
        await resp.prepare(request)
        await resp.write_eof()
        request.protocol.force_close()
    elif request.can_read_body and not request.content.is_eof():
        resp.force_close()  # the body was not read to its end: say so (Connection: close)
    return resp


async def _answer_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except ProtocolError as exc:
        note_error(request, exc)  # for the failed call's log line
        return error_response(exc)
    except web.HTTPRequestEntityTooLarge as exc:
        return _refused(
            request, ProtocolError("body_too_large", f"request body exceeds the limit: {exc.text}")
        )
    except web.HTTPNotFound:
        return _refused(
            request, ProtocolError("not_found", f"no route {request.method} {request.path}")
        )
    except web.HTTPMethodNotAllowed as exc:
        return _refused(
            request,
            ProtocolError(
                "method_not_allowed",
                f"{request.method} is not allowed on {request.path}; allowed: "
                f"{', '.join(sorted(exc.allowed_methods))}",
            ),
        )
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _refused(request, _http_error(exc))
    except Exception as exc:
        log.exception(
            "unhandled error on %s %s (request %s)",
            request.method,
            request.path,
            request_id_of(request),
        )
        return error_response(ProtocolError("internal", f"{type(exc).__name__}: {exc}"))


def _refused(request: web.Request, exc: ProtocolError) -> web.Response:
    note_error(request, exc)
    return error_response(exc)


def _http_error(exc: web.HTTPException) -> ProtocolError:
    """An aiohttp HTTP error raised below the routes, as the spec's code of its status."""
    code = next((c for c, e in ERRORS.items() if e.http_status == exc.status), None)
    if code is None:
        code = "internal" if exc.status >= 500 else "invalid_argument"
    return ProtocolError(code, f"{exc.status} {exc.reason}: {exc.text or ''}".strip())


_PRODUCED = frozenset({"*/*", "application/*", "application/json", OCTET})


def _check_accept(accept: str) -> None:
    """406 when `Accept` names only encodings this server never produces (PROTOCOL.md §3.3)."""
    ranges = [r.split(";", 1)[0].strip().lower() for r in accept.split(",") if r.strip()]
    if ranges and not _PRODUCED.intersection(ranges):
        raise ProtocolError(
            "not_acceptable",
            f"Accept {accept!r} names nothing this server produces; it answers application/json "
            f"and {OCTET}",
            expected=sorted(_PRODUCED),
        )


class HttpBinding:
    def __init__(self, core: ProtocolCore) -> None:
        self.core = core

    async def handle(self, method: MethodInfo, request: web.Request) -> web.StreamResponse:
        _check_accept(request.headers.get("Accept", ""))
        body = await self._read_body(method, request)
        headers = {k.lower(): v for k, v in request.headers.items()}
        call = IncomingCall(
            method=method,
            transport="http",
            headers=headers,
            path_params={k: v for k, v in request.match_info.items() if k in method.path_params},
            query={k: request.query.getall(k) for k in request.query},
            body=body,
            accept_octet=OCTET in headers.get("accept", ""),
            request_id=request_id_of(request),
        )
        outcome = await self.core.handle(call)
        return self.render(outcome, call)

    async def _read_body(self, method: MethodInfo, request: web.Request) -> bytes | None:
        if not request.can_read_body:
            return None
        ctype = request.content_type
        dssst1_types = (OCTET, "application/x-dssst1")
        if (
            method.body is BodyKind.DSSST1
            and ctype not in dssst1_types
            and (request.headers.get("Content-Type"))
        ):
            raise ProtocolError(
                "unsupported_media_type",
                f"{method.name} takes {OCTET} (DSSST1), got Content-Type {ctype!r}",
                expected=OCTET,
            )
        if method.body is BodyKind.JSON and ctype == OCTET:
            raise ProtocolError(
                "unsupported_media_type",
                f"{method.name} takes application/json, got Content-Type {ctype!r}",
                expected="application/json",
            )
        limit = self.core.config.limits.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise ProtocolError(
                "body_too_large",
                f"request body of {request.content_length} bytes exceeds max_body_bytes {limit}",
                limit=limit,
            )
        return await self._read_within_limits(request)

    async def _read_within_limits(self, request: web.Request) -> bytes:
        """The body, read within `body_read_timeout_seconds` (else 408 `request_timeout`) and
        given up when the server starts draining (503 `unavailable`: it will not finish)."""
        timeout = self.core.config.limits.body_read_timeout_seconds
        read = asyncio.ensure_future(request.read())
        drain = asyncio.ensure_future(self.core.drain_event().wait())
        try:
            done, _ = await asyncio.wait(
                {read, drain}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            drain.cancel()
        if read in done:
            try:
                return read.result()
            except RequestPayloadError as exc:
                request[_BROKEN] = True  # the connection closes after this answer
                request.content.feed_eof()  # nothing left to read (aiohttp would log the error)
                raise ProtocolError(
                    "invalid_argument",
                    f"the request body could not be read: {exc}".replace("\n", " "),
                    field="body",
                    http_error=type(exc).__name__,
                    expected="a body in its declared Content-Length / Content-Encoding",
                ) from None
        read.cancel()
        request[_BROKEN] = True  # a slow or cut-off body: answer and close the connection
        if self.core.draining:
            raise ProtocolError(
                "unavailable",
                f"{self.core.config.server} is shutting down and will not finish this request "
                "(its body was still arriving); retry against the restarted server",
                retry_after_s=2,
            )
        raise ProtocolError(
            "request_timeout",
            f"the request body did not arrive within {timeout:g} s (body_read_timeout_seconds)",
            limit=timeout,
        )

    def render(self, outcome: Outcome, call: IncomingCall) -> web.StreamResponse:
        rid = {REQUEST_ID_HEADER: outcome.request_id(call)}
        if outcome.raw is not None:
            return web.Response(body=outcome.raw, content_type=OCTET, headers=rid)
        if outcome.record is None:
            return json_response(outcome.value, outcome.http_status, rid)
        headers = {"X-Arctic-Request-Id": outcome.record.request_id, **rid}
        if outcome.http_status == 202:
            return json_response(submit_json(outcome), 202, headers)
        if call.accept_octet and self.core.config.octet_results:
            frame = dssst1.dumps(status_value(outcome))
            return web.Response(body=frame, content_type=OCTET, headers=headers)
        return json_response(status_json(self.core, outcome), 200, headers)


def make_app(core: ProtocolCore, *, prefix: str = DEFAULT_PREFIX) -> web.Application:
    """An aiohttp application serving every route of the spec under `prefix`."""
    limits = core.config.limits
    app = web.Application(middlewares=[error_middleware], client_max_size=limits.max_body_bytes + 1)
    binding = HttpBinding(core)
    add_routes(app.router, prefix, binding.handle)
    metrics_http.install(app, core)  # X-Request-Id, failure log lines, /metrics
    app[CORE_KEY] = core
    return app
