"""HTTP byte movers: `requests` for the sync client, `aiohttp` for the async client.

They send an `HttpRequest` and return an `HttpResponse`, or a `ConnectionFailure` saying whether
the request may have reached the server; nothing else. The async mover keeps one aiohttp session
per event loop and closes it when that loop shuts down (so `asyncio.run(client.step())` in a
loop leaks nothing) or when the client closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import re
import ssl
import threading
import weakref
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import aiohttp.payload
import requests
from requests.adapters import HTTPAdapter
from urllib3.exceptions import NewConnectionError

from .._core.effects import Buffers, ConnectionFailure, HttpRequest, HttpResponse, joined
from ..config import ArcticConfig
from ._driver import lower_headers


class RequestsIO:
    """Blocking HTTP over one `requests.Session` (thread-safe connection pool)."""

    def __init__(self, config: ArcticConfig) -> None:
        self._config = config
        self._session: requests.Session | None = None
        self._lock = threading.Lock()
        self._finalizer: weakref.finalize[Any, Any] | None = None

    def _get(self) -> requests.Session:
        session = self._session
        if session is None:
            with self._lock:
                if self._session is None:
                    s = requests.Session()
                    size = max(10, self._config.max_in_flight)
                    adapter = HTTPAdapter(pool_connections=4, pool_maxsize=size, max_retries=0)
                    s.mount("http://", adapter)
                    s.mount("https://", adapter)
                    s.verify = self._config.cortex.verify_ssl
                    s.trust_env = False
                    self._finalizer = weakref.finalize(self, s.close)
                    self._session = s
                session = self._session
        assert session is not None
        return session

    def send(self, request: HttpRequest) -> HttpResponse | ConnectionFailure:
        session = self._get()
        connect = self._config.connect_timeout
        if request.timeout is not None:  # a short call (a cancel) connects within its time too
            connect = min(connect, request.timeout)
        timeout = (connect, request.timeout)
        try:
            r = session.request(
                request.method,
                request.url,
                headers=dict(request.headers),
                data=_bytes(request.body),
                timeout=timeout,
                allow_redirects=False,
            )
            return HttpResponse(r.status_code, lower_headers(r.headers), r.content)
        except requests.exceptions.ConnectTimeout as exc:
            return ConnectionFailure(False, f"connect timeout: {_short(exc)}", timeout=True)
        except requests.exceptions.ReadTimeout as exc:
            return ConnectionFailure(None, f"read timeout: {_short(exc)}", timeout=True)
        except requests.exceptions.ConnectionError as exc:
            return ConnectionFailure(
                False if _never_connected(exc) else None,
                f"connection error: {_short(exc)}",
                mismatch=protocol_mismatch(exc),
            )
        except requests.exceptions.RequestException as exc:
            return ConnectionFailure(None, f"{type(exc).__name__}: {_short(exc)}")

    def close(self) -> None:
        with self._lock:
            session, self._session = self._session, None
            if self._finalizer is not None:
                self._finalizer.detach()
                self._finalizer = None
        if session is not None:
            session.close()


def _bytes(body: bytes | Buffers | None) -> bytes | None:
    return None if body is None else joined(body)


def _never_connected(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, NewConnectionError | ConnectionRefusedError):
            return True
        reason = getattr(seen, "reason", None)
        if isinstance(reason, BaseException):
            seen = reason
            continue
        args = getattr(seen, "args", ())
        nested = next((a for a in args if isinstance(a, BaseException)), None)
        seen = nested or seen.__cause__ or seen.__context__
    return False


def _chain(exc: BaseException) -> list[BaseException]:
    """`exc` and what it wraps (urllib3 and aiohttp nest the OS's error several levels deep)."""
    out: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and len(out) < 8 and seen not in out:
        out.append(seen)
        inner = getattr(seen, "reason", None) or getattr(seen, "os_error", None)
        if not isinstance(inner, BaseException):
            args = getattr(seen, "args", ())
            inner = next((a for a in args if isinstance(a, BaseException)), None)
        seen = inner or seen.__cause__ or seen.__context__
    return out


def protocol_mismatch(exc: BaseException) -> str | None:
    """The mistake, in words, when `exc` shows the address speaks another protocol than the
    client (retrying cannot help); None for an ordinary connection failure."""
    chain = _chain(exc)
    tls = [e for e in chain if isinstance(e, ssl.SSLError)]
    if tls:
        err = tls[-1]  # the OS's own error, not a wrapper
        why = getattr(err, "verify_message", None) or getattr(err, "reason", None) or err
        if isinstance(err, ssl.SSLCertVerificationError):
            return (
                f"its TLS certificate is not trusted ({why}): fix the certificate or the CA "
                "bundle, or pass verify_ssl=False for a test server"
            )
        return (
            f"the TLS handshake failed ({why}): the server does not speak TLS on this port; "
            "use http:// for a plain HTTP server"
        )
    for e in chain:
        text = str(e)
        if (
            isinstance(e, http.client.BadStatusLine)
            and not isinstance(e, http.client.RemoteDisconnected)
        ) or "Bad status line" in text:
            # an HTTP/2 SETTINGS frame (shown raw by http.client, escaped by aiohttp)
            h2 = text.startswith("\x00") or re.search(r"\\+x00\\+x00", text) is not None
            return (
                "it answered HTTP/2 (a gRPC port?), not HTTP/1.1: use the server's HTTP URL, or "
                "transport='grpc' with grpc_target='host:port' for its gRPC port"
                if h2
                else "it did not answer HTTP (bad status line): is this the server's HTTP port?"
            )
    return None


def _short(exc: BaseException) -> str:
    text = str(exc)
    return text if len(text) <= 300 else text[:297] + "..."


_SLICE = 1 << 20


class _Body(aiohttp.payload.Payload):
    """A body in pieces, written in 1 MiB slices of each (no copy, flow-controlled)."""

    _autoclose = True

    def __init__(self, parts: Buffers, content_type: str) -> None:
        super().__init__(parts, content_type=content_type)
        self._parts = [memoryview(p).cast("B") for p in parts]
        self._total = sum(p.nbytes for p in self._parts)
        self._size = self._total

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return b"".join(self._parts).decode(encoding, errors)

    async def write(self, writer: Any) -> None:
        await self.write_with_length(writer, None)

    async def write_with_length(self, writer: Any, content_length: int | None) -> None:
        left = self._total
        if content_length is not None:
            left = content_length
        for part in self._parts:
            for start in range(0, part.nbytes, _SLICE):
                piece = part[start : start + min(_SLICE, left)]
                if not piece.nbytes:
                    return
                await writer.write(piece)
                left -= piece.nbytes


def _payload(request: HttpRequest) -> Any:
    body = request.body
    if body is None or isinstance(body, bytes):
        return body if body is None or len(body) <= _SLICE else _Body((body,), _ctype(request))
    if sum(len(p) for p in body) <= _SLICE:
        return joined(body)
    return _Body(body, _ctype(request))


def _ctype(request: HttpRequest) -> str:
    return request.headers.get("Content-Type", "application/octet-stream")


class _LoopSession:
    """An aiohttp session bound to one event loop, closed when that loop shuts down."""

    def __init__(self, session: aiohttp.ClientSession, loop: asyncio.AbstractEventLoop) -> None:
        self.session = session
        self.loop = loop
        self.keeper: AsyncIterator[None] | None = None

    @staticmethod
    async def _keep(session: aiohttp.ClientSession) -> AsyncIterator[None]:
        # asyncio.run() finalizes live async generators before closing its loop
        # (loop.shutdown_asyncgens), which runs this `finally` inside that loop.
        try:
            yield
        finally:
            await session.close()

    async def start(self) -> None:
        self.keeper = self._keep(self.session)
        await self.keeper.__anext__()

    async def close(self) -> None:
        if self.keeper is not None:
            keeper, self.keeper = self.keeper, None
            await keeper.aclose()  # type: ignore[attr-defined]
        elif not self.session.closed:
            await self.session.close()

    def abandon(self) -> None:
        """Close without the (closed) loop: drop the connector's sockets, mark closed."""
        if self.session.closed:
            return
        with contextlib.suppress(Exception):  # best effort on a dead loop
            connector = self.session.connector
            if connector is not None:
                connector._close()
        self.session._connector = None


class AiohttpIO:
    """Asyncio HTTP with one aiohttp session per event loop."""

    def __init__(self, config: ArcticConfig) -> None:
        self._config = config
        self._sessions: dict[int, _LoopSession] = {}
        self._lock = threading.Lock()

    async def _get(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        entry = self._sessions.get(id(loop))
        if entry is not None and entry.loop is loop and not entry.session.closed:
            return entry.session
        self._forget_dead()
        connector = aiohttp.TCPConnector(
            limit=max(100, 2 * self._config.max_in_flight),
            ssl=bool(self._config.cortex.verify_ssl),
        )
        session = aiohttp.ClientSession(
            connector=connector,
            auto_decompress=False,
            trust_env=False,
            timeout=aiohttp.ClientTimeout(total=None),
        )
        entry = _LoopSession(session, loop)
        await entry.start()
        with self._lock:
            self._sessions[id(loop)] = entry
        return session

    def _forget_dead(self) -> None:
        with self._lock:
            for key, entry in list(self._sessions.items()):
                if entry.loop.is_closed() or entry.session.closed:
                    entry.abandon()
                    del self._sessions[key]

    async def send(self, request: HttpRequest) -> HttpResponse | ConnectionFailure:
        session = await self._get()
        timeout = aiohttp.ClientTimeout(total=request.timeout, connect=self._config.connect_timeout)
        try:
            async with session.request(
                request.method,
                request.url,
                headers=dict(request.headers),
                data=_payload(request),
                timeout=timeout,
                allow_redirects=False,
            ) as r:
                body = await r.read()
                return HttpResponse(r.status, lower_headers(r.headers), body)
        except aiohttp.ConnectionTimeoutError as exc:
            return ConnectionFailure(False, f"connect timeout: {_short(exc)}", timeout=True)
        except aiohttp.ClientConnectorError as exc:
            return ConnectionFailure(
                False, f"cannot connect: {_short(exc)}", mismatch=protocol_mismatch(exc)
            )
        except TimeoutError as exc:
            return ConnectionFailure(None, f"timeout: {_short(exc) or 'no answer'}", timeout=True)
        except aiohttp.ClientError as exc:
            return ConnectionFailure(
                None, f"{type(exc).__name__}: {_short(exc)}", mismatch=protocol_mismatch(exc)
            )

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        with self._lock:
            entries = list(self._sessions.values())
            self._sessions.clear()
        for entry in entries:
            if entry.loop is loop:
                await entry.close()
            elif not entry.loop.is_closed() and entry.loop.is_running():
                fut = asyncio.run_coroutine_threadsafe(entry.close(), entry.loop)
                await asyncio.wrap_future(fut)
            else:
                entry.abandon()
