"""The codec's one error type and its stable codes (`proto/DSSST1.md` §6, §8, §9, §12).

Every failure of every public function of `dssst1` on bad input is a `DSSError` carrying one
`ErrorCode`; the code strings are the JSON form of `arctic.v1.ErrorCode` in
`proto/arctic/v1/errors.proto`, which binds each to an HTTP and a gRPC status.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

__all__ = ["DSSError", "ErrorCode"]


class ErrorCode(StrEnum):
    """Stable DSSST1 error codes. Each member's value is the code string that travels on the wire.

    Every member carries its own docstring (``ErrorCode.TREE_INVALID.__doc__``).
    """

    def __new__(cls, value: str, doc: str = "") -> ErrorCode:
        member = str.__new__(cls, value)
        member._value_ = value
        member.__doc__ = doc
        return member

    # Reader checks R1..R23, in the order a reader runs them (DSSST1.md §6).
    FRAME_TOO_SHORT = (
        "frame_too_short",
        "R1: the frame has fewer than 8 bytes.",
    )
    PICKLE_REFUSED = (
        "pickle_refused",
        "R2: the frame starts with a pickle protocol 2-5 opcode; pickles are never decoded.",
    )
    ZIP_REFUSED = (
        "zip_refused",
        "R3: the frame starts with ``PK 03 04`` (a ``torch.save`` zip archive).",
    )
    HEADER_TOO_LARGE = (
        "header_too_large",
        "R4: the declared header length exceeds ``Limits.max_header_bytes``.",
    )
    HEADER_LENGTH_INVALID = (
        "header_length_invalid",
        "R5: the header length is 0 or runs past the end of the frame.",
    )
    HEADER_NOT_UTF8 = (
        "header_not_utf8",
        "R6: the header bytes are not valid UTF-8.",
    )
    HEADER_NOT_JSON = (
        "header_not_json",
        "R7: the header is not a (standard) JSON object.",
    )
    HEADER_DUPLICATE_KEY = (
        "header_duplicate_key",
        "R8: a key occurs twice in one object of the header.",
    )
    METADATA_INVALID = (
        "metadata_invalid",
        "R9: ``__metadata__`` is missing, not a string map, or ``op`` is not a JSON object"
        " (writers: ``op`` metadata that is not a JSON object of standard JSON).",
    )
    STRUCTURE_MISSING = (
        "structure_missing",
        "R10: ``__metadata__`` has no ``dss`` key.",
    )
    STRUCTURE_NOT_JSON = (
        "structure_not_json",
        "R11: the ``dss`` string is not JSON, or not an object with ``v`` and ``tree``.",
    )
    UNSUPPORTED_VERSION = (
        "unsupported_version",
        'R12: ``dss.v`` is not ``"DSSST1"`` (also: an envelope\'s ``wire_format`` is not DSSST1).',
    )
    TOO_MANY_TENSORS = (
        "too_many_tensors",
        "R13: more tensor entries than ``Limits.max_tensors``.",
    )
    TENSOR_ENTRY_INVALID = (
        "tensor_entry_invalid",
        "R14: a tensor entry is not exactly ``dtype``, ``shape`` and ``data_offsets``"
        " of the right types (or has more dimensions than array libraries hold).",
    )
    DTYPE_UNKNOWN = (
        "dtype_unknown",
        "R15: a dtype name that is not in the dtype table of §4.",
    )
    TENSOR_SIZE_MISMATCH = (
        "tensor_size_mismatch",
        "R16: ``product(shape) * itemsize`` differs from the entry's byte range.",
    )
    OFFSETS_INVALID = (
        "offsets_invalid",
        "R17: the byte ranges leave a gap, overlap, or run past the data section.",
    )
    TRAILING_BYTES = (
        "trailing_bytes",
        "R18: bytes follow the last tensor.",
    )
    TREE_TOO_DEEP = (
        "tree_too_deep",
        "R19: the structure tree nests deeper than ``Limits.max_depth`` (writers refuse it too).",
    )
    TREE_INVALID = (
        "tree_invalid",
        "R20: a structure node is not one of the forms of §3, or has a bad flag.",
    )
    TENSOR_MISSING = (
        "tensor_missing",
        "R21: a ``t`` node names a tensor that is not in the header.",
    )
    SCALAR_SHAPE_INVALID = (
        "scalar_shape_invalid",
        "R22: a ``scalar``-flagged tensor whose stored shape is not ``[1]``.",
    )
    TENSOR_UNREFERENCED = (
        "tensor_unreferenced",
        "R23: a tensor other than the placeholder ``__dss_empty__`` is named by no node.",
    )

    # Writer failures (§5, §12).
    DICT_KEY_NOT_STRING = (
        "dict_key_not_string",
        "Writer: a dict key is not a ``str``; DSSST1 v1 has no node that keeps it.",
    )
    UNSUPPORTED_TYPE = (
        "unsupported_type",
        "Writer: a value of a type the codec cannot encode"
        " (also: a reader input that is not a bytes-like object).",
    )

    # Chunk groups (§7, §8).
    CHUNK_TOO_LARGE = (
        "chunk_too_large",
        "A chunk frame exceeds ``Limits.max_chunk_bytes``, or ``max_bytes`` cannot hold one chunk.",
    )
    CHUNK_DESCRIPTOR_MISSING = (
        "chunk_descriptor_missing",
        "A frame in a chunk group has no ``request_chunk`` / ``result_chunk`` descriptor.",
    )
    CHUNK_KIND_MISMATCH = (
        "chunk_kind_mismatch",
        "A request descriptor where a result was expected, or the reverse.",
    )
    CHUNK_DESCRIPTOR_INVALID = (
        "chunk_descriptor_invalid",
        "A descriptor field is missing, has the wrong type, or is out of range.",
    )
    CHUNK_PAYLOAD_INVALID = (
        "chunk_payload_invalid",
        "The chunk's value is not ``{'payload': 1-D U8}``,"
        " or its length breaks the group's layout.",
    )
    TOO_MANY_CHUNKS = (
        "too_many_chunks",
        "``total_chunks`` exceeds ``Limits.max_chunks``.",
    )
    FRAME_TOO_LARGE = (
        "frame_too_large",
        "``frame_size_bytes`` exceeds ``Limits.max_frame_bytes`` (checked before buffering).",
    )
    CHUNK_INCONSISTENT = (
        "chunk_inconsistent",
        "A group field differs from the group's first chunk.",
    )
    CHUNK_DUPLICATE_CONFLICT = (
        "chunk_duplicate_conflict",
        "A chunk index arrived twice with different payload bytes.",
    )
    CHUNK_CHECKSUM_MISMATCH = (
        "chunk_checksum_mismatch",
        "A chunk's ``payload_crc32`` (or an event's ``payload_sha256``) does not match its bytes.",
    )
    CHUNK_MISSING = (
        "chunk_missing",
        "The group was finished while chunks are missing; the error lists them.",
    )
    FRAME_SIZE_MISMATCH = (
        "frame_size_mismatch",
        "The reassembled length differs from ``frame_size_bytes``.",
    )
    FRAME_SHA256_MISMATCH = (
        "frame_sha256_mismatch",
        "The reassembled bytes' SHA-256 differs from ``frame_sha256``.",
    )

    # JSON transports (§9).
    BASE64_INVALID = (
        "base64_invalid",
        "A base64 envelope's payload is missing or does not decode as standard padded base64.",
    )


def _short(value: object, limit: int = 80) -> str:
    """A bounded ``repr`` for messages: error text must stay small whatever the input was."""
    try:
        text = repr(value)
    except Exception:  # a hostile __repr__ must not mask the codec error
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


class DSSError(ValueError):
    """A DSSST1 codec failure.

    Attributes:
        code: the stable `ErrorCode` (a ``str``).
        path: where the failure is — a tree path (``tree.kwargs.input_ids``), a header field
            (``header["x"].shape``) or an argument name.
        expected: what the codec expected there.
        got: what it found, when that helps (bounded in length), else ``None``.
    """

    code: ErrorCode
    path: str
    expected: str
    got: str | None

    def __init__(
        self, code: ErrorCode | str, path: str, expected: str, got: str | None = None
    ) -> None:
        self.code = ErrorCode(code)
        self.path = path
        self.expected = expected
        self.got = got
        message = f"[{self.code.value}] at {path}: expected {expected}"
        if got is not None:
            message += f", got {got}"
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        # Keep the error picklable across processes (servers hand errors between workers).
        return (type(self), (self.code.value, self.path, self.expected, self.got))

    def details(self) -> dict[str, str]:
        """The machine-readable ``details`` of an error body (``errors.proto`` ``Error``)."""
        out = {"field": self.path, "expected": self.expected}
        if self.got is not None:
            out["got"] = self.got
        return out


def got_type(value: object) -> str:
    """The type name of a value, for ``got`` texts."""
    kind = type(value)
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


def got_value(value: object) -> str:
    """A bounded representation of a value, for ``got`` texts."""
    return _short(value)
