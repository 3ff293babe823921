"""Reader checks R1-R18: from frame bytes to a validated header (`proto/DSSST1.md` §1, §2, §6).

`read_pairs` runs R1-R7 and `parse_ordered` R8-R18, each check in the spec's order, stopping at
the first failure (entries are examined in R14 → R15 → R16 order whatever order they come in).
Usual frames do not come here for R8-R18: `dssst1._fast` validates them in one pass and falls
back to `parse_ordered` for anything else, so the error reported is always the ordered one.
"""

from __future__ import annotations

from typing import Any, cast

from ._errors import DSSError, ErrorCode, got_type, got_value
from ._format import (
    DTYPE_ITEMSIZE,
    MAX_NDIM,
    METADATA_KEY,
    OP_KEY,
    PICKLE_SIGNATURES,
    STRUCTURE_KEY,
    VERSION,
    ZIP_SIGNATURE,
    Limits,
)
from ._json import (
    JSON_ERRORS,
    deep_duplicate,
    header_dict,
    json_type,
    loads_inner,
    parse_header,
)

__all__ = [
    "Entry",
    "Header",
    "as_buffer",
    "parse_metadata",
    "parse_ordered",
    "read_pairs",
    "representable",
]

#: A validated tensor entry: (dtype name, shape, absolute begin offset in the frame, byte length).
Entry = tuple[str, tuple[int, ...], int, int]


class Header:
    """A frame that passed R1-R18 (a plain slotted class: it is built once per decode)."""

    __slots__ = ("buffer", "entries", "metadata", "op", "tree")

    def __init__(
        self,
        buffer: memoryview,
        entries: dict[str, Entry],
        metadata: dict[str, str],
        op: dict[str, Any],
        tree: Any,
    ) -> None:
        self.buffer = buffer  #: the whole frame, format ``B``
        self.entries = entries  #: tensor name -> entry, in header order
        self.metadata = metadata  #: ``__metadata__``
        self.op = op  #: the parsed ``op`` object (empty when absent)
        self.tree = tree  #: the unvalidated ``dss.tree`` (checked by `dssst1._tree`, R19-R23)


def as_buffer(data: object) -> memoryview:
    """A flat byte view of a bytes-like frame (bytes, bytearray, memoryview, mmap, arrays)."""
    if type(data) is bytes or type(data) is bytearray:
        return memoryview(data)
    try:
        view = memoryview(data)  # type: ignore[arg-type]
    except (TypeError, ValueError, BufferError) as exc:
        raise DSSError(
            ErrorCode.UNSUPPORTED_TYPE, "frame", "a bytes-like object", got_type(data)
        ) from exc
    if view.format == "B" and view.ndim == 1 and view.c_contiguous:
        return view
    if not view.c_contiguous:
        raise DSSError(
            ErrorCode.UNSUPPORTED_TYPE, "frame", "a contiguous bytes-like object", "strided"
        )
    try:
        return view.cast("B")
    except (TypeError, ValueError) as exc:
        raise DSSError(
            ErrorCode.UNSUPPORTED_TYPE, "frame", "a bytes-like object", f"format {view.format!r}"
        ) from exc


def read_pairs(buffer: memoryview, limits: Limits) -> tuple[tuple[str, Any], ...]:
    """R1-R7: the header in pair form (every JSON object a tuple of (key, value) pairs)."""
    size = len(buffer)
    if size < 8:
        raise DSSError(ErrorCode.FRAME_TOO_SHORT, "frame", "at least 8 bytes", f"{size} bytes")
    try:
        return _header_pairs(buffer, limits)
    except DSSError:
        # R2 / R3 apply only to bytes that also fail R4-R7 (DSSST1.md §6): a deployed frame whose
        # header length is 640, 896, 1152 or 1408 (mod 2^16) starts with 80 02 .. 80 05.
        prefix = bytes(buffer[:4])
        if prefix[:2] in PICKLE_SIGNATURES:
            raise DSSError(
                ErrorCode.PICKLE_REFUSED, "frame", "a DSSST1 frame, not a pickle", prefix[:2].hex()
            ) from None
        if prefix == ZIP_SIGNATURE:
            raise DSSError(
                ErrorCode.ZIP_REFUSED, "frame", "a DSSST1 frame, not a zip (torch.save) archive"
            ) from None
        raise


def _header_pairs(buffer: memoryview, limits: Limits) -> tuple[tuple[str, Any], ...]:
    """R4-R7."""
    size = len(buffer)
    length = int.from_bytes(buffer[:8], "little")
    if length > limits.max_header_bytes:
        raise DSSError(
            ErrorCode.HEADER_TOO_LARGE,
            "header length",
            f"at most {limits.max_header_bytes} bytes",
            str(length),
        )
    if length == 0 or 8 + length > size:
        raise DSSError(
            ErrorCode.HEADER_LENGTH_INVALID,
            "header length",
            f"1 to {size - 8} bytes (the frame has {size})",
            str(length),
        )
    try:
        text = str(buffer[8 : 8 + length], "utf-8")
    except UnicodeDecodeError as exc:
        raise DSSError(
            ErrorCode.HEADER_NOT_UTF8, "header", "UTF-8", f"invalid byte at {exc.start}"
        ) from exc
    return parse_header(text)


def _op(header: dict[str, Any]) -> dict[str, Any]:
    """R9: ``__metadata__`` is a string map; the parsed ``op`` object (``{}`` when absent)."""
    meta = header.get(METADATA_KEY)
    if type(meta) is not dict:
        got = "nothing" if meta is None and METADATA_KEY not in header else json_type(meta)
        raise DSSError(
            ErrorCode.METADATA_INVALID, METADATA_KEY, "an object of strings to strings", got
        )
    for key, value in meta.items():
        if type(value) is not str:
            raise DSSError(
                ErrorCode.METADATA_INVALID, f"{METADATA_KEY}[{key!r}]", "a string", json_type(value)
            )
    op_text = meta.get(OP_KEY)
    if not op_text:  # absent, or "" (which reads as {}, as the deployed read_metadata does)
        return {}
    try:
        op = loads_inner(op_text)
    except JSON_ERRORS as exc:
        raise DSSError(
            ErrorCode.METADATA_INVALID, f"{METADATA_KEY}.op", "a JSON object", str(exc)
        ) from exc
    if type(op) is not dict:
        raise DSSError(
            ErrorCode.METADATA_INVALID, f"{METADATA_KEY}.op", "a JSON object", json_type(op)
        )
    return op


def parse_metadata(buffer: memoryview, limits: Limits) -> tuple[dict[str, Any], dict[str, Any]]:
    """R1-R9: the header object and the parsed ``op`` object (``{}`` when absent)."""
    pairs = read_pairs(buffer, limits)
    header = header_dict(pairs)
    try:
        return header, _op(header)
    except DSSError as exc:
        raise deep_duplicate(pairs) or exc from None


def parse_ordered(buffer: memoryview, pairs: tuple[tuple[str, Any], ...], limits: Limits) -> Header:
    """R8-R18 on a header that passed R1-R7, each check in the spec's order."""
    header = header_dict(pairs)
    try:
        return _validate(buffer, header, limits)
    except DSSError as exc:
        raise deep_duplicate(pairs) or exc from None


def _validate(buffer: memoryview, header: dict[str, Any], limits: Limits) -> Header:
    """R9-R18 on a header that passed R1-R8."""
    op = _op(header)
    meta: dict[str, str] = header[METADATA_KEY]
    dss_text = meta.get(STRUCTURE_KEY)
    if dss_text is None:
        raise DSSError(ErrorCode.STRUCTURE_MISSING, f"{METADATA_KEY}.dss", "the structure document")
    try:
        dss = loads_inner(dss_text)
    except RecursionError as exc:  # R19: nested deeper than the parser can hold
        raise DSSError(
            ErrorCode.TREE_TOO_DEEP, f"{METADATA_KEY}.dss", f"nesting of at most {limits.max_depth}"
        ) from exc
    except ValueError as exc:
        raise DSSError(
            ErrorCode.STRUCTURE_NOT_JSON, f"{METADATA_KEY}.dss", "JSON", str(exc)
        ) from exc
    if type(dss) is not dict or "v" not in dss or "tree" not in dss:
        got = json_type(dss) if type(dss) is not dict else f"keys {sorted(dss)[:8]}"
        raise DSSError(
            ErrorCode.STRUCTURE_NOT_JSON,
            f"{METADATA_KEY}.dss",
            'an object with "v" and "tree"',
            got,
        )
    if dss["v"] != VERSION:
        raise DSSError(ErrorCode.UNSUPPORTED_VERSION, "dss.v", repr(VERSION), got_value(dss["v"]))
    count = len(header) - 1
    if count > limits.max_tensors:
        raise DSSError(
            ErrorCode.TOO_MANY_TENSORS,
            "header",
            f"at most {limits.max_tensors} tensors",
            str(count),
        )
    data_start = 8 + int.from_bytes(buffer[:8], "little")  # R5 passed: the header fits
    entries = _entries(header, data_start)
    _check_tiling(entries, len(buffer) - data_start, data_start)
    return Header(buffer, entries, meta, op, dss["tree"])


def _entries(header: dict[str, Any], data_start: int) -> dict[str, Entry]:
    """R14-R16 for every entry; one pass when all is well."""
    entries: dict[str, Entry] = {}
    itemsizes = DTYPE_ITEMSIZE
    for name, entry in header.items():
        if name == METADATA_KEY:
            continue
        if type(entry) is not dict or len(entry) != 3:
            raise _first_entry_error(header)
        dtype = entry.get("dtype")
        shape = entry.get("shape")
        offsets = entry.get("data_offsets")
        itemsize = itemsizes.get(dtype) if type(dtype) is str else None
        if (
            itemsize is None
            or type(shape) is not list
            or type(offsets) is not list
            or len(offsets) != 2
            or len(shape) > MAX_NDIM
        ):
            raise _first_entry_error(header)
        begin, end = offsets
        if type(begin) is not int or type(end) is not int or not 0 <= begin <= end:
            raise _first_entry_error(header)
        nbytes = end - begin
        count = itemsize
        for dim in shape:  # at most MAX_NDIM factors: the exact product stays cheap
            if type(dim) is not int or dim < 0:
                raise _first_entry_error(header)
            count *= dim
        if count != nbytes or (count == 0 and not representable(shape, itemsize)):
            raise _first_entry_error(header)
        entries[name] = (cast(str, dtype), tuple(shape), data_start + begin, nbytes)
    return entries


def representable(shape: list[int], itemsize: int) -> bool:
    """Whether array libraries can hold the shape: a zero-element tensor may declare dimensions
    whose product (ignoring the zeros) overflows the signed 64-bit sizes NumPy and torch use."""
    size = itemsize
    for dim in shape:
        if dim:
            size *= dim
    return size < 1 << 63


def _entry_error(name: str, entry: Any) -> tuple[int, DSSError] | None:
    """The first failing check (R14, R15, R16) of one entry, with its rank."""
    where = f"header[{name!r}]"
    shape_text = "shape (a list of non-negative integers)"
    expected = f"exactly dtype (a string), {shape_text} and data_offsets ([begin, end])"
    if type(entry) is not dict or set(entry) != {"dtype", "shape", "data_offsets"}:
        got = json_type(entry) if type(entry) is not dict else f"keys {sorted(entry)[:8]}"
        return 14, DSSError(ErrorCode.TENSOR_ENTRY_INVALID, where, expected, got)
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if type(dtype) is not str:
        return 14, DSSError(
            ErrorCode.TENSOR_ENTRY_INVALID, f"{where}.dtype", "a string", json_type(dtype)
        )
    if type(shape) is not list or any(type(d) is not int or d < 0 for d in shape):
        return 14, DSSError(
            ErrorCode.TENSOR_ENTRY_INVALID, f"{where}.shape", shape_text, got_value(shape)
        )
    if len(shape) > MAX_NDIM:
        return 14, DSSError(
            ErrorCode.TENSOR_ENTRY_INVALID,
            f"{where}.shape",
            f"at most {MAX_NDIM} dimensions",
            str(len(shape)),
        )
    itemsize = DTYPE_ITEMSIZE.get(dtype, 1)
    if 0 in shape and not representable(shape, itemsize):
        return 14, DSSError(
            ErrorCode.TENSOR_ENTRY_INVALID,
            f"{where}.shape",
            "dimensions whose non-zero product times the item size is below 2^63",
            got_value(shape),
        )
    if (
        type(offsets) is not list
        or len(offsets) != 2
        or any(type(o) is not int or o < 0 for o in offsets)
        or offsets[0] > offsets[1]
    ):
        return 14, DSSError(
            ErrorCode.TENSOR_ENTRY_INVALID,
            f"{where}.data_offsets",
            "[begin, end] with 0 <= begin <= end",
            got_value(offsets),
        )
    if dtype not in DTYPE_ITEMSIZE:
        return 15, DSSError(
            ErrorCode.DTYPE_UNKNOWN, f"{where}.dtype", "a dtype of DSSST1.md §4", got_value(dtype)
        )
    nbytes = offsets[1] - offsets[0]
    count = itemsize
    for dim in shape:
        count *= dim
    if count != nbytes:
        declared = f"{count} bytes" if count < 1 << 64 else "more than 2^64 bytes"
        return 16, DSSError(
            ErrorCode.TENSOR_SIZE_MISMATCH,
            where,
            f"shape x itemsize == end - begin ({nbytes} bytes)",
            declared,
        )
    return None


def _first_entry_error(header: dict[str, Any]) -> DSSError:
    best: tuple[int, DSSError] | None = None
    for name, entry in header.items():
        if name == METADATA_KEY:
            continue
        found = _entry_error(name, entry)
        if found is not None and (best is None or found[0] < best[0]):
            best = found
            if found[0] == 14:
                break
    if best is None:  # pragma: no cover - the fast path and this function agree by construction
        return DSSError(ErrorCode.TENSOR_ENTRY_INVALID, "header", "valid tensor entries")
    return best[1]


def _check_tiling(entries: dict[str, Entry], data_len: int, data_start: int) -> None:
    """R17-R18: the ranges tile the data section exactly."""
    pos = data_start
    for _, _, begin, nbytes in entries.values():
        if begin != pos:
            break
        pos = begin + nbytes
    else:
        if pos - data_start <= data_len:
            if pos - data_start < data_len:
                raise _trailing(pos - data_start, data_len)
            return
    spans = sorted(
        ((begin - data_start, begin - data_start + nbytes, name))
        for name, (_, _, begin, nbytes) in entries.items()
    )
    pos = 0
    for begin, end, name in spans:
        if begin != pos or end > data_len:
            what = "a gap" if begin > pos else "an overlap" if begin < pos else "past the data"
            raise DSSError(
                ErrorCode.OFFSETS_INVALID,
                f"header[{name!r}].data_offsets",
                f"[{pos}, ...] within the {data_len}-byte data section",
                f"[{begin}, {end}] ({what})",
            )
        pos = end
    if pos < data_len:
        raise _trailing(pos, data_len)


def _trailing(end: int, data_len: int) -> DSSError:
    return DSSError(
        ErrorCode.TRAILING_BYTES,
        "data section",
        f"tensors ending at the frame's end ({end} bytes)",
        f"{data_len - end} trailing bytes",
    )
