"""What the hostile-input runner sends with: raw HTTP (requests and sockets), raw gRPC frames,
hand-built DSSST1 frames, and the check that an answer is a spec refusal.

No SDK on purpose: the SDK checks bodies before sending (the same checker as the servers), so
it would never deliver most of these inputs.
"""

from __future__ import annotations

import json
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import grpc
import requests

import dssst1
from arctic_sdk.spec.model import MethodInfo
from arctic_sdk.spec.pb.arctic.v1 import dssst1_pb2
from arctic_sdk.spec.tables import methods as M
from arctic_sdk.spec.tables.error_codes import ERRORS

OCTET = "application/octet-stream"
ERROR_TRAILER = "x-arctic-error-bin"
TERMINAL = ("completed", "failed", "cancelled")


@dataclass
class Answer:
    """One answer: an HTTP status (or a gRPC status name) and its error body, if any."""

    status: int | str
    body: Any
    transport: str = "http"

    @property
    def code(self) -> str | None:
        err = self.body.get("error") if isinstance(self.body, dict) else None
        return str(err.get("code")) if isinstance(err, dict) else None

    def refusal(self) -> str:
        """'' when this is a 4xx (gRPC: a non-server status) with the spec's error body and a
        code of errors.proto; otherwise what is wrong."""
        err = self.body.get("error") if isinstance(self.body, dict) else None
        if self.transport == "http":
            assert isinstance(self.status, int)
            if not 400 <= self.status < 500:
                return f"HTTP {self.status}, not a 4xx"
        elif self.status in ("INTERNAL", "UNKNOWN", "OK", "DATA_LOSS"):
            return f"gRPC {self.status}, not a refusal of the input"
        if not isinstance(err, dict) or not {"code", "message", "details"} <= set(err):
            return f"{self.status} without the spec's error body: {str(self.body)[:120]!r}"
        if err["code"] not in ERRORS:
            return f"{self.status} with code {err['code']!r}, not a code of errors.proto"
        if self.transport == "http" and ERRORS[err["code"]].http_status != self.status:
            return f"HTTP {self.status} but {err['code']} is HTTP {ERRORS[err['code']].http_status}"
        return ""


def path_of(method: MethodInfo, **params: str) -> str:
    """The route with path parameters percent-encoded (every `/` and `.` of an id too)."""
    path = method.http_path
    for k, v in params.items():
        path = path.replace("{" + k + "}", quote(v, safe="").replace(".", "%2E"))
    return path


class Http:
    def __init__(self, prefix_url: str, token: str | None, timeout: float = 120) -> None:
        self.prefix = prefix_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.s = requests.Session()
        parts = urlsplit(self.prefix)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.path = parts.path

    def headers(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        h: dict[str, Any] = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        h.update(extra or {})
        return h

    def send(
        self,
        verb: str,
        path: str,
        *,
        headers: dict[str, Any] | None = None,
        data: bytes | str | None = None,
        json_body: Any = None,
        base: str | None = None,
    ) -> Answer:
        kw: dict[str, Any] = {"headers": self.headers(headers), "timeout": self.timeout}
        if json_body is not None:
            kw["json"] = json_body
        elif data is not None:
            kw["data"] = data
        try:
            r = self.s.request(verb, (base or self.prefix) + path, **kw)
        except requests.ConnectionError:  # a connection an earlier attack left broken
            self.s = requests.Session()
            r = self.s.request(verb, (base or self.prefix) + path, **kw)
        try:
            body: Any = r.json()
        except ValueError:
            body = r.text[:300]
        return Answer(r.status_code, body)

    def call(
        self,
        method: MethodInfo,
        body: Any = None,
        *,
        job: str = "",
        headers: dict[str, Any] | None = None,
        **params: str,
    ) -> Answer:
        return self.send(
            method.http_method,
            path_of(method, job_id=job, **params),
            headers=headers,
            json_body=body,
        )

    def frame(
        self, method: MethodInfo, job: str, frame: bytes, headers: dict[str, Any] | None = None
    ) -> Answer:
        """A DSSST1 body as a one-chunk group."""
        chunk = bytes(
            dssst1.encode_chunks(frame, kind="request", operation=method.name, max_bytes=1 << 30)[0]
        )
        h = {"Content-Type": OCTET, **(headers or {})}
        return self.send("POST", path_of(method, job_id=job), headers=h, data=chunk)

    def wait(self, job: str, ans: Answer, timeout: float = 600) -> Answer:
        """The terminal RequestStatus of an accepted data-plane call."""
        deadline = time.monotonic() + timeout
        while isinstance(ans.body, dict) and ans.body.get("status") not in TERMINAL:
            if ans.status not in (200, 202) or time.monotonic() > deadline:
                return ans
            time.sleep(0.1)
            ans = self.call(M.GET_REQUEST, job=job, request_id=str(ans.body["request_id"]))
        return ans

    def raw(self, data: bytes, wait: float = 5.0) -> tuple[bytes, float]:
        """Send bytes on a fresh connection; everything read until it closes (or `wait` s of
        silence) and how long the connection stayed open."""
        t0 = time.monotonic()
        with socket.create_connection((self.host, self.port), timeout=wait) as s:
            s.sendall(data)
            out = b""
            try:
                while chunk := s.recv(65536):
                    out += chunk
            except OSError:
                pass
        return out, time.monotonic() - t0


def http_answer(raw: bytes) -> Answer:
    """The status and JSON body of a raw HTTP answer."""
    head, _, rest = raw.partition(b"\r\n\r\n")
    try:
        status = int(head.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return Answer(0, raw[:200])
    try:
        body: Any = json.loads(rest)
    except ValueError:
        body = rest[:200]
    return Answer(status, body)


class Grpc:
    def __init__(self, target: str, token: str | None) -> None:
        self.channel = grpc.insecure_channel(target)
        self.token = token

    def md(self, job: str, **extra: str) -> list[tuple[str, str]]:
        out = [("authorization", f"Bearer {self.token}")] if self.token else []
        return [*out, ("x-arctic-job-id", job), *extra.items()]

    def frames(
        self,
        method: MethodInfo,
        job: str,
        value: Any = None,
        *,
        frame: bytes | None = None,
        md: dict[str, str] | None = None,
    ) -> Answer:
        stub = self.channel.stream_stream(
            method.grpc_path,
            request_serializer=dssst1_pb2.Frame.SerializeToString,
            response_deserializer=dssst1_pb2.Frame.FromString,
        )
        frame = frame if frame is not None else bytes(dssst1.dumps(value))
        chunks = dssst1.encode_chunks(
            frame,
            kind="request",
            operation=method.name,
            chunk_group_id=str(uuid.uuid4()),
            max_bytes=3 << 20,
        )
        try:
            out = [
                f.dssst1
                for f in stub(
                    iter([dssst1_pb2.Frame(dssst1=bytes(c)) for c in chunks]),
                    metadata=self.md(job, **(md or {})),
                    timeout=120,
                )
            ]
        except grpc.RpcError as exc:
            body = None
            for k, v in exc.trailing_metadata() or ():
                if k == ERROR_TRAILER:
                    body = json.loads(v)
            return Answer(exc.code().name, body, "grpc")
        value = dssst1.loads(dssst1.decode_chunks(out)) if out else None
        return Answer("OK", value, "grpc")

    def close(self) -> None:
        self.channel.close()


def with_header_text(frame: bytes, old: bytes, new: bytes) -> bytes:
    """`frame` with `old` replaced by `new` in its JSON header (lengths and padding redone):
    a way to send a header that no writer produces (a lone surrogate escape in a tree key)."""
    n = int.from_bytes(frame[:8], "little")
    header = frame[8 : 8 + n].rstrip(b" ").replace(old, new)
    header += b" " * (-len(header) % 8)
    return len(header).to_bytes(8, "little") + header + frame[8 + n :]
