"""DSSST1: the tensor frame codec of the Arctic wire protocol.

A DSSST1 frame is one safetensors blob whose metadata carries the structure of a nested Python
value (dicts, lists, tuples, JSON scalars, NumPy arrays, torch tensors). ``proto/DSSST1.md`` is
the normative byte-level specification; this package implements it: every reader check with its
stable error code, the writer rules, the limits, chunk groups and the base64 envelopes.

Writing::

    frame = dssst1.dumps({"kwargs": {"input_ids": ids}}, metadata={"response_options": {...}})
    parts = dssst1.iter_frame(value)      # header bytes + views of the tensors' own memory
    parts.nbytes                          # the Content-Length, known before anything is sent
    for buffer in parts: sock.sendall(buffer)
    chunks = dssst1.encode_chunks(frame, kind="request", max_bytes=4 << 20, operation="generate")

Reading::

    value = dssst1.loads(frame)                      # NumPy views on ``frame``: zero-copy
    value = dssst1.loads(frame, tensors="torch")     # torch views
    op = dssst1.read_metadata(frame)                 # the ``op`` metadata (strict)
    assembler = dssst1.ChunkAssembler("request")     # sans-I/O: feed chunks, get the frame
    frame = assembler.feed(chunk)                    # None until the group is complete

Values. ``None``, ``bool``, ``int``, finite ``float``, ``str`` and lists / string-keyed dicts of
those travel as JSON; other dicts and lists, and every tuple, as structure nodes (a tuple stays a
tuple at any depth); NumPy arrays and torch tensors of the §4 dtypes (bfloat16 and float8 through
``ml_dtypes``) as tensors. A NaN or infinite ``float`` and ``bytes`` / ``bytearray`` travel as
flagged tensors and come back as ``float`` and ``bytes``. NumPy scalars (``np.float32(1)``) are
written as 0-dim arrays and come back as 0-dim arrays. Subclasses (``IntEnum``, ``OrderedDict``,
namedtuples) come back as their base type. Non-``str`` dict keys and any other type are refused.

Zero-copy. `loads` never copies tensor bytes: arrays are views on the input buffer (read-only
when it is ``bytes``, writable for a ``bytearray``) and keep it alive. With ``tensors="torch"`` a
tensor whose bytes are not aligned to its item size in memory is copied (torch kernels assume
alignment; frames from our writer are always aligned when the buffer is 8-byte aligned), and a
zero-element tensor is a fresh empty tensor. `iter_frame` copies only the header: contiguous
little-endian tensors are handed out as views of their own memory. `dumps` copies each tensor's
bytes exactly once, into an exactly sized ``bytes``.

Errors. Every failure on bad input raises `DSSError` (a ``ValueError``) with ``.code`` (an
`ErrorCode`, whose value is the wire code of ``proto/arctic/v1/errors.proto``), ``.path`` (the
tree path or header field) and ``.expected``; no ``KeyError``, ``TypeError``, ``struct.error`` or
JSON error escapes. Reader checks run in the order of DSSST1.md §6 and the first failure is
reported. `Limits` holds the §7 limits; readers apply their own, writers the peer's.

Chunk groups. `encode_chunks` / `iter_chunks` always produce chunk frames (even one), at most
``max_bytes`` each, with an optional ``payload_crc32``. `ChunkAssembler` checks each chunk in the
order of §8, refuses an oversize group before allocating, writes every payload once into one
buffer of the frame's size and verifies the SHA-256. `decode_chunks` is the all-at-once form
(a lone non-chunk frame passes through). `inline_envelope`, `result_chunk_event` and their
decoders are the base64 forms of §9.

torch is optional: it is imported only to decode with ``tensors="torch"`` and is used for
encoding only when a value already holds a ``torch.Tensor``.
"""

from __future__ import annotations

from ._assembler import ChunkAssembler, decode_chunks
from ._chunks import ChunkDescriptor, encode_chunks, iter_chunks, read_chunk_descriptor
from ._envelope import (
    assemble_result_events,
    decode_inline_envelope,
    decode_result_chunk_event,
    inline_envelope,
    result_chunk_event,
)
from ._errors import DSSError, ErrorCode
from ._format import DTYPE_NAMES, VERSION, Limits
from ._reader import loads, peek_metadata, read_metadata
from ._writer import EncodedFrame, dumps, iter_frame

__all__ = [
    "DTYPE_NAMES",
    "VERSION",
    "ChunkAssembler",
    "ChunkDescriptor",
    "DSSError",
    "EncodedFrame",
    "ErrorCode",
    "Limits",
    "assemble_result_events",
    "decode_chunks",
    "decode_inline_envelope",
    "decode_result_chunk_event",
    "dumps",
    "encode_chunks",
    "inline_envelope",
    "iter_chunks",
    "iter_frame",
    "loads",
    "peek_metadata",
    "read_chunk_descriptor",
    "read_metadata",
    "result_chunk_event",
]

for _name in __all__:
    _obj = globals()[_name]
    if hasattr(_obj, "__module__") and callable(_obj):
        _obj.__module__ = __name__
del _name, _obj
