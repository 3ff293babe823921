"""Chunk groups (DSSST1.md §8): the writer, the sans-I/O assembler and its checks."""

from __future__ import annotations

import gc
import hashlib
import tracemalloc
import uuid
import zlib
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dssst1
from dssst1 import ChunkAssembler, ErrorCode, Limits

from .helpers import code_of, header_of

FRAME = dssst1.dumps({"input_ids": np.arange(300, dtype=np.int64), "note": "chunk me"})
SHA = hashlib.sha256(FRAME).hexdigest()


def chunk(
    payload: Any,
    *,
    idx: int = 0,
    total: int = 1,
    sha: str = SHA,
    size: int | None = None,
    kind: str = "request",
    value: Any = None,
    **extra: Any,
) -> bytes:
    """A hand-made chunk frame (any payload / descriptor), written by our own writer."""
    desc = {"chunk_idx": idx, "total_chunks": total, "frame_sha256": sha}
    desc["frame_size_bytes"] = len(FRAME) if size is None else size
    desc.update(extra)
    if value is None:
        value = {"payload": np.frombuffer(bytes(payload), np.uint8)}
    return dssst1.dumps(value, metadata={f"{kind}_chunk": desc})


def split(frame: bytes, step: int, **extra: Any) -> list[bytes]:
    total = -(-len(frame) // step)
    sha = hashlib.sha256(frame).hexdigest()
    return [
        chunk(
            frame[i * step : (i + 1) * step], idx=i, total=total, sha=sha, size=len(frame), **extra
        )
        for i in range(total)
    ]


def feed_all(chunks: list[bytes], kind: Any = "request", limits: Limits | None = None) -> bytes:
    assembler = ChunkAssembler(kind, limits=limits)
    for item in chunks:
        assembler.feed(item)
    return bytes(assembler.finish())


def feed_code(chunks: list[bytes], kind: Any = "request", limits: Limits | None = None) -> str:
    return code_of(feed_all, chunks, kind, limits)


# --------------------------------------------------------------------------- writer


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 5000), st.integers(600, 3000), st.booleans(), st.randoms(use_true_random=False)
)
def test_encode_then_assemble_in_any_order(
    size: int, max_bytes: int, checksum: bool, rnd: Any
) -> None:
    frame = rnd.randbytes(size)
    chunks = dssst1.encode_chunks(frame, kind="request", max_bytes=max_bytes, checksum=checksum)
    assert all(len(c) <= max_bytes for c in chunks)
    descs = [dssst1.read_chunk_descriptor(c) for c in chunks]
    assert [d.chunk_idx for d in descs if d] == list(range(len(chunks)))
    assert len({d.chunk_group_id for d in descs if d}) == 1
    order = chunks + rnd.sample(chunks, k=min(2, len(chunks)))  # with identical repeats
    rnd.shuffle(order)
    assembler = ChunkAssembler("request")
    outs = [assembler.feed(c) for c in order]
    done = [o for o in outs if o is not None]
    assert len(done) == 1 and bytes(done[0]) == frame
    assert assembler.is_complete and assembler.missing() == []
    assert dssst1.decode_chunks(order) == frame


def test_chunks_are_as_large_as_allowed() -> None:
    frame = bytes(range(256)) * 400
    for max_bytes in (700, 4096, 65_536):
        chunks = dssst1.encode_chunks(frame, kind="result", max_bytes=max_bytes)
        assert max(len(c) for c in chunks[:-1] or chunks) > max_bytes - 16
        assert all(len(c) <= max_bytes for c in chunks)


def test_always_chunk_frames_even_one() -> None:
    (only,) = dssst1.encode_chunks(FRAME, kind="request", max_bytes=1 << 20, operation="generate")
    desc = dssst1.read_chunk_descriptor(only)
    assert desc is not None and (desc.chunk_idx, desc.total_chunks) == (0, 1)
    assert desc.frame_sha256 == SHA and desc.frame_size_bytes == len(FRAME)
    assert desc.operation == "generate" and desc.payload_crc32 is None
    uuid.UUID(desc.chunk_group_id or "")  # a fresh UUID for a request without one
    assert dssst1.decode_chunks([only]) == FRAME
    (res,) = dssst1.encode_chunks(FRAME, kind="result", max_bytes=1 << 20)
    rdesc = dssst1.read_chunk_descriptor(res)
    assert rdesc is not None and rdesc.kind == "result" and rdesc.chunk_group_id is None
    assert dssst1.read_chunk_descriptor(FRAME) is None


def test_descriptor_fields() -> None:
    chunks = dssst1.encode_chunks(
        FRAME,
        kind="request",
        max_bytes=1000,
        chunk_group_id="g-1",
        operation="fwd-bwd",
        checksum=True,
    )
    for item in chunks:
        op = dssst1.read_metadata(item)["request_chunk"]
        assert op["chunk_group_id"] == "g-1" and op["operation"] == "fwd-bwd"
        payload = dssst1.loads(item)["payload"]
        assert op["payload_crc32"] == f"{zlib.crc32(payload.tobytes()):08x}"
        assert op["frame_sha256"] == SHA
        n = int.from_bytes(item[:8], "little")
        assert n % 8 == 0
        assert header_of(item)["payload"]["dtype"] == "U8"


def test_iter_chunks_hands_out_views_of_the_frame() -> None:
    frame = bytearray(FRAME)
    parts = list(dssst1.iter_chunks(frame, kind="result", max_bytes=800))
    base = np.frombuffer(frame, np.uint8)
    for part in parts:
        (payload,) = part.buffers
        assert np.shares_memory(np.frombuffer(payload, np.uint8), base)
        assert part.nbytes == len(part.tobytes()) <= 800
    assert dssst1.decode_chunks([p.tobytes() for p in parts]) == FRAME


@pytest.mark.parametrize(
    "kwargs,code",
    [
        ({"kind": "both"}, ErrorCode.CHUNK_KIND_MISMATCH),
        ({"max_bytes": 100}, ErrorCode.CHUNK_TOO_LARGE),
        ({"max_bytes": 0}, ErrorCode.CHUNK_TOO_LARGE),
        ({"max_bytes": 1.5}, ErrorCode.CHUNK_TOO_LARGE),
        ({"operation": 5}, ErrorCode.CHUNK_DESCRIPTOR_INVALID),
        ({"chunk_group_id": b"g"}, ErrorCode.CHUNK_DESCRIPTOR_INVALID),
        ({"limits": Limits(max_chunks=2)}, ErrorCode.TOO_MANY_CHUNKS),
    ],
)
def test_writer_errors(kwargs: dict[str, Any], code: ErrorCode) -> None:
    args: dict[str, Any] = {"kind": "request", "max_bytes": 600, **kwargs}
    assert code_of(dssst1.encode_chunks, FRAME, **args) == code
    assert (
        code_of(dssst1.encode_chunks, b"", kind="request", max_bytes=600)
        == ErrorCode.FRAME_TOO_SHORT
    )


# --------------------------------------------------------------------------- assembler


def test_assembler_state() -> None:
    chunks = split(FRAME, 1000)
    assembler = ChunkAssembler("request")
    assert assembler.missing() == [] and assembler.descriptor is None and not assembler.is_complete
    assert code_of(assembler.finish) == ErrorCode.CHUNK_MISSING
    assert assembler.feed(chunks[2]) is None
    assert assembler.missing() == [0, 1] and assembler.received == 1
    with pytest.raises(dssst1.DSSError) as info:
        assembler.finish()
    assert info.value.code is ErrorCode.CHUNK_MISSING and "0, 1" in str(info.value)
    assert assembler.feed(chunks[0]) is None
    assert assembler.feed(chunks[0]) is None  # identical repeat
    frame = assembler.feed(chunks[1])
    assert frame is not None and bytes(frame) == FRAME and frame.readonly
    assert assembler.finish() is frame
    assert assembler.feed(chunks[1]) is None  # a late identical repeat is harmless
    assert dssst1.loads(frame)["note"] == "chunk me"


def test_last_chunk_first_is_held_until_s_is_known() -> None:
    chunks = split(FRAME, 700)
    assert len(chunks) >= 3
    assert feed_all(chunks[::-1]) == FRAME
    assembler = ChunkAssembler("request")
    assembler.feed(chunks[-1])
    assembler.feed(chunks[-1])  # identical repeat of the held chunk
    assert (
        feed_code([chunks[-1], split(FRAME[:-1] + b"?", 700)[-1]]) == ErrorCode.CHUNK_INCONSISTENT
    )


def test_kind_none_takes_the_first_chunk_kind() -> None:
    result = split(FRAME, 1000, kind="result")
    assert feed_all(result, kind=None) == FRAME
    mixed = [result[0], split(FRAME, 1000)[1]]
    assert feed_code(mixed, kind=None) == ErrorCode.CHUNK_KIND_MISMATCH


def test_operation_aliases_and_hex_case_are_consistent() -> None:
    chunks = split(FRAME, 1000, operation="forward-backward")
    other = split(FRAME, 1000, operation="fwd-bwd")
    assert feed_all([chunks[0], other[1], chunks[2]]) == FRAME
    upper = split(FRAME, 1000, operation="forward-backward")
    upper[1] = chunk(FRAME[1000:2000], idx=1, total=3, sha=SHA.upper(), operation="fwd-bwd")
    assert feed_all([chunks[0], upper[1], chunks[2]]) == FRAME


def test_per_chunk_errors_leave_the_assembler_usable() -> None:
    chunks = split(FRAME, 1000)
    assembler = ChunkAssembler("request")
    assembler.feed(chunks[0])
    bad = chunk(b"x" * 1000, idx=1, total=3, payload_crc32="00000000")
    assert code_of(assembler.feed, bad) == ErrorCode.CHUNK_CHECKSUM_MISMATCH
    assert code_of(assembler.feed, b"garbage!") == ErrorCode.HEADER_TOO_LARGE
    assembler.feed(chunks[1])
    assert bytes(assembler.feed(chunks[2]) or b"") == FRAME


S = 1000
TOTAL = -(-len(FRAME) // S)


def part(i: int) -> bytes:
    return FRAME[i * S : (i + 1) * S]


def c(i: int, payload: bytes | None = None, **extra: Any) -> bytes:
    """Chunk ``i`` of FRAME in S-byte chunks (or another payload / descriptor)."""
    return chunk(part(i) if payload is None else payload, idx=i, total=TOTAL, **extra)


def bare(value: Any, op: Any = None) -> bytes:
    return dssst1.dumps(value, metadata=op)


def u8(n: int) -> Any:
    return np.zeros(n, np.uint8)


E = ErrorCode
LAST = TOTAL - 1
GOOD = [c(i) for i in range(TOTAL)]
CRC0 = f"{zlib.crc32(part(0)):08x}"
CASES: list[tuple[str, list[bytes], ErrorCode]] = [
    ("descriptor-missing", [GOOD[0], bare({"payload": u8(3)})], E.CHUNK_DESCRIPTOR_MISSING),
    ("kind-mismatch", split(FRAME, S, kind="result"), E.CHUNK_KIND_MISMATCH),
    ("desc-not-object", [bare({"payload": u8(1)}, {"request_chunk": [0]})],
     E.CHUNK_DESCRIPTOR_INVALID),
    ("desc-both-kinds", [bare({"payload": u8(1)}, {"request_chunk": {}, "result_chunk": {}})],
     E.CHUNK_DESCRIPTOR_INVALID),
    ("desc-idx-bool", [chunk(part(0), idx=True, total=TOTAL)], E.CHUNK_DESCRIPTOR_INVALID),
    ("desc-idx-range", [chunk(part(0), idx=TOTAL, total=TOTAL)], E.CHUNK_DESCRIPTOR_INVALID),
    ("desc-total-zero", [chunk(part(0), idx=0, total=0)], E.CHUNK_DESCRIPTOR_INVALID),
    ("desc-size-negative", [c(0, size=-1)], E.CHUNK_DESCRIPTOR_INVALID),
    ("desc-size-string", [c(0, size="10")], E.CHUNK_DESCRIPTOR_INVALID),
    ("desc-sha-short", [c(0, sha="abc")], E.CHUNK_DESCRIPTOR_INVALID),
    ("desc-crc-long", [c(0, payload_crc32="123456789")], E.CHUNK_DESCRIPTOR_INVALID),
    ("desc-op-number", [c(0, operation=3)], E.CHUNK_DESCRIPTOR_INVALID),
    ("too-many-chunks", [chunk(b"x", total=65_537, size=65_537)], E.TOO_MANY_CHUNKS),
    ("too-many-before-too-large", [chunk(b"x" * 100, total=2**40, size=2**40 * 100)],
     E.TOO_MANY_CHUNKS),
    ("frame-too-large", [chunk(b"x" * 2**16, total=2**16, size=2**32 + 1)], E.FRAME_TOO_LARGE),
    ("inconsistent-total", [GOOD[0], chunk(part(1), idx=1, total=TOTAL + 1)], E.CHUNK_INCONSISTENT),
    ("inconsistent-sha", [GOOD[0], c(1, sha="0" * 64)], E.CHUNK_INCONSISTENT),
    ("inconsistent-size", [GOOD[0], c(1, size=5000)], E.CHUNK_INCONSISTENT),
    ("inconsistent-group", [c(0, chunk_group_id="a"), c(1, chunk_group_id="b")],
     E.CHUNK_INCONSISTENT),
    ("inconsistent-op", [c(0, operation="generate"), GOOD[1]], E.CHUNK_INCONSISTENT),
    ("inconsistent-before-payload",
     [GOOD[0], c(1, b"", chunk_group_id="z", value={"payload": np.zeros(2, np.int32)})],
     E.CHUNK_INCONSISTENT),
    ("payload-i32", [c(0, b"", value={"payload": np.zeros(250, np.int32)})],
     E.CHUNK_PAYLOAD_INVALID),
    ("payload-2d", [c(0, b"", value={"payload": np.zeros((2, 500), np.uint8)})],
     E.CHUNK_PAYLOAD_INVALID),
    ("payload-scalar", [c(0, b"", value={"payload": np.uint8(3)})], E.CHUNK_PAYLOAD_INVALID),
    ("payload-bytes-flag", [c(0, b"", value={"payload": b"x" * 1000})], E.CHUNK_PAYLOAD_INVALID),
    ("payload-extra-key", [c(0, b"", value={"payload": u8(9), "x": 1})], E.CHUNK_PAYLOAD_INVALID),
    ("payload-not-dict", [c(0, b"", value=[u8(9)])], E.CHUNK_PAYLOAD_INVALID),
    ("payload-empty", [c(0, b"")], E.CHUNK_PAYLOAD_INVALID),
    ("payload-short-middle", [GOOD[0], c(1, part(1)[:-1])], E.CHUNK_PAYLOAD_INVALID),
    ("checksum", [c(0, payload_crc32="deadbeef")], E.CHUNK_CHECKSUM_MISMATCH),
    ("checksum-before-duplicate", [GOOD[0], c(0, b"y" * S, payload_crc32=CRC0)],
     E.CHUNK_CHECKSUM_MISMATCH),
    ("duplicate-conflict", [GOOD[0], c(0, b"y" * S)], E.CHUNK_DUPLICATE_CONFLICT),
    ("duplicate-conflict-held", [GOOD[LAST], c(LAST, b"y")], E.CHUNK_DUPLICATE_CONFLICT),
    ("missing", [GOOD[0]], E.CHUNK_MISSING),
    ("size-only-chunk-short", [chunk(FRAME[:-8], total=1)], E.FRAME_SIZE_MISMATCH),
    ("size-only-chunk-long", [chunk(FRAME + b"x", total=1)], E.FRAME_SIZE_MISMATCH),
    ("size-last-overruns", [*GOOD[:LAST], c(LAST, part(LAST) + b"12345")], E.FRAME_SIZE_MISMATCH),
    ("size-last-short", [c(LAST, part(LAST)[:-1]), *GOOD[:LAST]], E.FRAME_SIZE_MISMATCH),
    ("size-no-room-for-last", [chunk(b"z" * len(FRAME), total=2)], E.FRAME_SIZE_MISMATCH),
    ("sha256", [c(0, b"!" + part(0)[1:]), *GOOD[1:]], E.FRAME_SHA256_MISMATCH),
    ("chunk-too-large", [GOOD[0]], E.CHUNK_TOO_LARGE),
    ("chunk-frame-invalid", [b"\x80\x04\x95" + bytes(20)], E.PICKLE_REFUSED),
]  # fmt: skip


@pytest.mark.parametrize("name,chunks,code", CASES, ids=[c[0] for c in CASES])
def test_assembler_errors(name: str, chunks: list[bytes], code: ErrorCode) -> None:
    limits = Limits(max_chunk_bytes=500) if name == "chunk-too-large" else None
    assert feed_code(chunks, limits=limits) == code


def test_group_failures_are_final() -> None:
    chunks = [c(0, b"!" + part(0)[1:]), *GOOD[1:]]
    assembler = ChunkAssembler("request")
    for item in chunks[:-1]:
        assembler.feed(item)
    assert code_of(assembler.feed, chunks[-1]) == ErrorCode.FRAME_SHA256_MISMATCH
    assert code_of(assembler.feed, split(FRAME, S)[0]) == ErrorCode.FRAME_SHA256_MISMATCH
    assert code_of(assembler.finish) == ErrorCode.FRAME_SHA256_MISMATCH


def test_frame_too_large_is_refused_before_allocating() -> None:
    huge = chunk(b"x" * 4096, total=2**16, size=2**28 * 1024)
    tracemalloc.start()
    try:
        assert feed_code([huge]) == ErrorCode.FRAME_TOO_LARGE
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_decode_chunks_passthrough_and_errors() -> None:
    assert dssst1.decode_chunks([FRAME]) == FRAME
    assert dssst1.decode_chunks([bytearray(FRAME)], kind="result") == FRAME
    assert code_of(dssst1.decode_chunks, []) == ErrorCode.CHUNK_MISSING
    assert code_of(dssst1.decode_chunks, [FRAME, FRAME]) == ErrorCode.CHUNK_DESCRIPTOR_MISSING
    assert code_of(dssst1.decode_chunks, [b"junk"]) == ErrorCode.FRAME_TOO_SHORT
    assert code_of(dssst1.decode_chunks, split(FRAME, S)[:1]) == ErrorCode.CHUNK_MISSING
    assert (
        code_of(dssst1.decode_chunks, split(FRAME, S), kind="result")
        == ErrorCode.CHUNK_KIND_MISMATCH
    )
    assert code_of(ChunkAssembler, "other") == ErrorCode.CHUNK_KIND_MISMATCH


def test_reassembling_256_mib_peaks_near_the_frame_size() -> None:
    size = 256 * 1024 * 1024
    payload = np.zeros(size - 4096, dtype=np.uint8)
    payload[::4096] = 7
    frame = dssst1.dumps({"w": payload, "pad": "x" * 100})
    frame = frame + b""  # keep exactly one copy
    del payload
    chunks = dssst1.encode_chunks(frame, kind="request", max_bytes=4 * 1024 * 1024)
    sha = hashlib.sha256(frame).hexdigest()
    size = len(frame)
    del frame
    gc.collect()
    assembler = ChunkAssembler("request")
    tracemalloc.start()
    try:
        out = None
        for item in chunks:
            out = assembler.feed(item) or out
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert out is not None and hashlib.sha256(out).hexdigest() == sha
    assert peak <= 1.1 * size, (peak, size)
    value = dssst1.loads(out)
    assert value["w"][4096] == 7 and value["w"][1] == 0
