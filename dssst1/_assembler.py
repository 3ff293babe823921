"""Sans-I/O chunk group reassembly (`proto/DSSST1.md` §8).

`ChunkAssembler` is fed one chunk frame at a time, in any order, and returns the whole frame when
the last missing chunk arrives. It does no I/O, and it holds what was *received*, never what a
descriptor *declares*: the first accepted chunk fixes the group (its descriptor), and memory grows
with the payloads as they arrive (`buffered_bytes`), so a chunk 0 that declares a 4 GiB frame
costs one chunk. Chunks in order are appended to the frame buffer (one copy of each payload);
a chunk that arrives ahead of a missing one is held apart (one copy) until the gap before it is
filled, then appended. The payload size ``S`` is the length of any non-last chunk.

Checks of one `feed`, in the order of §8:

1. ``chunk_too_large`` (the chunk frame's own length, before it is parsed), then every reader
   check of §6 on the chunk frame;
2. ``chunk_descriptor_missing``, ``chunk_kind_mismatch``, ``chunk_descriptor_invalid``;
3. ``too_many_chunks``, ``frame_too_large`` (so both are decided on the first chunk, before
   anything is buffered);
4. ``chunk_inconsistent`` against the group's first chunk;
5. ``chunk_payload_invalid``: the value is not ``{"payload": 1-D U8}``, the payload is empty, or a
   non-last chunk's length differs from ``S``;
6. ``chunk_checksum_mismatch`` when ``payload_crc32`` is present;
7. ``chunk_duplicate_conflict`` (an identical repeat is accepted and ignored);
8. ``frame_size_mismatch`` as soon as the lengths cannot add up to ``frame_size_bytes``
   (``(total_chunks - 1) * S + len(last)``) — at the latest when the group completes;
9. ``frame_sha256_mismatch`` when the group completes.

A per-chunk failure (1-7) leaves the assembler as it was: the bad chunk is dropped and a good
resend is still accepted. ``frame_size_mismatch`` and ``frame_sha256_mismatch`` condemn the group:
the assembler raises that error again on every later call.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Iterable

from ._chunks import ChunkDescriptor, ChunkKind, parse_descriptor, same_operation
from ._errors import DSSError, ErrorCode, got_type
from ._format import CHUNK_PAYLOAD_KEY, DEFAULT_LIMITS, Limits
from ._header import as_buffer, parse_metadata
from ._reader import RawTensor, decode_raw

__all__ = ["ChunkAssembler", "decode_chunks"]

_COMPARE_WINDOW = 1 << 20


class ChunkAssembler:
    """Reassembles one chunk group: feed it chunk frames, get the frame back when complete.

    Args:
        kind: ``"request"`` or ``"result"``: the descriptor kind the group must carry; ``None``
            takes the kind of the first accepted chunk.
        limits: ``max_chunk_bytes``, ``max_chunks`` and ``max_frame_bytes`` bound the group;
            the reader limits apply to each chunk frame. DSSST1.md §7 defaults if ``None``.

    The frame comes back as a read-only ``memoryview`` over the assembler's single buffer (no
    copy; decode it with `dssst1.loads`).
    """

    def __init__(self, kind: ChunkKind | None = None, *, limits: Limits | None = None) -> None:
        if kind is not None and kind not in ("request", "result"):
            raise DSSError(
                ErrorCode.CHUNK_KIND_MISMATCH, "kind", '"request" or "result"', repr(kind)
            )
        self._kind: ChunkKind | None = kind
        self._limits = DEFAULT_LIMITS if limits is None else limits
        self._first: ChunkDescriptor | None = None
        self._step = 0  # S, once a non-last chunk (or the only chunk) has been accepted
        self._buf = bytearray()  # the frame so far: chunks 0 .. self._next - 1, in order
        self._next = 0  # the first index not in `_buf`
        self._ahead: dict[int, bytes] = {}  # chunks received past a missing one
        self._have: set[int] = set()  # the received indices (never sized by the descriptor)
        self._received = 0
        self._last_len: int | None = None  # length of the last chunk, once received
        self._frame: memoryview | None = None
        self._failure: DSSError | None = None

    @property
    def descriptor(self) -> ChunkDescriptor | None:
        """The descriptor of the group's first accepted chunk (``None`` before it)."""
        return self._first

    @property
    def received(self) -> int:
        """How many distinct chunks have been accepted."""
        return self._received

    @property
    def buffered_bytes(self) -> int:
        """Payload bytes held now (what was received, not what the descriptor declares)."""
        return len(self._buf) + sum(len(b) for b in self._ahead.values())

    @property
    def is_complete(self) -> bool:
        """Whether the frame has been reassembled and verified."""
        return self._frame is not None

    def missing(self) -> list[int]:
        """The indices not received yet (empty before the first chunk: the count is unknown)."""
        return self._missing()

    def _missing(self, limit: int | None = None) -> list[int]:
        total = self._first.total_chunks if self._first is not None else 0
        out: list[int] = []
        for index in range(total):
            if index not in self._have:
                out.append(index)
                if limit is not None and len(out) >= limit:
                    break
        return out

    def finish(self) -> memoryview:
        """The reassembled frame, or ``chunk_missing`` listing the indices still missing."""
        if self._failure is not None:
            raise self._failure
        if self._frame is not None:
            return self._frame
        missing = self._missing(33)
        total = self._first.total_chunks if self._first is not None else "all"
        shown = ", ".join(map(str, missing[:32])) + (", ..." if len(missing) > 32 else "")
        raise DSSError(
            ErrorCode.CHUNK_MISSING,
            "chunks",
            f"{total} chunks of the group",
            f"missing [{shown}]" if self._first is not None else "no chunk",
        )

    def feed(self, chunk: object) -> memoryview | None:
        """Add one chunk frame; return the whole frame when this chunk completes the group."""
        if self._failure is not None:
            raise self._failure
        limits = self._limits
        data = as_buffer(chunk)
        if data.nbytes > limits.max_chunk_bytes:
            raise DSSError(
                ErrorCode.CHUNK_TOO_LARGE,
                "chunk",
                f"at most {limits.max_chunk_bytes} bytes",
                str(data.nbytes),
            )
        value, header = decode_raw(data, limits)
        desc = parse_descriptor(header.op, self._kind)
        if desc is None:
            raise DSSError(
                ErrorCode.CHUNK_DESCRIPTOR_MISSING,
                "op",
                "a request_chunk or result_chunk descriptor",
                "none",
            )
        self._check_limits(desc)
        if self._first is not None:
            _check_consistent(self._first, desc)
        payload = self._payload(desc, value)
        if desc.payload_crc32 is not None:
            crc = f"{zlib.crc32(payload):08x}"
            if crc != desc.payload_crc32:
                raise DSSError(
                    ErrorCode.CHUNK_CHECKSUM_MISMATCH,
                    f"chunk {desc.chunk_idx}",
                    f"payload_crc32 {desc.payload_crc32}",
                    crc,
                )
        if desc.chunk_idx in self._have:
            self._check_duplicate(desc, payload)
            return None
        return self._store(desc, payload)

    def _check_limits(self, desc: ChunkDescriptor) -> None:
        limits = self._limits
        if desc.total_chunks > limits.max_chunks:
            raise DSSError(
                ErrorCode.TOO_MANY_CHUNKS,
                "total_chunks",
                f"at most {limits.max_chunks}",
                str(desc.total_chunks),
            )
        if desc.frame_size_bytes > limits.max_frame_bytes:
            raise DSSError(
                ErrorCode.FRAME_TOO_LARGE,
                "frame_size_bytes",
                f"at most {limits.max_frame_bytes}",
                str(desc.frame_size_bytes),
            )

    def _payload(self, desc: ChunkDescriptor, value: object) -> memoryview:
        """``chunk_payload_invalid`` checks; the payload bytes."""
        payload = value.get(CHUNK_PAYLOAD_KEY) if type(value) is dict and len(value) == 1 else None
        if not isinstance(payload, RawTensor) or payload.dtype != "U8" or len(payload.shape) != 1:
            raise DSSError(
                ErrorCode.CHUNK_PAYLOAD_INVALID,
                f"chunk {desc.chunk_idx}",
                '{"payload": a 1-D U8 tensor}',
                "another value",
            )
        length = payload.data.nbytes
        if length == 0:
            raise DSSError(
                ErrorCode.CHUNK_PAYLOAD_INVALID, f"chunk {desc.chunk_idx}", "a non-empty payload"
            )
        last = desc.chunk_idx == desc.total_chunks - 1
        if not last and self._step and length != self._step:
            raise DSSError(
                ErrorCode.CHUNK_PAYLOAD_INVALID,
                f"chunk {desc.chunk_idx}",
                f"{self._step} bytes, as every chunk but the last",
                f"{length} bytes",
            )
        return payload.data

    def _check_duplicate(self, desc: ChunkDescriptor, payload: memoryview) -> None:
        stored = self._stored(desc.chunk_idx)
        try:  # released at once: a live view would stop the frame buffer from growing
            same = stored.nbytes == payload.nbytes and all(
                bytes(stored[pos : pos + _COMPARE_WINDOW])
                == bytes(payload[pos : pos + _COMPARE_WINDOW])
                for pos in range(0, payload.nbytes, _COMPARE_WINDOW)
            )
        finally:
            stored.release()
        if not same:
            raise DSSError(
                ErrorCode.CHUNK_DUPLICATE_CONFLICT,
                f"chunk {desc.chunk_idx}",
                "the same bytes as the earlier copy of this chunk",
                "different bytes",
            )

    def _stored(self, index: int) -> memoryview:
        assert self._first is not None
        if index in self._ahead:
            return memoryview(self._ahead[index])
        start = index * self._step
        end = start + self._step if index < self._first.total_chunks - 1 else len(self._buf)
        return memoryview(self._buf)[start:end]

    def _store(self, desc: ChunkDescriptor, payload: memoryview) -> memoryview | None:
        if self._first is None:
            self._first = desc
            self._kind = desc.kind
        total, index, length = desc.total_chunks, desc.chunk_idx, payload.nbytes
        if index == total - 1:
            self._last_len = length
            if total == 1:
                self._step = length
        elif not self._step:
            self._step = length
        if self._step:
            self._check_sizes(desc)
        if index == self._next:
            self._buf += payload
            self._next += 1
            while self._next in self._ahead:  # the gap is filled: append what waited for it
                self._buf += self._ahead.pop(self._next)
                self._next += 1
        else:
            self._ahead[index] = bytes(payload)
        self._have.add(index)
        self._received += 1
        if self._received < total:
            return None
        return self._complete(desc)

    def _check_sizes(self, desc: ChunkDescriptor) -> None:
        """``frame_size_mismatch`` once the chunk lengths cannot add up to the frame size."""
        size, total, step, last = (
            desc.frame_size_bytes,
            desc.total_chunks,
            self._step,
            self._last_len,
        )
        # Before the last chunk arrives there must be room left for it (at least one byte).
        fits = (total - 1) * step < size if last is None else (total - 1) * step + last == size
        if not fits:
            self._failure = DSSError(
                ErrorCode.FRAME_SIZE_MISMATCH,
                "chunks",
                f"(total_chunks - 1) * S + len(last) == frame_size_bytes ({size})",
                f"S = {step}, {total} chunks, last "
                + ("not received yet" if last is None else f"{last} bytes"),
            )
            raise self._failure

    def _complete(self, desc: ChunkDescriptor) -> memoryview:
        frame = memoryview(self._buf)
        digest = hashlib.sha256(frame).hexdigest()
        if digest != desc.frame_sha256:
            self._failure = DSSError(
                ErrorCode.FRAME_SHA256_MISMATCH, "frame", f"sha256 {desc.frame_sha256}", digest
            )
            raise self._failure
        self._frame = frame.toreadonly()
        return self._frame


def _check_consistent(first: ChunkDescriptor, desc: ChunkDescriptor) -> None:
    for name in ("total_chunks", "frame_sha256", "frame_size_bytes", "chunk_group_id"):
        if getattr(desc, name) != getattr(first, name):
            raise DSSError(
                ErrorCode.CHUNK_INCONSISTENT,
                f"chunk {desc.chunk_idx}.{name}",
                f"{getattr(first, name)!r} as in the group's first chunk",
                repr(getattr(desc, name)),
            )
    if not same_operation(desc.operation, first.operation):
        raise DSSError(
            ErrorCode.CHUNK_INCONSISTENT,
            f"chunk {desc.chunk_idx}.operation",
            f"{first.operation!r} as in the group's first chunk",
            repr(desc.operation),
        )


def decode_chunks(
    chunks: Iterable[object], *, kind: ChunkKind | None = None, limits: Limits | None = None
) -> bytes:
    """Reassemble a whole chunk group given at once; a lone non-chunk frame passes through.

    This is the deployed v1 ``decode_byte_chunks``: it returns ``bytes`` (one copy of the frame).
    Use `ChunkAssembler` directly to avoid that copy or to feed chunks as they arrive.
    """
    if isinstance(chunks, bytes | bytearray | memoryview | str) or not isinstance(chunks, Iterable):
        raise DSSError(
            ErrorCode.UNSUPPORTED_TYPE, "chunks", "a list of chunk frames", got_type(chunks)
        )
    frames = list(chunks)
    if not frames:
        raise DSSError(ErrorCode.CHUNK_MISSING, "chunks", "at least one frame", "none")
    if len(frames) == 1:
        lim = DEFAULT_LIMITS if limits is None else limits
        _, op = parse_metadata(as_buffer(frames[0]), lim)
        if parse_descriptor(op, kind) is None:
            return bytes(as_buffer(frames[0]))
    assembler = ChunkAssembler(kind, limits=limits)
    frame: memoryview | None = None
    for item in frames:
        done = assembler.feed(item)
        if done is not None:
            frame = done
    if frame is None:
        frame = assembler.finish()
    return bytes(frame)
