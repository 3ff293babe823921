"""The gRPC wire (PROTOCOL.md §4): `Exchange` -> `GrpcRequest`, `GrpcResponse` -> reply.

Data-plane RPCs stream request chunk frames and answer result chunk frames of the
`RequestStatus` value (tensors in place); a JSON-bodied op sends its body as a tensor-free
DSSST1 value. Control-plane RPCs carry typed messages. Errors carry the JSON error body in the
`x-arctic-error-bin` trailer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor
from google.protobuf.message import DecodeError, Message

import dssst1

from .._generated.grpc_stubs import MESSAGE_TYPES
from ..errors import ServerError
from ..spec.model import GrpcShape, MethodInfo
from ..spec.proto_json import _walk_out, json_to_message
from ..spec.tables.error_codes import ERRORS
from .capabilities import Capabilities
from .effects import Buffers, ConnectionFailure, GrpcRequest, GrpcResponse
from .errors_parse import ParsedError, parse_error, retry_after, to_exception
from .replies import Exchange, Lost, Raw, Refused, Reply, Status, Submitted, Value

ERROR_TRAILER = "x-arctic-error-bin"
REQUEST_ID_TRAILER = "x-request-id"
# gRPC status -> HTTP status (the usual gateway mapping), for errors without the trailer.
_HTTP_OF = {
    "INVALID_ARGUMENT": 400,
    "FAILED_PRECONDITION": 409,
    "OUT_OF_RANGE": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "NOT_FOUND": 404,
    "ALREADY_EXISTS": 409,
    "ABORTED": 409,
    "RESOURCE_EXHAUSTED": 413,
    "UNIMPLEMENTED": 501,
    "INTERNAL": 500,
    "UNKNOWN": 500,
    "DATA_LOSS": 500,
    "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 504,
}
# Statuses that, without an error trailer, mean the call broke in transit.
_TRANSPORT = {"UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED", "UNKNOWN", "INTERNAL"}
_NEVER_SENT = (
    "failed to connect",
    "connection refused",
    "dns resolution",
    "name resolution",
    "connect failed",
    "no address",
    "failed to pick subchannel",
)
_FRAME_SLACK = 1024  # room for the Frame message's own bytes


def message_json(msg: Message) -> dict[str, Any]:
    """A response message as the protocol's JSON (unset scalars included, like HTTP answers)."""
    obj = json_format.MessageToDict(
        msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return _walk_out(cast(Descriptor, msg.DESCRIPTOR), obj)


class GrpcWire:
    name = "grpc"

    def __init__(
        self,
        token: str | None,
        redact: Callable[[str], str],
        tensors: str = "numpy",
        max_message_bytes: int = 4 * 1024 * 1024,
    ) -> None:
        self._token = token
        self._redact = redact
        self._tensors = tensors
        self.max_message_bytes = max_message_bytes

    def max_chunk_bytes(self, caps: Capabilities) -> int:
        return min(caps.max_grpc_message_bytes, self.max_message_bytes) - _FRAME_SLACK

    def frames_for(self, method: MethodInfo) -> bool:
        return method.grpc_shape is GrpcShape.FRAMES

    @staticmethod
    def batches(chunks: Sequence[Buffers]) -> list[list[Buffers]]:
        """All chunk frames on one stream."""
        return [list(chunks)]

    # ------------------------------------------------------------------ requests

    def build(self, ex: Exchange, timeout: float | None) -> GrpcRequest:
        method = ex.method
        md: list[tuple[str, str]] = []
        if self._token:
            md.append(("authorization", f"Bearer {self._token}"))
        if ex.job_id and method.grpc_shape is GrpcShape.FRAMES:
            md.append(("x-arctic-job-id", ex.job_id))
        if ex.idempotency_key:
            md.append(("idempotency-key", ex.idempotency_key))
        if ex.seq is not None:
            md.append(("x-arctic-seq", str(ex.seq)))
        if ex.sub_job_id:
            md.append(("x-arctic-sub-job", ex.sub_job_id))
        if ex.respond_async:
            md.append(("prefer", "respond-async"))
        message = None
        if method.grpc_shape is not GrpcShape.FRAMES:
            cls = MESSAGE_TYPES[method.grpc_path][0]
            message = json_to_message(dict(ex.message or {}), cls)
        return GrpcRequest(
            path=method.grpc_path,
            shape=method.grpc_shape,
            metadata=tuple(md),
            op=method,
            frames=tuple(ex.frames),
            message=message,
            timeout=timeout,
        )

    # ------------------------------------------------------------------ answers

    def parse(self, ex: Exchange, resp: GrpcResponse | ConnectionFailure) -> Reply:
        if isinstance(resp, ConnectionFailure):
            return Lost(resp)
        method = ex.method
        if resp.code != "OK":
            return self._error(method, resp)
        if method.grpc_shape is GrpcShape.UNARY:
            msg = resp.message
            if isinstance(msg, bytes):
                cls = MESSAGE_TYPES[method.grpc_path][1]
                try:
                    msg = cls.FromString(msg)
                except DecodeError as exc:
                    return Refused(self._bad(method, f"undecodable {cls.__name__}: {exc}"))
            return Value(message_json(msg))
        try:
            asm = dssst1.ChunkAssembler("result")
            frame = None
            for chunk in resp.frames:
                frame = asm.feed(chunk)
            if frame is None:
                frame = asm.finish()
            value = dssst1.loads(frame, tensors=self._tensors)  # type: ignore[arg-type]
        except dssst1.DSSError as exc:
            return Refused(self._bad(method, f"undecodable answer frames: {exc}"))
        if method.response_type == "" and method.grpc_shape is GrpcShape.FRAMES:
            data = value.get("data") if isinstance(value, dict) else None
            return Raw(_as_bytes(data))
        if isinstance(value, dict) and "status" in value:
            return Status(value, in_place=True)
        if isinstance(value, dict) and value.get("request_id"):
            return Submitted(str(value["request_id"]), value.get("job_id"))
        return Value(value)

    def _error(self, method: MethodInfo, resp: GrpcResponse) -> Reply:
        trailer = resp.trailers.get(ERROR_TRAILER)
        rid_raw = resp.trailers.get(REQUEST_ID_TRAILER)  # the server's id of this call
        rid = rid_raw.decode() if isinstance(rid_raw, bytes) else rid_raw
        if trailer is None:
            if resp.code in _TRANSPORT:
                low = resp.details.lower()
                delivered: bool | None = False if any(s in low for s in _NEVER_SENT) else None
                return Lost(
                    ConnectionFailure(
                        delivered,
                        f"gRPC {resp.code}: {self._redact(resp.details)}",
                        timeout=resp.code == "DEADLINE_EXCEEDED",
                    )
                )
            status = _HTTP_OF.get(resp.code, 500)
            parsed = parse_error(resp.details, status)
            parsed = ParsedError(parsed.code, f"gRPC {resp.code}: {resp.details}", {}, None)
            return Refused(
                to_exception(
                    parsed,
                    status=status,
                    op=method.name,
                    request_id=rid,
                    redact=self._redact,
                    grpc_status=resp.code,
                )
            )
        raw = trailer.encode() if isinstance(trailer, str) else trailer
        parsed = parse_error(raw, _HTTP_OF.get(resp.code))
        info = ERRORS.get(parsed.code)
        http = info.http_status if info is not None else _HTTP_OF.get(resp.code)
        return Refused(
            to_exception(
                parsed,
                status=http,
                op=method.name,
                request_id=rid,
                retry_after_s=retry_after({}, parsed.details),
                redact=self._redact,
                grpc_status=resp.code,
            )
        )

    def _bad(self, method: MethodInfo, message: str) -> ServerError:
        return ServerError(self._redact(message), code="internal", op=method.name)


def _as_bytes(data: Any) -> bytes:
    if data is None:
        return b""
    if isinstance(data, bytes | bytearray | memoryview):
        return bytes(data)
    tobytes = getattr(data, "tobytes", None)
    if tobytes is not None:
        return bytes(tobytes())
    return bytes(memoryview(data))


def trailers_dict(items: Sequence[tuple[str, Any]] | Mapping[str, Any] | None) -> dict[str, Any]:
    """gRPC trailing metadata as a dict with lower-case keys."""
    if not items:
        return {}
    pairs = items.items() if isinstance(items, Mapping) else items
    return {str(k).lower(): v for k, v in pairs}
