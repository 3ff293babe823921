"""One exchange with a server, and what its answer means, independent of the wire.

The HTTP and gRPC wires (`_core.requests`, `_core.grpc_wire`) turn an `Exchange` into bytes and
an answer into one of the replies below; the flows only ever see these.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, Union

from ..errors import ArcticError
from ..spec.model import MethodInfo
from .effects import Buffers, ConnectionFailure

if TYPE_CHECKING:
    from .capabilities import Capabilities


@dataclass(frozen=True)
class Exchange:
    """One request of a call (a JSON call, one chunk POST, a whole gRPC stream, a poll)."""

    method: MethodInfo  # the op whose route or RPC is called
    job_id: str | None = None
    path_params: Mapping[str, str] = field(default_factory=dict)  # HTTP path (job_id included)
    query: Sequence[tuple[str, str]] = ()  # HTTP query parameters
    json_body: Mapping[str, Any] | None = None  # HTTP JSON body
    message: Mapping[str, Any] | None = None  # gRPC unary message (as JSON)
    frames: Sequence[Buffers] = ()  # DSSST1 chunk frames
    idempotency_key: str | None = None
    seq: int | None = None
    sub_job_id: str | None = None
    accept_octet: bool = False
    executes: bool = True  # False for an intermediate chunk: resending it runs nothing
    respond_async: bool = False  # `Prefer: respond-async`: answer 202 at once, never hold


@dataclass(frozen=True)
class Value:
    """A direct answer (control plane, capabilities, operation fallbacks)."""

    value: Any


@dataclass(frozen=True)
class Status:
    """A `RequestStatus`; `in_place` when its result holds decoded tensors (octets, gRPC)."""

    status: Mapping[str, Any]
    in_place: bool = False


@dataclass(frozen=True)
class Submitted:
    """A 202: the request was queued; poll it."""

    request_id: str
    job_id: str | None = None


@dataclass(frozen=True)
class ChunkCached:
    """An intermediate chunk was accepted."""

    info: Mapping[str, Any]


@dataclass(frozen=True)
class Raw:
    """Raw bytes (a checkpoint file download)."""

    data: bytes


@dataclass(frozen=True)
class Refused:
    """The server answered with an error: the request did not run (PROTOCOL.md §3.3)."""

    error: ArcticError


@dataclass(frozen=True)
class Lost:
    """No answer."""

    failure: ConnectionFailure


Reply = Union[Value, Status, Submitted, ChunkCached, Raw, Refused, Lost]  # noqa: UP007


class Wire(Protocol):
    """What the flows need from a wire (`requests.HttpWire`, `grpc_wire.GrpcWire`)."""

    name: str

    def max_chunk_bytes(self, caps: Capabilities) -> int: ...

    def frames_for(self, method: MethodInfo) -> bool: ...

    def batches(self, chunks: Sequence[Buffers]) -> list[list[Buffers]]: ...

    def build(self, ex: Exchange, timeout: float | None) -> Any: ...

    def parse(self, ex: Exchange, resp: Any) -> Reply: ...
