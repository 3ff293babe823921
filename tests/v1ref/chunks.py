"""Byte chunking and JSON result envelopes of the deployed DSSST1 v1 (arctic.md §1.8, §1.9)."""

from __future__ import annotations

import base64
import hashlib
import uuid
from typing import Any

import numpy as np

from . import WIRE_FORMAT_VERSION, V1WireError, dumps, loads, read_metadata

CHUNK_OVERHEAD_BYTES = 8192
_CHUNK_KEYS = {"request": "request_chunk", "result": "result_chunk"}


def _int(desc: dict[str, Any], field: str) -> int:
    return int(desc.get(field))  # type: ignore[arg-type]  # int(None) raises, as deployed


def encode_byte_chunks(
    frame: bytes,
    *,
    kind: str,
    operation: str | None = None,
    max_bytes: int = 0,
    chunk_group_id: str | None = None,
    force_chunk: bool = False,
) -> list[bytes]:
    """Split ``frame`` into chunk frames (the ``dss_client`` copy, which has ``force_chunk``).

    A request without ``chunk_group_id`` gets a random uuid4; a result never carries one.
    """
    if kind not in _CHUNK_KEYS:
        raise V1WireError(f"unknown byte chunk kind {kind!r}")
    frame = bytes(frame)
    if not force_chunk and (max_bytes <= 0 or len(frame) <= max_bytes):
        return [frame]
    group = (chunk_group_id or str(uuid.uuid4())) if kind == "request" else None
    sha = hashlib.sha256(frame).hexdigest()

    def chunk(idx: int, total: int, start: int, end: int) -> bytes:
        desc: dict[str, Any] = {
            "chunk_idx": idx,
            "total_chunks": total,
            "frame_sha256": sha,
            "frame_size_bytes": len(frame),
        }
        if group is not None:
            desc["chunk_group_id"] = group
        if operation is not None:
            desc["operation"] = operation
        payload = np.frombuffer(frame[start:end], dtype=np.uint8)
        return dumps({"payload": payload}, metadata={_CHUNK_KEYS[kind]: desc})

    if max_bytes <= 0:
        return [chunk(0, 1, 0, len(frame))]
    size = max(1, max_bytes - CHUNK_OVERHEAD_BYTES)
    while True:
        starts = range(0, len(frame), size)
        ranges = [(s, min(s + size, len(frame))) for s in starts] or [(0, 0)]
        chunks = [chunk(i, len(ranges), s, e) for i, (s, e) in enumerate(ranges)]
        if all(len(c) <= max_bytes for c in chunks):
            return chunks
        if size == 1:
            raise V1WireError("max_bytes is too small to hold one DSSST1 byte chunk frame")
        size = max(1, size // 2)


def read_byte_chunk_metadata(frame: Any) -> dict[str, Any] | None:
    """The chunk descriptor plus ``"kind"``, or ``None`` for a frame that is not a chunk."""
    meta = read_metadata(frame)
    for kind, key in _CHUNK_KEYS.items():
        if key in meta:
            return {**meta[key], "kind": kind}
    return None


def decode_byte_chunks(chunks: list[bytes], *, kind: str | None = None) -> bytes:
    """Reassemble a whole chunk group given at once, with the deployed checks."""
    if not chunks:
        raise V1WireError("decode_byte_chunks requires at least one frame")
    descs = [read_byte_chunk_metadata(c) for c in chunks]
    if len(chunks) == 1 and descs[0] is None:
        return bytes(chunks[0])
    if any(d is None for d in descs):
        raise V1WireError("decode_byte_chunks received a frame without byte chunk metadata")
    first: dict[str, Any] = descs[0]  # type: ignore[assignment]
    if kind is not None and first["kind"] != kind:
        raise V1WireError(f"expected {kind} chunks, got {first['kind']} chunks")
    total, size = _int(first, "total_chunks"), _int(first, "frame_size_bytes")
    if len(chunks) != total:
        raise V1WireError(f"expected {total} byte chunks, got {len(chunks)}")
    parts: dict[int, bytes] = {}
    for chunk, desc in zip(chunks, descs, strict=True):
        assert desc is not None
        if desc["kind"] != first["kind"]:
            raise V1WireError("mixed byte chunk kinds")
        if _int(desc, "total_chunks") != total or _int(desc, "frame_size_bytes") != size:
            raise V1WireError("byte chunk total / size differs across frames")
        for field in ("frame_sha256", "chunk_group_id", "operation"):
            if desc.get(field) != first.get(field):
                raise V1WireError(f"byte chunk {field} differs across frames")
        idx = _int(desc, "chunk_idx")
        if not 0 <= idx < total:
            raise V1WireError("byte chunk_idx out of range")
        if idx in parts:
            raise V1WireError("duplicate byte chunk_idx")
        payload = loads(chunk).get("payload")
        if not isinstance(payload, np.ndarray) or payload.dtype != np.uint8 or payload.ndim != 1:
            raise V1WireError("byte chunk payload must be a 1-D uint8 tensor")
        parts[idx] = payload.tobytes()
    missing = sorted(set(range(total)) - set(parts))
    if missing:
        raise V1WireError(f"missing byte chunks: {missing}")
    frame = b"".join(parts[i] for i in range(total))
    if len(frame) != size:
        raise V1WireError("reassembled frame size mismatch")
    if hashlib.sha256(frame).hexdigest() != first.get("frame_sha256"):
        raise V1WireError("reassembled frame sha256 mismatch")
    return frame


def decode_envelope(obj: Any) -> Any:
    """What the deployed clients make of a JSON result (arctic.md §1.9): an inline base64 envelope
    (``dict``) or a list of ``result_chunk`` events; ``base64.b64decode`` is the lenient one."""
    if isinstance(obj, dict):
        if obj.get("wire_format") != WIRE_FORMAT_VERSION:
            return obj
        return loads(base64.b64decode(obj["payload_b64"]))
    frames = []
    for event in obj:
        frame = base64.b64decode(event["payload_b64"])
        sha = event.get("payload_sha256")
        if sha and hashlib.sha256(frame).hexdigest() != sha:
            raise V1WireError("result chunk payload_sha256 mismatch")
        frames.append(frame)
    return loads(decode_byte_chunks(frames, kind="result"))
