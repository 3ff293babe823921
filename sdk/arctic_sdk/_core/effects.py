"""Effects the protocol core asks its driver to perform, and what comes back.

A flow is a generator: it yields `Send`, `Sleep` or `Progress` and is resumed with the result
(`HttpResponse` / `GrpcResponse` / `ConnectionFailure` for `Send`, None otherwise). The sync and
async drivers (`arctic_sdk.transports`) perform them; tests script them.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, Union

from ..spec.model import GrpcShape, MethodInfo

Buffers = tuple[bytes | memoryview, ...]
"""One byte string in pieces (a chunk frame: its header, then views of the payload)."""


def joined(body: bytes | memoryview | Buffers) -> bytes:
    """The pieces as one `bytes` (one copy), for movers that need contiguous bytes."""
    if isinstance(body, bytes):
        return body
    if isinstance(body, memoryview):
        return body.tobytes()
    return b"".join(body)


@dataclass(frozen=True, slots=True)
class HttpRequest:
    """One HTTP request. `op`, `path_params` and `query` repeat what `url` says, for the
    in-process transport and for logs."""

    method: str
    url: str
    headers: Mapping[str, str]
    body: bytes | Buffers | None
    op: MethodInfo
    path_params: Mapping[str, str] = field(default_factory=dict)
    query: Sequence[tuple[str, str]] = ()
    timeout: float | None = None  # this attempt's deadline in seconds


@dataclass(frozen=True, slots=True)
class HttpResponse:
    status: int
    headers: Mapping[str, str]  # lower-case names
    body: bytes

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").split(";")[0].strip().lower()


@dataclass(frozen=True, slots=True)
class GrpcRequest:
    """One gRPC call: `frames` for streaming shapes, `message` (a protobuf message of the RPC's
    request type) for unary ones."""

    path: str
    shape: GrpcShape
    metadata: tuple[tuple[str, str], ...]
    op: MethodInfo
    frames: Sequence[Buffers] = ()  # one chunk frame per stream message
    message: Any = None
    timeout: float | None = None


@dataclass(frozen=True, slots=True)
class GrpcResponse:
    code: str  # grpc.StatusCode name: "OK", "UNAVAILABLE", ...
    details: str = ""
    trailers: Mapping[str, bytes | str] = field(default_factory=dict)
    frames: Sequence[bytes] = ()
    message: Any = None  # the response message of a unary RPC


@dataclass(frozen=True, slots=True)
class ConnectionFailure:
    """No (complete) answer arrived.

    `delivered`: False when the request certainly never reached the server (connection refused,
    DNS, connect timeout); None when it may have (reset or timeout after sending).
    `mismatch`: set when the answer shows the address speaks another protocol (TLS against plain
    HTTP, HTTP/2 or gRPC against HTTP/1.1, an untrusted certificate): the mistake, in words;
    retrying cannot help.
    """

    delivered: bool | None
    reason: str
    timeout: bool = False
    mismatch: str | None = None


@dataclass(frozen=True, slots=True)
class Send:
    request: HttpRequest | GrpcRequest


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


@dataclass(frozen=True, slots=True)
class Progress:
    """A progress note: `start` a bar (`total` units of `unit`), `update` it by `n` (or set
    its description), `close` it. Drivers show bars only when attached to a terminal."""

    key: str
    event: str  # "start" | "update" | "close"
    desc: str = ""
    total: float | None = None
    n: float = 0
    unit: str = "B"


Effect = Union[Send, Sleep, Progress]  # noqa: UP007 (a runtime alias)
Answer = Union[HttpResponse, GrpcResponse, ConnectionFailure]  # noqa: UP007
T = TypeVar("T")
Flow = Generator[Effect, Any, T]
"""A protocol flow: yields effects, returns the call's result."""
