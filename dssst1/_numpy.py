"""The NumPy adapter: DSSST1 dtypes <-> NumPy dtypes, tensor views for readers, bytes for writers.

bfloat16 and the two float8 formats map to `ml_dtypes` (DSSST1.md §4), imported when first
needed: a frame with such a tensor, or an array of such a dtype (whose caller has imported it
already). Importing `ml_dtypes` registers its types with NumPy, seconds of CPU on a busy 2-core
machine, which every server, runner and worker process would otherwise pay at start. Decoded
arrays are views on the frame buffer (``np.shares_memory`` holds); they are read-only when the
buffer is (``bytes``), and may be unaligned when the frame buffer itself is not 8-byte aligned
(NumPy supports that).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ._errors import DSSError, ErrorCode
from ._header import Entry
from ._tree import MakeTensor

__all__ = [
    "NUMPY_DTYPES",
    "TensorBytes",
    "array_bytes",
    "dtype_name",
    "numpy_factory",
]

# The DSSST1 names of the ml_dtypes extension types (kind "V"), by their ml_dtypes attribute.
_EXTENSION_TYPES = {"BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}


class _Dtypes(dict[str, "np.dtype[Any]"]):
    """DSSST1 dtype name -> NumPy dtype; the extension types' entries appear on first lookup."""

    def __missing__(self, key: str) -> np.dtype[Any]:
        if key in _EXTENSION_TYPES and key not in self:
            _load_extension_types()
            return self[key]
        raise KeyError(key)


#: DSSST1 dtype name -> NumPy dtype (little-endian); BF16 / F8_* once `ml_dtypes` is loaded.
NUMPY_DTYPES: dict[str, np.dtype[Any]] = _Dtypes(
    {
        "F64": np.dtype("<f8"),
        "F32": np.dtype("<f4"),
        "F16": np.dtype("<f2"),
        "I64": np.dtype("<i8"),
        "I32": np.dtype("<i4"),
        "I16": np.dtype("<i2"),
        "I8": np.dtype("i1"),
        "U64": np.dtype("<u8"),
        "U32": np.dtype("<u4"),
        "U16": np.dtype("<u2"),
        "U8": np.dtype("u1"),
        "BOOL": np.dtype("?"),
        "C64": np.dtype("<c8"),
    }
)

# Standard dtypes are found by (kind, itemsize), which also covers platform aliases such as
# ``np.longlong``; the ml_dtypes extension types (kind "V") are found by their scalar type.
_BY_KIND: dict[tuple[str, int], str] = {
    (dt.kind, dt.itemsize): name for name, dt in NUMPY_DTYPES.items()
}
_BY_TYPE: dict[type, str] = {}
_BIG_ENDIAN_HOST = sys.byteorder == "big"
_U8 = np.dtype(np.uint8)


def _load_extension_types() -> None:
    import ml_dtypes

    for name, attr in _EXTENSION_TYPES.items():
        dt = np.dtype(getattr(ml_dtypes, attr))
        NUMPY_DTYPES[name] = dt
        _BY_TYPE[dt.type] = name
        _BY_NUM[dt.num] = name


#: A tensor ready to be written: (dtype name, shape, its bytes as a flat ``B`` memoryview).
TensorBytes = tuple[str, list[int], memoryview]


def dtype_name(dtype: np.dtype[Any]) -> str | None:
    """The DSSST1 name of a NumPy dtype, or ``None`` when DSSST1 has no such dtype."""
    if dtype.kind == "V":
        if dtype.fields is not None:
            return None
        if not _BY_TYPE:
            _load_extension_types()
        return _BY_TYPE.get(dtype.type)
    return _BY_KIND.get((dtype.kind, dtype.itemsize))


# dtype.num -> name for the native-order dtypes (the common case: one dict lookup). NumPy has
# several type numbers per size (``long`` and ``longlong``, ``int`` and ``intc``...).
# (the extension types join once loaded, `_load_extension_types`)
_NATIVE_TYPES = (
    np.byte, np.ubyte, np.short, np.ushort, np.intc, np.uintc, np.int_, np.uint, np.longlong,
    np.ulonglong, np.half, np.single, np.double, np.csingle, np.bool_,
)  # fmt: skip
_BY_NUM: dict[int, str] = {
    np.dtype(t).num: name for t in _NATIVE_TYPES if (name := dtype_name(np.dtype(t))) is not None
}


def array_bytes(array: np.ndarray[Any, Any], path: str) -> TensorBytes:
    """The DSSST1 dtype, shape and little-endian C-order bytes of an array.

    Contiguous little-endian arrays are not copied: the returned memoryview is a view of the
    array's own memory. Non-contiguous arrays are copied into C order, big-endian arrays into
    little-endian, each with one copy.
    """
    dtype = array.dtype
    name = _BY_NUM.get(dtype.num) if dtype.isnative and not _BIG_ENDIAN_HOST else None
    if name is None:
        name = dtype_name(dtype)
        if name is None:
            raise DSSError(
                ErrorCode.UNSUPPORTED_TYPE, path, "an array of a DSSST1 dtype", f"dtype {dtype}"
            )
        order = dtype.byteorder
        if order == ">" or (order == "=" and _BIG_ENDIAN_HOST):
            shape = list(array.shape)
            little = array.astype(dtype.newbyteorder("<"), order="C")
            return name, shape, little.reshape(-1).view(_U8).data
    shape = list(array.shape)  # before np.ascontiguousarray, which makes 0-dim arrays 1-D
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    return name, shape, array.reshape(-1).view(_U8).data


def numpy_factory(buffer: memoryview) -> MakeTensor:
    """A tensor factory that returns NumPy views on ``buffer``."""
    dtypes = NUMPY_DTYPES
    ndarray = np.ndarray

    def make(entry: Entry) -> Any:
        return ndarray(entry[1], dtypes[entry[0]], buffer, entry[2])

    return make
