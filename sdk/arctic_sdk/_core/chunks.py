"""DSSST1 request bodies -> chunk frames of one chunk group (PROTOCOL.md §3.5).

A DSSST1 body always travels as a chunk group, even of one chunk: the caller-chosen group id
(a UUID, fixed when the call is submitted and reused on every retry and replay) plus the frame's
sha256 is the call's identity, which makes resending it safe on servers with idempotency.

Nothing is copied: the body is encoded as `dssst1.iter_frame` parts (the header, then views of
the arrays' memory), and each chunk frame is its own small header followed by views of those
parts (a payload may straddle parts; the receiver sees one contiguous payload). The arrays of a
submitted call must therefore not change until the call completes.
"""

from __future__ import annotations

import hashlib
import os
import uuid
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np

import dssst1

from ..errors import PayloadTooLargeError, refused_locally
from ..spec.model import MethodInfo
from .capabilities import Capabilities
from .effects import Buffers


def new_group_id() -> str:
    """A random (version 4) UUID."""
    return str(uuid.UUID(bytes=os.urandom(16), version=4))


def encode_body(method: MethodInfo, body: Mapping[str, Any]) -> dssst1.EncodedFrame:
    """The DSSST1 frame of a body, as parts; a codec refusal raises its code's class."""
    try:
        return dssst1.iter_frame(dict(body))
    except dssst1.DSSError as exc:
        raise refused_locally(
            str(exc.code),
            f"{method.name}: the body cannot be encoded: {exc}",
            op=method.name,
            details=exc.details(),
        ) from None


def _chunk_header(desc: dict[str, Any], payload: Any) -> bytes:
    frame = dssst1.iter_frame({"payload": payload}, metadata={"request_chunk": desc})
    return frame.header


def _step(base: dict[str, Any], size: int, max_bytes: int, checksum: bool) -> tuple[int, int]:
    """The payload size and chunk count: the largest payload whose biggest chunk frame fits."""
    step = max_bytes
    while True:
        total = -(-size // step)
        desc = dict(base, chunk_idx=total - 1, total_chunks=total)
        if checksum:
            desc["payload_crc32"] = "0" * 8
        overhead = len(_chunk_header(desc, np.empty(step, np.uint8)))
        if overhead + step <= max_bytes:
            return step, total
        step = max_bytes - overhead
        if step < 1:
            raise PayloadTooLargeError(
                f"a chunk of at most {max_bytes} bytes cannot hold a chunk header",
                code="chunk_too_large",
            )


def _slices(parts: list[memoryview], start: int, end: int) -> list[memoryview]:
    out, pos = [], 0
    for part in parts:
        n = part.nbytes
        lo, hi = max(start, pos), min(end, pos + n)
        if lo < hi:
            out.append(part[lo - pos : hi - pos])
        pos += n
        if pos >= end:
            break
    return out


def split(
    frame: dssst1.EncodedFrame,
    *,
    method: MethodInfo,
    group_id: str,
    max_bytes: int,
    caps: Capabilities,
) -> list[Buffers]:
    """The request chunk frames of `frame` (each a header and payload views), each at most
    `max_bytes` bytes."""
    size = frame.nbytes
    if size > caps.max_frame_bytes:
        raise PayloadTooLargeError(
            f"{method.name}: the body's frame is {size} bytes; the server accepts at most "
            f"{caps.max_frame_bytes}",
            code="frame_too_large",
            op=method.name,
            details={"frame_size_bytes": size, "limit": caps.max_frame_bytes},
        )
    parts = [memoryview(p).cast("B") for p in frame]
    sha = hashlib.sha256()
    for p in parts:
        sha.update(p)
    base: dict[str, Any] = {
        "chunk_idx": 0, "total_chunks": 1, "frame_sha256": sha.hexdigest(),
        "frame_size_bytes": size, "chunk_group_id": group_id, "operation": method.name,
    }  # fmt: skip
    checksum = caps.chunk_checksum
    step, total = _step(base, size, max_bytes, checksum)
    if total > caps.max_chunks:
        raise PayloadTooLargeError(
            f"{method.name}: {total} chunks of {step} bytes exceed the server's {caps.max_chunks}",
            code="too_many_chunks",
            op=method.name,
        )
    out: list[Buffers] = []
    for index in range(total):
        start, end = index * step, min((index + 1) * step, size)
        pieces = _slices(parts, start, end)  # the payload, possibly straddling parts
        desc = dict(base, chunk_idx=index, total_chunks=total)
        if checksum:
            crc = 0
            for piece in pieces:
                crc = zlib.crc32(piece, crc)
            desc["payload_crc32"] = f"{crc:08x}"
        # The chunk header depends only on the payload's length: an untouched buffer stands in.
        out.append((_chunk_header(desc, np.empty(end - start, np.uint8)), *pieces))
    return out
