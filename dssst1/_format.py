"""Constants of the DSSST1 v1 format: names, signatures, the dtype table and the limits.

Everything a reader or writer needs to agree on bytes lives here, once (`proto/DSSST1.md` §1-§4,
§7); no other module spells these literals.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "CHUNK_PAYLOAD_KEY",
    "DEFAULT_LIMITS",
    "DTYPE_ITEMSIZE",
    "DTYPE_NAMES",
    "MAX_NDIM",
    "METADATA_KEY",
    "OP_KEY",
    "PICKLE_SIGNATURES",
    "PLACEHOLDER_NAME",
    "REQUEST_CHUNK_KEY",
    "RESERVED_NAMES",
    "RESULT_CHUNK_KEY",
    "ROOT_NAME",
    "STRUCTURE_KEY",
    "VERSION",
    "ZIP_SIGNATURE",
    "Limits",
]

#: The version string of `dss.v` (DSSST1.md §11).
VERSION = "DSSST1"

#: The safetensors header key that holds the string-to-string metadata map.
METADATA_KEY = "__metadata__"
#: The metadata key of the structure document ``{"v": ..., "tree": ...}``.
STRUCTURE_KEY = "dss"
#: The metadata key of the operation metadata object.
OP_KEY = "op"
#: Operation-metadata keys of chunk descriptors, by chunk kind.
REQUEST_CHUNK_KEY = "request_chunk"
RESULT_CHUNK_KEY = "result_chunk"
#: The value key of a chunk frame, ``{"payload": <1-D U8>}``.
CHUNK_PAYLOAD_KEY = "payload"

#: The placeholder tensor a writer adds when the value holds no tensor (DSSST1.md §5.8).
PLACEHOLDER_NAME = "__dss_empty__"
#: The tensor name of a bare tensor at the root (the dotted path of the root is empty).
ROOT_NAME = "__root__"
#: Names a writer never gives a tensor without a ``~N`` suffix (DSSST1.md §5.2).
RESERVED_NAMES = frozenset({METADATA_KEY, PLACEHOLDER_NAME})

#: R2: pickle protocol 2-5 start with PROTO (0x80) and the protocol number.
PICKLE_SIGNATURES = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")
#: R3: a zip local file header, as written by ``torch.save``.
ZIP_SIGNATURE = b"PK\x03\x04"

#: The dtype table of DSSST1.md §4: name -> item size in bytes, in the table's order.
DTYPE_ITEMSIZE: dict[str, int] = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U64": 8,
    "U32": 4,
    "U16": 2,
    "U8": 1,
    "BOOL": 1,
    "C64": 8,
}
DTYPE_NAMES = tuple(DTYPE_ITEMSIZE)

#: The most dimensions a tensor may have. The spec sets no bound; NumPy (and therefore the
#: NumPy adapter) holds at most 64, so a reader refuses more in R14 instead of failing later.
MAX_NDIM = 64

_KIB = 1024
_MIB = 1024 * _KIB
_GIB = 1024 * _MIB


@dataclass(frozen=True, slots=True)
class Limits:
    """Reader (and writer) limits; the defaults are those of DSSST1.md §7.

    Readers apply their own limits; writers keep under the limits the peer advertises (pass the
    peer's `Limits` to the writer functions). Every limit is checked before the allocation it
    bounds.

    Attributes:
        max_header_bytes: largest header length ``N`` (R4, ``header_too_large``).
        max_tensors: most tensor entries per frame (R13, ``too_many_tensors``).
        max_depth: deepest structure-tree nesting (R19, ``tree_too_deep``); the root node is at
            depth 1 and each ``d``/``l``/``u`` level adds one.
        max_frame_bytes: largest reassembled frame of a chunk group (``frame_too_large``); 4 GiB
            is the request default, a server sets and advertises its own.
        max_chunk_bytes: largest chunk frame (``chunk_too_large``): 60 MiB over HTTP; use
            ``GRPC_CHUNK_BYTES`` (4 MiB) for gRPC messages.
        max_chunks: most chunks per group (``too_many_chunks``).
    """

    max_header_bytes: int = 64 * _MIB
    max_tensors: int = 262_144
    max_depth: int = 64
    max_frame_bytes: int = 4 * _GIB
    max_chunk_bytes: int = 60 * _MIB
    max_chunks: int = 65_536

    #: The HTTP body cap of the deployed system (the default `max_chunk_bytes`).
    HTTP_CHUNK_BYTES = 60 * _MIB
    #: The default gRPC message cap.
    GRPC_CHUNK_BYTES = 4 * _MIB

    def __post_init__(self) -> None:
        for name in (
            "max_header_bytes",
            "max_tensors",
            "max_depth",
            "max_frame_bytes",
            "max_chunk_bytes",
            "max_chunks",
        ):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"Limits.{name} must be a positive int, got {value!r}")


DEFAULT_LIMITS = Limits()
