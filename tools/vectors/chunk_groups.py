"""Chunk groups (DSSST1.md §8): valid reassemblies and invalid groups."""

from __future__ import annotations

import hashlib
import zlib
from typing import Any

import numpy as np

from tests import v1ref

from .common import RESPONSE_OPTIONS, Vector, add, u8

GROUP = "group-1"
INNER_OBJ = {"input_ids": np.arange(256, dtype=np.int64).reshape(4, 64), "loss_fn": "ppo"}
INNER = v1ref.dumps(INNER_OBJ, metadata=RESPONSE_OPTIONS)
S = 1024  # chunk payload size of the hand-made groups
INNER_SHA = hashlib.sha256(INNER).hexdigest()


def chunk_frame(payload: Any, desc: Any, *, kind: str = "request") -> bytes:
    """A chunk frame as the deployed writer makes it; ``payload`` bytes or any value."""
    value = {"payload": u8(payload)} if isinstance(payload, bytes) else payload
    return v1ref.dumps(value, metadata={f"{kind}_chunk": desc})


def desc(idx: Any, total: int = 3, **over: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "chunk_idx": idx,
        "total_chunks": total,
        "frame_sha256": INNER_SHA,
        "frame_size_bytes": len(INNER),
        "chunk_group_id": GROUP,
        "operation": "forward-backward",
    }
    d.update(over)
    return {k: v for k, v in d.items() if v is not None}


def piece(i: int, size: int = S) -> bytes:
    return INNER[i * size : (i + 1) * size]


def std_chunks() -> list[bytes]:
    chunks = v1ref.encode_byte_chunks(
        INNER,
        kind="request",
        operation="forward-backward",
        max_bytes=8192 + S,
        chunk_group_id=GROUP,
        force_chunk=True,
    )
    assert len(chunks) == 3 and chunks[0] == chunk_frame(piece(0), desc(0))
    return chunks


def ok_chunks(
    vid: str,
    origin: str,
    frames: list[bytes],
    ref: str,
    what: str,
    *,
    kind: str = "request",
    value: Any = None,
    **kw: Any,
) -> None:
    add(
        Vector(
            vid,
            "chunks",
            origin,
            ref,
            what,
            frames,
            chunk_kind=kind,
            expected=INNER_OBJ if value is None else value,
            **kw,
        )
    )


def bad_chunks(
    vid: str,
    code: str,
    what: str,
    frames: list[bytes],
    *,
    kind: str = "request",
    origin: str = "hand-built",
    **kw: Any,
) -> None:
    add(
        Vector(
            vid,
            "chunks",
            origin,
            f"§8 {code}",
            what,
            frames,
            chunk_kind=kind,
            error_code=code,
            **kw,
        )
    )


def chunk_groups() -> None:
    c = std_chunks()
    assert len(INNER) % S != 0  # the last standard chunk is short
    ok_chunks(
        "ck-in-order",
        "v1-writer",
        c,
        "§8",
        "3 request chunks (force_chunk, max_bytes = 8192 + 1024, so S = 1024) in order",
    )
    ok_chunks(
        "ck-out-of-order",
        "v1-writer",
        [c[2], c[0], c[1]],
        "§8 order-independent",
        "the same chunks delivered 2, 0, 1",
    )
    ok_chunks(
        "ck-identical-duplicate",
        "v1-writer",
        [c[0], c[1], c[1], c[2]],
        "§8 chunk_duplicate_conflict (identical repeat)",
        "chunk 1 delivered twice with identical bytes: accepted and ignored (the deployed "
        "all-at-once decoder refuses the count)",
        v1_error="V1WireError",
    )
    forced = v1ref.encode_byte_chunks(
        INNER,
        kind="request",
        operation="forward-backward",
        max_bytes=16384,
        chunk_group_id="group-a",
        force_chunk=True,
    )
    assert len(forced) == 1
    ok_chunks(
        "ck-forced-single",
        "v1-writer",
        forced,
        "§8 total_chunks 1",
        "force_chunk: one chunk covering the whole frame (chunk_idx 0, total_chunks 1)",
    )
    fb = v1ref.encode_byte_chunks(
        INNER,
        kind="request",
        operation="fwd-bwd",
        max_bytes=8192 + 1200,
        chunk_group_id="group-fwd-bwd",
        force_chunk=True,
    )
    ok_chunks(
        "ck-fwd-bwd-label",
        "v1-writer",
        fb,
        "§8 operation",
        "the legacy operation label fwd-bwd (S = 1200)",
    )
    res = v1ref.encode_byte_chunks(INNER, kind="result", max_bytes=8192 + 1500, force_chunk=True)
    ok_chunks(
        "ck-result",
        "v1-writer",
        [res[1], res[0]],
        "§8 result_chunk",
        "result chunks: no chunk_group_id, no operation; delivered 1, 0",
        kind="result",
    )
    half = len(INNER) // 2
    assert 2 * half == len(INNER)
    ex = v1ref.encode_byte_chunks(
        INNER, kind="request", max_bytes=8192 + half, chunk_group_id="group-even", force_chunk=True
    )
    ok_chunks(
        "ck-exact-multiple",
        "v1-writer",
        ex,
        "§8",
        f"the frame is exactly 2 x S (S = {half}): the last chunk is full; no operation",
    )
    crc = [
        chunk_frame(piece(i), desc(i, payload_crc32=f"{zlib.crc32(piece(i)):08x}"))
        for i in range(3)
    ]
    ok_chunks(
        "ck-crc32",
        "new-writer",
        crc,
        "§8 payload_crc32",
        "every descriptor carries a correct payload_crc32 (lowercase hex)",
    )
    upper = INNER_SHA.upper()
    ok_chunks(
        "ck-uppercase-hex",
        "hand-built",
        [
            chunk_frame(
                piece(i), desc(i, frame_sha256=upper, payload_crc32=f"{zlib.crc32(piece(i)):08X}")
            )
            for i in range(3)
        ],
        "§8 hex case",
        "every descriptor carries frame_sha256 and payload_crc32 in uppercase hex: compared "
        "case-insensitively (writers emit lowercase)",
        v1_error="V1WireError",
    )
    ok_chunks(
        "ck-mixed-case-sha256",
        "hand-built",
        [chunk_frame(piece(0), desc(0, frame_sha256=upper)), c[1], c[2]],
        "§8 chunk_inconsistent (hex case)",
        "chunk 0's frame_sha256 is uppercase, chunks 1 and 2 lowercase: the same digest, "
        "not chunk_inconsistent",
        v1_error="V1WireError",
    )
    ok_chunks(
        "ck-mixed-operation-labels",
        "hand-built",
        [c[0], chunk_frame(piece(1), desc(1, operation="fwd-bwd")), c[2]],
        "§8 chunk_inconsistent (operation alias)",
        "chunk 1 says fwd-bwd, chunks 0 and 2 forward-backward: labels are compared after "
        "alias resolution, so the group is consistent",
        v1_error="V1WireError",
    )
    ok_chunks(
        "ck-passthrough",
        "v1-writer",
        [INNER],
        "§8 passthrough",
        "a single frame that is not a chunk frame is the whole value",
    )

    plain = v1ref.dumps({"payload": u8(piece(1))})
    bad_chunks(
        "ckbad-descriptor-missing",
        "chunk_descriptor_missing",
        "the second frame of the group has no descriptor",
        [c[0], plain, c[2]],
    )
    res3 = [
        chunk_frame(piece(i), desc(i, chunk_group_id=None, operation=None), kind="result")
        for i in range(3)
    ]
    bad_chunks(
        "ckbad-kind-result-for-request",
        "chunk_kind_mismatch",
        "result_chunk descriptors where request chunks are expected",
        res3,
    )
    bad_chunks(
        "ckbad-kind-mixed",
        "chunk_kind_mismatch",
        "chunk 0 is a request chunk, chunk 1 a result chunk",
        [c[0], res3[1], res3[2]],
    )
    for vid, d, what in [
        ("idx-out-of-range", desc(3), "chunk_idx 3 of 3"),
        ("idx-negative", desc(-1), "chunk_idx -1"),
        ("idx-string", desc("0"), 'chunk_idx "0" (a string)'),
        ("idx-bool", desc(True), "chunk_idx true (a bool)"),
        ("total-zero", desc(0, 0), "total_chunks 0"),
        ("size-missing", desc(0, frame_size_bytes=None), "no frame_size_bytes"),
        ("sha-malformed", desc(0, frame_sha256="abc123"), "frame_sha256 is 6 hex digits"),
        ("sha-not-hex", desc(0, frame_sha256="z" * 64), "frame_sha256 is 64 non-hex chars"),
        ("total-bool", desc(0, True), "total_chunks true (a bool; chunk_idx 0 would fit 1)"),
        ("total-float", desc(0, 3.0), "total_chunks 3.0 (not a JSON integer)"),
        (
            "size-string",
            desc(0, frame_size_bytes=str(len(INNER))),
            "frame_size_bytes as a decimal string",
        ),
        ("crc-malformed", desc(0, payload_crc32="12345"), "payload_crc32 of 5 digits"),
        (
            "crc-not-string",
            desc(0, payload_crc32=zlib.crc32(piece(0))),
            "payload_crc32 is the (correct) CRC as a JSON number",
        ),
        ("group-not-string", desc(0, chunk_group_id=7), "chunk_group_id is a number"),
        ("not-object", [0, 3], "the descriptor is an array"),
    ]:
        bad_chunks(
            f"ckbad-desc-{vid}",
            "chunk_descriptor_invalid",
            f"first chunk: {what}",
            [chunk_frame(piece(0), d), c[1], c[2]],
        )
    for vid, value, what in [
        ("i32", {"payload": np.frombuffer(piece(0), dtype=np.int32)}, "payload is I32"),
        ("2d", {"payload": u8(piece(0)).reshape(2, S // 2)}, "payload is 2-D"),
        ("missing", {"data": u8(piece(0))}, "no payload key"),
        ("extra-key", {"payload": u8(piece(0)), "note": "x"}, "a key beside payload"),
        ("scalar", {"payload": np.array(7, dtype=np.uint8)}, "payload is a 0-dim tensor"),
    ]:
        bad_chunks(
            f"ckbad-payload-{vid}",
            "chunk_payload_invalid",
            f"first chunk: {what}",
            [chunk_frame(value, desc(0)), c[1], c[2]],
        )
    bad_chunks(
        "ckbad-payload-short-middle",
        "chunk_payload_invalid",
        "chunk 1 (not last) holds S - 1 bytes",
        [c[0], chunk_frame(INNER[S : 2 * S - 1], desc(1)), c[2]],
    )
    bad_chunks(
        "ckbad-payload-empty",
        "chunk_payload_invalid",
        "the last chunk's payload is empty (a 0-element U8 tensor)",
        [c[0], c[1], chunk_frame(b"", desc(2))],
    )
    bad_chunks(
        "ckbad-frame-size-last-overruns",
        "frame_size_mismatch",
        "the last chunk holds 5 bytes more than frame_size_bytes leaves for it: 2 * S + "
        "len(last) exceeds frame_size_bytes",
        [c[0], c[1], chunk_frame(piece(2) + b"\x00" * 5, desc(2))],
    )
    bad_chunks(
        "ckbad-too-many-chunks",
        "too_many_chunks",
        "total_chunks 65,537 (one over the default 65,536) with 1-byte chunks",
        [chunk_frame(b"\x00", desc(0, 65537, frame_size_bytes=65537))],
    )
    size = 65536 * 81920
    bad_chunks(
        "ckbad-frame-too-large",
        "frame_too_large",
        "frame_size_bytes 5 GiB (default request limit 4 GiB) in an otherwise consistent "
        "first chunk: 65,536 chunks of 81,920 bytes",
        [chunk_frame(bytes(81920), desc(0, 65536, frame_size_bytes=size))],
    )
    bad_chunks(
        "ckbad-frame-too-large-later-chunk",
        "frame_too_large",
        "chunk 1 claims frame_size_bytes 5 GiB: frame_too_large is checked before "
        "chunk_inconsistent",
        [c[0], chunk_frame(piece(1), desc(1, frame_size_bytes=size))],
    )
    bad_chunks(
        "ckbad-inconsistent-before-payload",
        "chunk_inconsistent",
        "chunk 1 has another chunk_group_id and an I32 payload: chunk_inconsistent is checked "
        "before chunk_payload_invalid",
        [
            c[0],
            chunk_frame(
                {"payload": np.frombuffer(piece(1), dtype=np.int32)},
                desc(1, chunk_group_id="group-2"),
            ),
            c[2],
        ],
    )
    inconsistent: list[tuple[str, dict[str, Any], str]] = [
        ("sha", {"frame_sha256": "0" * 64}, "frame_sha256"),
        ("group", {"chunk_group_id": "group-2"}, "chunk_group_id"),
        ("operation", {"operation": "generate"}, "operation"),
        ("operation-absent", {"operation": None}, "operation (absent)"),
        ("total", {"total_chunks": 4}, "total_chunks"),
        ("size", {"frame_size_bytes": len(INNER) + 1}, "frame_size_bytes"),
    ]
    for vid, over, what in inconsistent:
        bad_chunks(
            f"ckbad-inconsistent-{vid}",
            "chunk_inconsistent",
            f"chunk 1's {what} differs from chunk 0's",
            [c[0], chunk_frame(piece(1), desc(1, **over)), c[2]],
        )
    other = bytes(b ^ 0xFF for b in piece(1))
    bad_chunks(
        "ckbad-duplicate-conflict",
        "chunk_duplicate_conflict",
        "chunk 1 arrives twice with different bytes",
        [c[0], c[1], chunk_frame(other, desc(1)), c[2]],
    )
    bad_chunks(
        "ckbad-checksum",
        "chunk_checksum_mismatch",
        "chunk 1's payload_crc32 is wrong",
        [crc[0], chunk_frame(piece(1), desc(1, payload_crc32="00000000")), crc[2]],
    )
    bad_chunks(
        "ckbad-checksum-before-duplicate",
        "chunk_checksum_mismatch",
        "chunk 1 arrives again with other bytes under its original payload_crc32: "
        "chunk_checksum_mismatch is checked before chunk_duplicate_conflict",
        [
            crc[0],
            crc[1],
            chunk_frame(other, desc(1, payload_crc32=f"{zlib.crc32(piece(1)):08x}")),
            crc[2],
        ],
    )
    bad_chunks(
        "ckbad-missing",
        "chunk_missing",
        "chunks 0 and 2 of 3, then the group is finished",
        [c[0], c[2]],
    )
    bad_chunks(
        "ckbad-frame-size-mismatch",
        "frame_size_mismatch",
        "one chunk of total 1 holding 8 bytes fewer than frame_size_bytes",
        [chunk_frame(INNER[:-8], desc(0, 1))],
    )
    flipped = bytearray(piece(1))
    flipped[10] ^= 0x01
    bad_chunks(
        "ckbad-frame-sha256-mismatch",
        "frame_sha256_mismatch",
        "one bit of chunk 1 flipped: sizes agree, the reassembled SHA-256 does not",
        [c[0], chunk_frame(bytes(flipped), desc(1)), c[2]],
    )
