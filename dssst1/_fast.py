"""The one-pass header validator for well-formed frames (R8-R18 at the speed of a loop).

`parse_fast` accepts exactly the headers that pass R8-R18 and that are laid out the usual way
(tensor entries with their keys in the order ``dtype``, ``shape``, ``data_offsets``, as every
safetensors writer and ours emit them). It never raises: for anything else — any failing check,
an unusual key order — it returns ``None`` and the reader runs `dssst1._header.parse_ordered`,
which checks R8-R18 one by one in the spec's order and reports the first failure. So the fast
path decides nothing the ordered path would decide differently; it only skips building a dict
per tensor entry and the per-check passes (``tests/codec/test_fuzz.py`` compares the two on
mutated frames).
"""

from __future__ import annotations

from typing import Any

from ._format import DTYPE_ITEMSIZE, MAX_NDIM, METADATA_KEY, OP_KEY, STRUCTURE_KEY, VERSION, Limits
from ._header import Entry, Header, representable
from ._json import JSON_ERRORS, loads_inner

__all__ = ["parse_fast"]


def parse_fast(
    buffer: memoryview, pairs: tuple[tuple[str, Any], ...], limits: Limits
) -> Header | None:
    """The validated header, or ``None`` when the ordered checks must decide."""
    data_start = 8 + int.from_bytes(buffer[:8], "little")
    entries: dict[str, Entry] = {}
    meta_pairs: Any = None
    itemsizes = DTYPE_ITEMSIZE
    for name, entry in pairs:  # R14-R16, entries in the usual key order; None at the first doubt
        if name == METADATA_KEY:
            if meta_pairs is not None:
                return None
            meta_pairs = entry
            continue
        if type(entry) is not tuple or len(entry) != 3:
            return None
        (k1, dtype), (k2, shape), (k3, offsets) = entry
        if k1 != "dtype" or k2 != "shape" or k3 != "data_offsets":
            return None
        itemsize = itemsizes.get(dtype) if type(dtype) is str else None
        if (
            itemsize is None
            or type(shape) is not list
            or len(shape) > MAX_NDIM
            or type(offsets) is not list
            or len(offsets) != 2
        ):
            return None
        begin, end = offsets
        if type(begin) is not int or type(end) is not int or not 0 <= begin <= end:
            return None
        count = itemsize
        for dim in shape:  # at most MAX_NDIM factors: the exact product stays cheap
            if type(dim) is not int or dim < 0:
                return None
            count *= dim
        nbytes = end - begin
        if count != nbytes or (count == 0 and not representable(shape, itemsize)):
            return None
        entries[name] = (dtype, tuple(shape), data_start + begin, nbytes)
    # R8 (no repeated key), R9-R13
    if type(meta_pairs) is not tuple or len(entries) != len(pairs) - 1:
        return None
    meta = dict(meta_pairs)
    if len(meta) != len(meta_pairs) or len(entries) > limits.max_tensors:
        return None
    for text in meta.values():
        if type(text) is not str:
            return None
    try:
        op_text = meta.get(OP_KEY)
        op = loads_inner(op_text) if op_text else {}
        dss = loads_inner(meta[STRUCTURE_KEY])
    except (*JSON_ERRORS, KeyError):
        return None
    if type(op) is not dict or type(dss) is not dict or dss.get("v") != VERSION:
        return None
    if "tree" not in dss or not _tiles(entries, len(buffer), data_start):  # R17, R18
        return None
    return Header(buffer, entries, meta, op, dss["tree"])


def _tiles(entries: dict[str, Entry], frame_len: int, data_start: int) -> bool:
    """R17-R18 without a report: the ranges, sorted by (begin, end), tile the data section."""
    pos = data_start
    for _, _, begin, nbytes in entries.values():  # our writer's order: one pass, no sort
        if begin != pos:
            break
        pos = begin + nbytes
    else:
        return pos == frame_len
    pos = data_start
    for begin, end in sorted((begin, begin + nbytes) for _, _, begin, nbytes in entries.values()):
        if begin != pos:
            return False
        pos = end
    return pos == frame_len
