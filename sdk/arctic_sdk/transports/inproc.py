"""The in-process transport: a servicer object served by the protocol core in this process.

Requests take the HTTP wire's exact bytes (JSON bodies, DSSST1 chunk frames, headers) to the
same `ProtocolCore` every server runs, and answers are rendered by the same HTTP binding, so a
client behaves identically in process and over the network. The core runs on its own event loop
in a daemon thread (its asyncio state must not depend on the caller's loops).

`arctic_servers` is imported only when an in-process client is created.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib
import threading
import uuid
import weakref
from typing import Any

from .._core.effects import ConnectionFailure, HttpRequest, HttpResponse, joined
from ..config import ArcticConfig
from ._driver import lower_headers

_SERVERS: weakref.WeakValueDictionary[str, InprocServer] = weakref.WeakValueDictionary()
_LOCK = threading.Lock()
PREFIX = "http://inproc/api/v2/databases/inproc/schemas/inproc/cortex-training"


def _servers(module: str) -> Any:
    """`arctic_servers.<room>.<module>` (`protocol.core`, `serving.http_app`, ...), imported on
    first use (a separate package)."""
    return importlib.import_module(f"arctic_servers.{module}")


class InprocServer:
    """A `ProtocolCore` over `servicer`, on a private event loop thread."""

    def __init__(self, servicer: Any, protocol_config: Any = None) -> None:
        ProtocolConfig = _servers("protocol.config").ProtocolConfig
        ProtocolCore = _servers("protocol.core").ProtocolCore
        HttpBinding = _servers("serving.http_app").HttpBinding

        self.key = uuid.uuid4().hex
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, daemon=True, name="arctic-inproc"
        )
        self._thread.start()

        async def make() -> Any:
            core = ProtocolCore(servicer, protocol_config or ProtocolConfig(server="inproc"))
            if hasattr(servicer, "core"):
                servicer.core = core
            return core

        self.core = asyncio.run_coroutine_threadsafe(make(), self._loop).result(30)
        self.binding = HttpBinding(self.core)
        self._closed = False
        with _LOCK:
            _SERVERS[self.key] = self

    @staticmethod
    def lookup(key: str) -> InprocServer:
        server = _SERVERS.get(key)
        if server is None or server._closed:
            raise ConnectionError(
                f"in-process server {key} is not in this process (an inproc client re-attaches "
                "only in the process that created its server)"
            )
        return server

    async def _handle(self, request: HttpRequest) -> HttpResponse:
        IncomingCall = _servers("protocol.calls").IncomingCall
        ProtocolError = _servers("rules.errors").ProtocolError
        error_response = _servers("serving.http_app").error_response

        headers = lower_headers(request.headers)
        query: dict[str, list[str]] = {}
        for k, v in request.query:
            query.setdefault(k, []).append(v)
        call = IncomingCall(
            method=request.op,
            transport="inproc",
            headers=headers,
            path_params=dict(request.path_params),
            query=query,
            body=joined(request.body) if request.body is not None else None,
            accept_octet="application/octet-stream" in headers.get("accept", ""),
        )
        try:
            resp = self.binding.render(await self.core.handle(call), call)
        except Exception as exc:  # a servicer bug is an internal error, as over HTTP
            if not isinstance(exc, ProtocolError):
                exc = ProtocolError("internal", f"{type(exc).__name__}: {exc}")
            resp = error_response(exc)
            resp.headers["X-Request-Id"] = call.request_id
            what = f"in-process {request.op.name}"
            _servers("serving.metrics_http").log_failed(
                what, exc.http_status, exc, None, call.request_id
            )
        out = lower_headers(resp.headers)
        out["content-type"] = resp.content_type
        body = resp.body
        return HttpResponse(int(resp.status), out, bytes(body) if body is not None else b"")

    def submit(self, request: HttpRequest) -> concurrent.futures.Future[HttpResponse]:
        return asyncio.run_coroutine_threadsafe(self._handle(request), self._loop)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True

        async def drain() -> None:
            await self.core.drain()

        with contextlib.suppress(Exception):  # best effort
            asyncio.run_coroutine_threadsafe(drain(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


def server_for(config: ArcticConfig) -> tuple[InprocServer, bool]:
    """The config's server (re-attached by key) and whether this client owns it."""
    if config.inproc.servicer is not None:
        return InprocServer(config.inproc.servicer, config.inproc.protocol), True
    if config.inproc.server_key:
        return InprocServer.lookup(config.inproc.server_key), False
    raise ValueError("transport='inproc' needs servicer= (a ServicerBase instance)")


class InprocSyncIO:
    def __init__(self, server: InprocServer, owned: bool) -> None:
        self.server = server
        self._owned = owned

    def send(self, request: HttpRequest) -> HttpResponse | ConnectionFailure:
        fut = self.server.submit(request)
        try:
            return fut.result(request.timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            return ConnectionFailure(None, "in-process call timed out", timeout=True)

    def close(self) -> None:
        if self._owned:
            self.server.close()


class InprocAsyncIO:
    def __init__(self, server: InprocServer, owned: bool) -> None:
        self.server = server
        self._owned = owned

    async def send(self, request: HttpRequest) -> HttpResponse | ConnectionFailure:
        fut = asyncio.wrap_future(self.server.submit(request))
        try:
            return await asyncio.wait_for(fut, request.timeout)
        except TimeoutError:
            return ConnectionFailure(None, "in-process call timed out", timeout=True)

    async def close(self) -> None:
        if self._owned:
            await asyncio.to_thread(self.server.close)
