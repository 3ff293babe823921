"""Chunk descriptors and the chunk writer (`proto/DSSST1.md` §8).

A frame larger than one transport message travels as a chunk group: chunk ``i`` is a normal frame
of ``{"payload": frame[i*S : min((i+1)*S, size)]}`` whose ``op`` metadata holds a descriptor under
``request_chunk`` or ``result_chunk``. This module writes chunk groups and parses descriptors;
`dssst1._assembler` puts groups back together.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from ._errors import DSSError, ErrorCode, got_type, got_value
from ._format import (
    CHUNK_PAYLOAD_KEY,
    DEFAULT_LIMITS,
    REQUEST_CHUNK_KEY,
    RESULT_CHUNK_KEY,
    Limits,
)
from ._header import as_buffer, parse_metadata
from ._writer import EncodedFrame, frame_header

__all__ = [
    "ChunkDescriptor",
    "ChunkKind",
    "descriptor_key",
    "encode_chunks",
    "iter_chunks",
    "parse_descriptor",
    "read_chunk_descriptor",
    "same_operation",
]

ChunkKind = Literal["request", "result"]

_KEYS: dict[str, str] = {"request": REQUEST_CHUNK_KEY, "result": RESULT_CHUNK_KEY}
_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
_CRC32 = re.compile(r"[0-9a-fA-F]{8}")
_OPERATION_ALIASES = {"fwd-bwd": "forward-backward"}
_PAYLOAD_TREE = ["d", [[CHUNK_PAYLOAD_KEY, ["t", CHUNK_PAYLOAD_KEY]]]]


@dataclass(frozen=True, slots=True)
class ChunkDescriptor:
    """One chunk's descriptor (``arctic.v1.ChunkDescriptor``)."""

    kind: ChunkKind  #: ``"request"`` or ``"result"`` (which ``op`` key held it)
    chunk_idx: int  #: 0-based index of this chunk
    total_chunks: int  #: chunks in the group, >= 1
    frame_sha256: str  #: lowercase hex SHA-256 of the whole frame
    frame_size_bytes: int  #: length of the whole frame
    chunk_group_id: str | None = None  #: caller-chosen group identity (requests)
    operation: str | None = None  #: op the frame is for (requests)
    payload_crc32: str | None = None  #: CRC-32 of this chunk's payload, 8 lowercase hex digits

    def to_json(self) -> dict[str, Any]:
        """The descriptor object as it appears in ``op`` metadata."""
        out: dict[str, Any] = {
            "chunk_idx": self.chunk_idx,
            "total_chunks": self.total_chunks,
            "frame_sha256": self.frame_sha256,
            "frame_size_bytes": self.frame_size_bytes,
        }
        if self.chunk_group_id is not None:
            out["chunk_group_id"] = self.chunk_group_id
        if self.operation is not None:
            out["operation"] = self.operation
        if self.payload_crc32 is not None:
            out["payload_crc32"] = self.payload_crc32
        return out


def same_operation(a: str | None, b: str | None) -> bool:
    """Whether two ``operation`` labels name the same op (``fwd-bwd`` is ``forward-backward``)."""
    if a is None or b is None:
        return a is b
    return _OPERATION_ALIASES.get(a, a) == _OPERATION_ALIASES.get(b, b)


def _field_int(desc: dict[str, Any], key: str, where: str, minimum: int) -> int:
    value = desc.get(key)
    if type(value) is not int or value < minimum:
        got = "nothing" if key not in desc else got_value(value)
        raise DSSError(
            ErrorCode.CHUNK_DESCRIPTOR_INVALID, f"{where}.{key}", f"an integer >= {minimum}", got
        )
    return value


def _field_str(desc: dict[str, Any], key: str, where: str, pattern: re.Pattern[str] | None) -> Any:
    value = desc.get(key)
    if value is None:
        return None
    if type(value) is not str or (pattern is not None and not pattern.fullmatch(value)):
        expected = "a string" if pattern is None else f"a string matching {pattern.pattern}"
        raise DSSError(
            ErrorCode.CHUNK_DESCRIPTOR_INVALID, f"{where}.{key}", expected, got_value(value)
        )
    return value


def _lower(text: str | None) -> str | None:
    return None if text is None else text.lower()


def parse_descriptor(op: dict[str, Any], kind: ChunkKind | None) -> ChunkDescriptor | None:
    """The chunk descriptor of a frame's ``op`` metadata, or ``None`` when it has none.

    Raises ``chunk_kind_mismatch`` when only the other kind's descriptor is present and
    ``chunk_descriptor_invalid`` when the descriptor is malformed (or both kinds are present).
    """
    has_request, has_result = REQUEST_CHUNK_KEY in op, RESULT_CHUNK_KEY in op
    if not has_request and not has_result:
        return None
    if has_request and has_result:
        raise DSSError(
            ErrorCode.CHUNK_DESCRIPTOR_INVALID,
            "op",
            "one of request_chunk and result_chunk",
            "both",
        )
    found: ChunkKind = "request" if has_request else "result"
    if kind is not None and found != kind:
        raise DSSError(
            ErrorCode.CHUNK_KIND_MISMATCH,
            f"op.{_KEYS[found]}",
            f"a {kind} chunk",
            f"a {found} chunk",
        )
    where = f"op.{_KEYS[found]}"
    desc = op[_KEYS[found]]
    if type(desc) is not dict:
        raise DSSError(
            ErrorCode.CHUNK_DESCRIPTOR_INVALID, where, "a descriptor object", got_type(desc)
        )
    total = _field_int(desc, "total_chunks", where, 1)
    index = _field_int(desc, "chunk_idx", where, 0)
    if index >= total:
        raise DSSError(
            ErrorCode.CHUNK_DESCRIPTOR_INVALID,
            f"{where}.chunk_idx",
            f"an index in [0, {total})",
            str(index),
        )
    size = _field_int(desc, "frame_size_bytes", where, 0)
    sha = desc.get("frame_sha256")
    if type(sha) is not str or not _SHA256.fullmatch(sha):
        raise DSSError(
            ErrorCode.CHUNK_DESCRIPTOR_INVALID,
            f"{where}.frame_sha256",
            "64 hex digits",
            "nothing" if sha is None else got_value(sha),
        )
    return ChunkDescriptor(
        kind=found,
        chunk_idx=index,
        total_chunks=total,
        frame_sha256=sha.lower(),  # hex is compared case-insensitively; writers emit lowercase
        frame_size_bytes=size,
        chunk_group_id=_field_str(desc, "chunk_group_id", where, None),
        operation=_field_str(desc, "operation", where, None),
        payload_crc32=_lower(_field_str(desc, "payload_crc32", where, _CRC32)),
    )


def read_chunk_descriptor(data: object, *, limits: Limits | None = None) -> ChunkDescriptor | None:
    """The chunk descriptor of a frame, or ``None`` for a frame that is not a chunk frame.

    Runs the header checks R1-R9 only (cheap: servers route a chunk to its group with it before
    feeding the group's `ChunkAssembler`, which runs every check).
    """
    _, op = parse_metadata(as_buffer(data), DEFAULT_LIMITS if limits is None else limits)
    return parse_descriptor(op, None)


def _chunk_header(desc: dict[str, Any], kind: ChunkKind, nbytes: int, limits: Limits) -> bytes:
    op_text = json.dumps({_KEYS[kind]: desc}, separators=(",", ":"))
    layout = [(CHUNK_PAYLOAD_KEY, "U8", [nbytes], nbytes)]
    return frame_header(layout, _PAYLOAD_TREE, op_text, limits)


def _chunk_frame(
    desc: dict[str, Any], kind: ChunkKind, payload: memoryview, limits: Limits
) -> EncodedFrame:
    head = _chunk_header(desc, kind, payload.nbytes, limits)
    return EncodedFrame(head, (payload,), len(head) + payload.nbytes)


def iter_chunks(
    frame: object,
    *,
    kind: ChunkKind,
    max_bytes: int,
    operation: str | None = None,
    chunk_group_id: str | None = None,
    checksum: bool = False,
    limits: Limits | None = None,
) -> Iterator[EncodedFrame]:
    """Split ``frame`` into chunk frames of at most ``max_bytes`` bytes each, lazily.

    Always produces chunk frames, even a single one. Each `EncodedFrame` holds its header bytes
    and a view of ``frame`` (no payload copy); ``frame`` must stay unchanged until all are sent.

    Args:
        frame: the DSSST1 frame to split (bytes-like; it is not parsed).
        kind: ``"request"`` (client to server) or ``"result"`` (server to client).
        max_bytes: the largest chunk frame the peer accepts (e.g. ``Limits.GRPC_CHUNK_BYTES``).
        operation: the op name, for request chunks.
        chunk_group_id: the group identity; a new UUID for requests when ``None``.
        checksum: add ``payload_crc32`` (only for peers advertising ``chunk_checksum``).
        limits: ``max_chunks`` bounds the group size (DSSST1.md §7 defaults if ``None``).

    Raises:
        DSSError: ``chunk_too_large`` when ``max_bytes`` cannot hold one chunk frame,
            ``too_many_chunks`` past ``limits.max_chunks``, ``frame_too_short`` for an empty
            frame, ``chunk_kind_mismatch`` for an unknown kind, ``chunk_descriptor_invalid`` for a
            non-string ``operation`` or ``chunk_group_id``.
    """
    lim = DEFAULT_LIMITS if limits is None else limits
    if kind not in _KEYS:
        raise DSSError(ErrorCode.CHUNK_KIND_MISMATCH, "kind", '"request" or "result"', repr(kind))
    for name, value in (("operation", operation), ("chunk_group_id", chunk_group_id)):
        if value is not None and type(value) is not str:
            raise DSSError(ErrorCode.CHUNK_DESCRIPTOR_INVALID, name, "a string", got_type(value))
    data = as_buffer(frame)
    size = data.nbytes
    if size == 0:
        raise DSSError(ErrorCode.FRAME_TOO_SHORT, "frame", "a non-empty frame", "0 bytes")
    if chunk_group_id is None and kind == "request":
        chunk_group_id = str(uuid.uuid4())
    base: dict[str, Any] = {
        "chunk_idx": 0,
        "total_chunks": 1,
        "frame_sha256": hashlib.sha256(data).hexdigest(),
        "frame_size_bytes": size,
    }
    if chunk_group_id is not None:
        base["chunk_group_id"] = chunk_group_id
    if operation is not None:
        base["operation"] = operation
    step, total = _payload_size(base, kind, size, max_bytes, checksum, lim)
    for index in range(total):
        payload = data[index * step : min((index + 1) * step, size)]
        desc = dict(base, chunk_idx=index, total_chunks=total)
        if checksum:
            desc["payload_crc32"] = f"{zlib.crc32(payload):08x}"
        yield _chunk_frame(desc, kind, payload, lim)


def _payload_size(
    base: dict[str, Any], kind: ChunkKind, size: int, max_bytes: int, checksum: bool, limits: Limits
) -> tuple[int, int]:
    """The payload size S and chunk count: the largest S whose biggest chunk frame fits."""
    if type(max_bytes) is not int or max_bytes < 1:
        raise DSSError(ErrorCode.CHUNK_TOO_LARGE, "max_bytes", "a positive int", repr(max_bytes))
    step = max_bytes
    while True:
        total = -(-size // step)
        # The largest header: the last index, a full payload, and a CRC when asked for.
        desc = dict(base, chunk_idx=total - 1, total_chunks=total)
        if checksum:
            desc["payload_crc32"] = "0" * 8
        overhead = len(_chunk_header(desc, kind, step, limits))
        if overhead + step <= max_bytes:
            break
        step = max_bytes - overhead
        if step < 1:
            raise DSSError(
                ErrorCode.CHUNK_TOO_LARGE,
                "max_bytes",
                "room for one chunk frame header and at least one payload byte",
                str(max_bytes),
            )
    if total > limits.max_chunks:
        raise DSSError(
            ErrorCode.TOO_MANY_CHUNKS,
            "max_bytes",
            f"at most {limits.max_chunks} chunks",
            f"{total} chunks of {step} bytes",
        )
    return step, total


def encode_chunks(
    frame: object,
    *,
    kind: ChunkKind,
    max_bytes: int,
    operation: str | None = None,
    chunk_group_id: str | None = None,
    checksum: bool = False,
    limits: Limits | None = None,
) -> list[bytes]:
    """`iter_chunks` as a list of ``bytes`` chunk frames (each payload copied once)."""
    return [
        part.tobytes()
        for part in iter_chunks(
            frame,
            kind=kind,
            max_bytes=max_bytes,
            operation=operation,
            chunk_group_id=chunk_group_id,
            checksum=checksum,
            limits=limits,
        )
    ]


def descriptor_key(kind: ChunkKind) -> str:
    """The ``op`` key of a chunk kind's descriptor."""
    return _KEYS[kind]
