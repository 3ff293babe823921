"""Public reading: `loads`, `read_metadata`, `peek_metadata` (`proto/DSSST1.md` §6).

A frame is decoded in three steps: the header checks R1-R18 (`_header`), the tree checks
R19-R23 with tensor views made by an adapter (`_tree`), and nothing else — no tensor byte is
touched, so decoding costs the same for 1 KiB and 1 GiB of tensors.
"""

from __future__ import annotations

from typing import Any, Literal

from ._errors import DSSError, ErrorCode, got_value
from ._fast import parse_fast
from ._format import DEFAULT_LIMITS, Limits
from ._header import Entry, Header, as_buffer, parse_metadata, parse_ordered, read_pairs
from ._numpy import numpy_factory
from ._tree import MakeTensor, build_value

__all__ = [
    "RawTensor",
    "decode_raw",
    "loads",
    "parse_frame",
    "peek_metadata",
    "read_metadata",
]

TensorKind = Literal["numpy", "torch"]


def loads(data: object, *, tensors: TensorKind = "numpy", limits: Limits | None = None) -> Any:
    """Decode one DSSST1 frame into the value it holds.

    Args:
        data: the frame: ``bytes``, ``bytearray``, ``memoryview``, ``mmap`` or any C-contiguous
            buffer. It is not copied: tensors are views on it, and keep it alive.
        tensors: ``"numpy"`` (default) returns ``numpy.ndarray`` views (bfloat16 and float8 via
            ``ml_dtypes``), read-only when ``data`` is; ``"torch"`` returns ``torch.Tensor`` views
            (see `dssst1._torch` for the two cases that copy).
        limits: the reader limits; the defaults of DSSST1.md §7 when ``None``.

    Returns:
        The value: dicts, lists, tuples, JSON scalars, tensors; a ``py: float`` tensor decodes to a
        Python ``float`` and a ``py: bytes`` tensor to ``bytes``; scalar tensors are 0-dim.

    Raises:
        DSSError: the first failing check of DSSST1.md §6, with its code; also
            ``unsupported_type`` when ``data`` is not bytes-like or ``tensors`` is unknown.
        ImportError: ``tensors="torch"`` without torch installed.
    """
    if tensors != "numpy" and tensors != "torch":
        raise DSSError(
            ErrorCode.UNSUPPORTED_TYPE, "tensors", '"numpy" or "torch"', got_value(tensors)
        )
    lim = DEFAULT_LIMITS if limits is None else limits
    buffer = as_buffer(data)
    header = parse_frame(buffer, lim)
    if tensors == "numpy":
        return build_value(header, numpy_factory(buffer), lim.max_depth)
    from ._torch import quiet_readonly, torch_factory

    make = torch_factory(buffer)
    with quiet_readonly(buffer):
        return build_value(header, make, lim.max_depth)


def read_metadata(data: object, *, limits: Limits | None = None) -> dict[str, Any]:
    """The ``op`` metadata object of a frame (``{}`` when the frame has none).

    Strict: runs the header checks R1-R9 (the ones that concern the header and its metadata) and
    raises their `DSSError`. It does not look at tensors or the structure tree, so it is cheap on
    any frame; `loads` still runs every check.
    """
    lim = DEFAULT_LIMITS if limits is None else limits
    _, op = parse_metadata(as_buffer(data), lim)
    return op


def peek_metadata(data: object, *, limits: Limits | None = None) -> dict[str, Any]:
    """Lenient `read_metadata`: ``{}`` for anything that is not a frame with ``op`` metadata.

    This is the deployed v1 ``read_metadata`` behaviour (``read_metadata(b"not-a-frame") == {}``),
    for callers that only route on metadata and leave errors to `loads`.
    """
    try:
        return read_metadata(data, limits=limits)
    except DSSError:
        return {}


def parse_frame(buffer: memoryview, limits: Limits) -> Header:
    """R1-R18: the one-pass validator for usual frames, the ordered checks for the rest."""
    pairs = read_pairs(buffer, limits)
    return parse_fast(buffer, pairs, limits) or parse_ordered(buffer, pairs, limits)


class RawTensor:
    """A tensor as `decode_raw` returns it: dtype name, shape and a memoryview of its bytes."""

    __slots__ = ("data", "dtype", "shape")

    def __init__(self, dtype: str, shape: tuple[int, ...], data: memoryview) -> None:
        self.dtype = dtype
        self.shape = shape
        self.data = data

    def __repr__(self) -> str:
        return f"RawTensor({self.dtype}, {list(self.shape)}, {self.data.nbytes} bytes)"


def _raw_factory(buffer: memoryview) -> MakeTensor:
    def make(entry: Entry) -> Any:
        dtype, shape, offset, nbytes = entry
        return RawTensor(dtype, shape, buffer[offset : offset + nbytes])

    return make


def decode_raw(data: object, limits: Limits | None = None) -> tuple[Any, Header]:
    """Decode a frame with `RawTensor` leaves (no array library); also return its header.

    Runs every check of `loads`. The chunk assembler uses it to read chunk frames.
    """
    lim = DEFAULT_LIMITS if limits is None else limits
    buffer = as_buffer(data)
    header = parse_frame(buffer, lim)
    return build_value(header, _raw_factory(buffer), lim.max_depth), header
