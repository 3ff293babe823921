"""Base64 envelopes for JSON transports (`proto/DSSST1.md` §9, ``arctic.v1.InlineEnvelope``).

A small result travels inline in a poll response as an `inline_envelope`; a large one as
`result_chunk_event` objects, one per result chunk frame, which `assemble_result_events` (or a
`ChunkAssembler` fed with `decode_result_chunk_event`) puts back together.

Decoding is strict: standard base64 alphabet with padding, no whitespace or other characters.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Iterable, Mapping
from typing import Any

from ._assembler import ChunkAssembler
from ._errors import DSSError, ErrorCode, got_type, got_value
from ._format import VERSION, Limits
from ._header import as_buffer

__all__ = [
    "assemble_result_events",
    "decode_inline_envelope",
    "decode_result_chunk_event",
    "inline_envelope",
    "result_chunk_event",
]

_CONTENT_TYPE = "application/octet-stream"
_SHA256_HEX = re.compile(r"[0-9a-fA-F]{64}")
RESULT_CHUNK_TYPE = "result_chunk"


def _b64encode(data: object) -> str:
    return base64.b64encode(as_buffer(data)).decode("ascii")


def _b64decode(envelope: Mapping[str, Any], where: str) -> bytes:
    text = envelope.get("payload_b64")
    if type(text) is not str:
        got = "nothing" if text is None else got_type(text)
        raise DSSError(ErrorCode.BASE64_INVALID, f"{where}.payload_b64", "a base64 string", got)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise DSSError(
            ErrorCode.BASE64_INVALID,
            f"{where}.payload_b64",
            "standard base64 with padding",
            str(exc),
        ) from exc


def _mapping(envelope: object, where: str) -> Mapping[str, Any]:
    if not isinstance(envelope, Mapping):
        raise DSSError(ErrorCode.BASE64_INVALID, where, "a JSON object", got_type(envelope))
    return envelope


def inline_envelope(frame: object) -> dict[str, str]:
    """The inline JSON envelope of one frame."""
    return {
        "content_type": _CONTENT_TYPE,
        "encoding": "base64",
        "wire_format": VERSION,
        "payload_b64": _b64encode(frame),
    }


def decode_inline_envelope(envelope: object) -> bytes:
    """The frame bytes of an inline envelope.

    Raises:
        DSSError: ``unsupported_version`` when ``wire_format`` is not ``"DSSST1"``;
            ``base64_invalid`` when the object, its ``encoding`` or its ``payload_b64`` is not
            what §9 says.
    """
    env = _mapping(envelope, "envelope")
    wire_format = env.get("wire_format")
    if wire_format != VERSION:
        raise DSSError(
            ErrorCode.UNSUPPORTED_VERSION,
            "envelope.wire_format",
            repr(VERSION),
            got_value(wire_format),
        )
    encoding = env.get("encoding")
    if encoding != "base64":
        raise DSSError(
            ErrorCode.BASE64_INVALID, "envelope.encoding", '"base64"', got_value(encoding)
        )
    return _b64decode(env, "envelope")


def result_chunk_event(chunk: object) -> dict[str, str]:
    """The poll event that carries one result chunk frame."""
    data = as_buffer(chunk)
    return {
        "type": RESULT_CHUNK_TYPE,
        "payload_b64": _b64encode(data),
        "payload_sha256": hashlib.sha256(data).hexdigest(),
    }


def decode_result_chunk_event(event: object) -> bytes:
    """The chunk frame of a ``result_chunk`` event, its ``payload_sha256`` verified when present.

    Raises:
        DSSError: ``chunk_descriptor_invalid`` when ``type`` is not ``"result_chunk"`` or
            ``payload_sha256`` is not 64 hex digits; ``base64_invalid``;
            ``chunk_checksum_mismatch`` when the sha256 does not match.
    """
    env = _mapping(event, "event")
    kind = env.get("type")
    if kind != RESULT_CHUNK_TYPE:
        raise DSSError(
            ErrorCode.CHUNK_DESCRIPTOR_INVALID, "event.type", '"result_chunk"', got_value(kind)
        )
    sha = env.get("payload_sha256")
    if sha is not None and (type(sha) is not str or not _SHA256_HEX.fullmatch(sha)):
        raise DSSError(
            ErrorCode.CHUNK_DESCRIPTOR_INVALID,
            "event.payload_sha256",
            "64 hex digits",
            got_value(sha),
        )
    data = _b64decode(env, "event")
    if sha is not None:
        digest = hashlib.sha256(data).hexdigest()
        if digest != sha.lower():
            raise DSSError(ErrorCode.CHUNK_CHECKSUM_MISMATCH, "event.payload_sha256", sha, digest)
    return data


def assemble_result_events(events: Iterable[object], *, limits: Limits | None = None) -> memoryview:
    """Reassemble the result frame from its ``result_chunk`` events (other types are skipped).

    Returns the frame as a read-only ``memoryview`` (decode it with `loads`); raises
    ``chunk_missing`` when the events do not hold every chunk.
    """
    assembler = ChunkAssembler("result", limits=limits)
    frame: memoryview | None = None
    if isinstance(events, Mapping | str | bytes) or not isinstance(events, Iterable):
        raise DSSError(
            ErrorCode.BASE64_INVALID, "events", "a list of result_chunk events", got_type(events)
        )
    for event in events:
        if isinstance(event, Mapping) and event.get("type") != RESULT_CHUNK_TYPE:
            continue  # readers ignore event types they do not know (dssst1.proto RequestEvent)
        done = assembler.feed(decode_result_chunk_event(event))
        if done is not None:
            frame = done
    return frame if frame is not None else assembler.finish()
