"""The HTTP transport of the runner: plain `requests` (and `http.client` for declared lengths).

Routes come from the method table (`http_method`, `http_path`, path parameters); a chunk group is
POSTed one chunk frame per request (PROTOCOL.md §3.5). Nothing of the SDK is used.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import urllib.parse
from collections.abc import Mapping
from typing import Any

import requests

import dssst1

from .openai_wire import join_stream
from .values import summarize
from .wire import JSON_TYPE, OCTET, Call, Reply, describe_body, redact

HEADER_NAMES = {
    "authorization": "Authorization",
    "idempotency-key": "Idempotency-Key",
    "x-arctic-seq": "X-Arctic-Seq",
    "x-arctic-sub-job": "X-Arctic-Sub-Job",
}
TOKEN_TYPE = ("X-Snowflake-Authorization-Token-Type", "PROGRAMMATIC_ACCESS_TOKEN")


class HttpWire:
    name = "http"

    def __init__(self, prefix_url: str, *, timeout: float = 60.0) -> None:
        self.prefix = prefix_url.rstrip("/")
        self.timeout = timeout
        self._local = threading.local()  # one requests.Session per thread (background calls)
        self._sessions: list[requests.Session] = []
        self._lock = threading.Lock()

    @property
    def session(self) -> requests.Session:
        session: requests.Session | None = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            self._local.session = session
            with self._lock:
                self._sessions.append(session)
        return session

    def close(self) -> None:
        with self._lock:
            for session in self._sessions:
                session.close()
            self._sessions.clear()

    # ------------------------------------------------------------------ addressing

    def url(self, call: Call) -> str:
        if call.http_path is not None:
            path = call.http_path
            if path.startswith("//"):
                parts = urllib.parse.urlsplit(self.prefix)
                return f"{parts.scheme}://{parts.netloc}{path[1:]}"
            return self.prefix + path
        assert call.method is not None
        path = call.method.http_path
        values = dict(call.params)
        if call.job_id is not None:
            values["job_id"] = call.job_id
        for name in call.method.path_params:
            path = path.replace("{" + name + "}", urllib.parse.quote(values.get(name, ""), safe=""))
        return self.prefix + path

    def verb(self, call: Call) -> str:
        if call.http_method is not None:
            return call.http_method
        assert call.method is not None
        return call.method.http_method

    def headers(self, call: Call) -> dict[str, str]:
        out: dict[str, str] = {}
        for key, value in call.headers.items():
            out[HEADER_NAMES.get(key.lower(), key)] = str(value)
        if out.get("Authorization"):
            out[TOKEN_TYPE[0]] = TOKEN_TYPE[1]
        if call.accept:
            out["Accept"] = call.accept
        return out

    # ------------------------------------------------------------------ sending

    def send(self, call: Call) -> list[Reply]:
        """Send a call: one request, or one request per chunk frame (stopping at an answer that
        is not `chunk_cached`)."""
        if call.socket_bytes is not None:
            return [self._socket(call)]
        if call.content_length is not None:
            return [self._declared_length(call)]
        if call.frames is None:
            if call.raw_body is not None:
                return [self._request(call, call.raw_body, call.content_type or OCTET)]
            if call.has_json:
                text = json.dumps(call.json_body).encode()
                return [self._request(call, text, call.content_type or JSON_TYPE)]
            return [self._request(call, None, call.content_type)]
        replies = []
        for i, frame in enumerate(call.frames):
            reply = self._request(call, frame, call.content_type or OCTET)
            if len(call.frames) > 1:
                reply.sent += f" [frame {i + 1} of {len(call.frames)}: {len(frame)} bytes]"
            replies.append(reply)
            if not is_chunk_cached(reply):
                break
        return replies

    def _request(self, call: Call, body: bytes | None, ctype: str | None) -> Reply:
        url = self.url(call)
        headers = self.headers(call)
        if ctype is not None:
            headers["Content-Type"] = ctype
        params = _query(call.query)
        shown = f"{self.verb(call)} {url}"
        if params:
            shown += "?" + urllib.parse.urlencode(params, doseq=True)
        sent = f"{shown} headers={redact(headers)} body={describe_body(call)}"
        reply = Reply("http", sent=sent)
        try:
            resp = self.session.request(
                self.verb(call),
                url,
                params=params,
                data=body,
                headers=headers,
                timeout=call.timeout or self.timeout,
            )
        except requests.RequestException as exc:
            reply.transport_error = f"{type(exc).__name__}: {exc}"
            return reply
        reply.status = resp.status_code
        reply.headers = {k.lower(): v for k, v in resp.headers.items()}
        parse_body(reply, resp.content, reply.headers.get("content-type", ""))
        return reply

    def _declared_length(self, call: Call) -> Reply:
        """Send only headers declaring `content_length` bytes; a conforming server refuses
        before reading the body (PROTOCOL.md §4.4: "before the server buffers the excess")."""
        url = urllib.parse.urlsplit(self.url(call))
        headers = self.headers(call)
        headers["Content-Type"] = call.content_type or OCTET
        headers["Content-Length"] = str(call.content_length)
        sent = f"{self.verb(call)} {url.geturl()} headers={redact(headers)} (body not sent)"
        reply = Reply("http", sent=sent)
        conn = http.client.HTTPConnection(
            url.hostname or "127.0.0.1", url.port or 80, timeout=min(call.timeout, 15.0)
        )
        try:
            conn.putrequest(self.verb(call), url.path + (f"?{url.query}" if url.query else ""))
            for k, v in headers.items():
                conn.putheader(k, v)
            conn.endheaders()
            resp = conn.getresponse()
            reply.status = resp.status
            reply.headers = {k.lower(): v for k, v in resp.getheaders()}
            parse_body(reply, resp.read(), reply.headers.get("content-type", ""))
        except (OSError, http.client.HTTPException) as exc:
            reply.transport_error = (
                f"{type(exc).__name__}: {exc} (the server did not answer before the body was sent)"
            )
        finally:
            conn.close()
        return reply

    def _socket(self, call: Call) -> Reply:
        """Send `call.socket_bytes` as they are (malformed HTTP a client library would never
        write) on a fresh connection; the answer read until the server closes it."""
        assert call.socket_bytes is not None
        url = urllib.parse.urlsplit(self.prefix)
        shown = call.socket_bytes[:120]
        reply = Reply("http", sent=f"raw bytes on a socket: {shown!r}")
        data = b""
        try:
            with socket.create_connection(
                (url.hostname or "127.0.0.1", url.port or 80), timeout=min(call.timeout, 15.0)
            ) as sock:
                sock.sendall(call.socket_bytes)
                while chunk := sock.recv(65536):
                    data += chunk
        except OSError as exc:
            if not data:
                reply.transport_error = f"{type(exc).__name__}: {exc}"
                return reply
        head, _, content = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        try:
            reply.status = int(lines[0].split(" ", 2)[1])
        except (IndexError, ValueError):
            reply.transport_error = f"not an HTTP answer: {data[:80]!r}"
            return reply
        reply.headers = {
            k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])
        }
        if reply.headers.get("transfer-encoding", "").lower() == "chunked":
            content = _unchunk(content)
        parse_body(reply, content, reply.headers.get("content-type", ""))
        return reply


def _unchunk(data: bytes) -> bytes:
    out, pos = b"", 0
    while True:
        end = data.find(b"\r\n", pos)
        size = int(data[pos:end].split(b";")[0] or b"0", 16) if end >= 0 else 0
        if size == 0:
            return out
        out += data[end + 2 : end + 2 + size]
        pos = end + 2 + size + 2


def _query(query: Mapping[str, Any]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for key, value in query.items():
        for v in value if isinstance(value, list) else [value]:
            out.append((key, str(v).lower() if isinstance(v, bool) else str(v)))
    return out


def parse_body(reply: Reply, content: bytes, ctype: str) -> None:
    """Fill `reply.body` from a JSON, DSSST1 or raw answer body."""
    if not content:
        reply.body = None
        reply.received = "(empty body)"
        return
    if "text/event-stream" in ctype:  # an OpenAI stream: the events joined (openai_wire)
        reply.body, reply.decode_error = join_stream(content)
        reply.received = summarize(reply.body)
        return
    if "json" in ctype or (content[:1] in (b"{", b"[") and OCTET not in ctype):
        try:
            reply.body = json.loads(content)
        except ValueError as exc:
            reply.body = content
            reply.decode_error = f"the body is not JSON ({exc}): {content[:80]!r}"
        reply.received = summarize(reply.body)
        return
    if OCTET in ctype:
        try:
            reply.body = dssst1.loads(content)
        except dssst1.DSSError:
            reply.body = content  # raw bytes (a checkpoint file)
        reply.received = summarize(reply.body)
        return
    reply.body = content
    reply.received = f"{ctype or 'no Content-Type'}: {content[:120]!r}"


def is_chunk_cached(reply: Reply) -> bool:
    return (
        not reply.is_error
        and isinstance(reply.body, Mapping)
        and reply.body.get("chunk_cached") is True
    )
