"""The DSSST1 writer: values -> frames (`proto/DSSST1.md` §1, §3, §5).

`iter_frame` encodes a value into an `EncodedFrame`: the header bytes plus memoryviews of each
tensor's own memory, with the total length known up front. Only header bytes are produced;
contiguous little-endian tensors are not copied (a non-contiguous or big-endian one is copied once
into C-order little-endian bytes). `dumps` joins those buffers into one ``bytes``: one copy of the
payload into an exactly sized allocation.

Value mapping (writer rules §5):

* ``None``, ``bool``, ``int``, finite ``float``, ``str`` and lists / string-keyed dicts made only
  of those are exact JSON and become one ``["j", value]`` leaf. Subclasses of these types (an
  ``IntEnum``, a ``defaultdict``) are written as their base type and decode as it.
* any other dict / list is a ``d`` / ``l`` node; a tuple is always a ``u`` node (namedtuples
  decode as plain tuples). A non-``str`` dict key is refused (``dict_key_not_string``).
* a NaN / infinite ``float`` is a scalar ``F64`` tensor flagged ``py: float``; ``bytes`` /
  ``bytearray`` a 1-D ``U8`` tensor flagged ``py: bytes``.
* NumPy arrays and torch tensors of the §4 dtypes are tensors; 0-dim ones are stored with shape
  ``[1]`` and flagged ``scalar``. NumPy scalars (``np.float32(1)``, ``np.bool_``...) are
  written as 0-dim arrays and decode as 0-dim arrays, not as NumPy scalars.
* anything else is refused (``unsupported_type``).
"""

from __future__ import annotations

import json
import json.encoder
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._errors import DSSError, ErrorCode, got_type
from ._format import (
    DEFAULT_LIMITS,
    DTYPE_ITEMSIZE,
    METADATA_KEY,
    OP_KEY,
    PLACEHOLDER_NAME,
    RESERVED_NAMES,
    ROOT_NAME,
    STRUCTURE_KEY,
    VERSION,
    Limits,
)
from ._numpy import array_bytes, dtype_name
from ._torch import is_torch_tensor, tensor_bytes

__all__ = [
    "EncodedFrame",
    "Record",
    "assemble_frame",
    "dumps",
    "frame_header",
    "iter_frame",
    "op_metadata_text",
]

#: A tensor to write: (name, dtype name, shape, flat ``B`` memoryview of its bytes).
Record = tuple[str, str, list[int], memoryview]

_PLACEHOLDER_BYTES = memoryview(b"\x00")
_SCALAR_FLAGS = {"scalar": True}
_FLOAT_FLAGS = {"scalar": True, "py": "float"}
_BYTES_FLAGS = {"py": "bytes"}
_COMPACT = (",", ":")
_quote: Callable[[str], str] = json.encoder.encode_basestring_ascii
#: Header lengths whose little-endian first two bytes read 80 02 .. 80 05 (DSSST1.md §5.1).
_PICKLE_LIKE_LENGTHS = frozenset({0x0280, 0x0380, 0x0480, 0x0580})


@dataclass(frozen=True, slots=True)
class EncodedFrame:
    """A DSSST1 frame as a sequence of buffers: ``header`` then the tensors' bytes.

    Iterating yields the buffers in frame order; their lengths add up to `nbytes` (use it as the
    Content-Length). The tensor buffers are views of the encoded arrays' memory: do not modify
    those arrays until the frame has been written out.
    """

    header: bytes  #: the 8-byte length prefix and the space-padded JSON header
    buffers: tuple[memoryview, ...]  #: the tensors' bytes in offset order (empty ones left out)
    nbytes: int  #: the frame's total length

    def __iter__(self) -> Iterator[bytes | memoryview]:
        yield self.header
        yield from self.buffers

    def tobytes(self) -> bytes:
        """The whole frame as one ``bytes`` (one copy of the payload)."""
        return b"".join((self.header, *self.buffers))


class _Walker:
    """One encoding pass: builds the tree and collects the tensor records."""

    __slots__ = ("max_depth", "names", "records")

    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth
        self.records: list[Record] = []
        self.names: set[str] = set(RESERVED_NAMES)

    def tensor(self, path: str, item: tuple[str, list[int], memoryview], flags: Any) -> list[Any]:
        base = path or ROOT_NAME
        name = base
        suffix = 0
        while name in self.names:  # DSSST1.md §5.2: collision-free names with ~N
            suffix += 1
            name = f"{base}~{suffix}"
        self.names.add(name)
        dtype, shape, data = item
        if not shape:
            shape = [1]
            flags = flags or _SCALAR_FLAGS
        self.records.append((name, dtype, shape, data))
        return ["t", name] if flags is None else ["t", name, flags]

    def walk(self, obj: Any, path: str, depth: int) -> list[Any] | None:
        """The node of ``obj``, or ``None`` when ``obj`` is exact JSON (its parent decides)."""
        if depth > self.max_depth:
            raise self._too_deep(path)
        kind = type(obj)
        if kind is str or kind is int or kind is bool or obj is None:
            return None
        if kind is float:
            return None if math.isfinite(obj) else self._float(obj, path)
        if kind is dict:
            return self._dict(obj, path, depth)
        if kind is list:
            return self._list(obj, path, depth)
        if kind is tuple:
            return self._tuple(obj, path, depth)
        if kind is np.ndarray:
            return self.tensor(path, array_bytes(obj, path), None)
        return self._other(obj, path, depth)

    def _other(self, obj: Any, path: str, depth: int) -> list[Any] | None:
        if isinstance(obj, np.ndarray):
            return self.tensor(path, array_bytes(obj, path), None)
        if isinstance(obj, np.generic) and dtype_name(obj.dtype) is not None:
            return self.tensor(path, array_bytes(np.asarray(obj), path), None)
        if is_torch_tensor(obj):
            return self.tensor(path, tensor_bytes(obj, path), None)
        if isinstance(obj, bool | int | str):
            return None
        if isinstance(obj, float):
            return None if math.isfinite(obj) else self._float(float(obj), path)
        if isinstance(obj, bytes | bytearray):
            data = memoryview(obj).cast("B")
            return self.tensor(path, ("U8", [data.nbytes], data), _BYTES_FLAGS)
        if isinstance(obj, dict):
            return self._dict(obj, path, depth)
        if isinstance(obj, list):
            return self._list(obj, path, depth)
        if isinstance(obj, tuple):
            return self._tuple(obj, path, depth)
        raise DSSError(
            ErrorCode.UNSUPPORTED_TYPE,
            path or "value",
            "dict, list, tuple, str, int, float, bool, None, bytes, or a tensor",
            got_type(obj),
        )

    def _too_deep(self, path: str) -> DSSError:
        return DSSError(
            ErrorCode.TREE_TOO_DEEP,
            path or "value",
            f"nesting of at most {self.max_depth}",
            "deeper (or a reference cycle)",
        )

    def _float(self, value: float, path: str) -> list[Any]:
        data = np.array([value], dtype="<f8").view(np.uint8).data
        return self.tensor(path, ("F64", [1], data), _FLOAT_FLAGS)

    def _dict(self, obj: dict[Any, Any], path: str, depth: int) -> list[Any] | None:
        nodes: list[tuple[str, Any, list[Any] | None]] = []
        exact = True
        for key, value in obj.items():
            if not isinstance(key, str):
                raise DSSError(
                    ErrorCode.DICT_KEY_NOT_STRING,
                    path or "value",
                    "string dict keys",
                    f"a key of type {got_type(key)}: {key!r}"[:120],
                )
            node = self.walk(value, f"{path}.{key}" if path else key, depth + 1)
            exact = exact and node is None
            nodes.append((key, value, node))
        if exact:
            # Inside a j leaf a JSON object is one level deeper than its j node (R19).
            if depth >= self.max_depth:
                raise self._too_deep(path)
            return None
        return ["d", [[k, ["j", v] if n is None else n] for k, v, n in nodes]]

    def _list(self, obj: list[Any], path: str, depth: int) -> list[Any] | None:
        if depth < self.max_depth:
            for item in obj:  # fast scan: lists of JSON scalars (token ids, texts) stay leaves
                kind = type(item)
                if kind is int or kind is str or kind is bool or item is None:
                    continue
                if kind is float and math.isfinite(item):
                    continue
                break
            else:
                return None
        nodes = self._items(obj, path, depth)
        if all(node is None for node in nodes):
            if depth >= self.max_depth:  # a JSON array inside a j leaf counts one deeper (R19)
                raise self._too_deep(path)
            return None
        return ["l", [["j", v] if n is None else n for v, n in zip(obj, nodes, strict=True)]]

    def _tuple(self, obj: tuple[Any, ...], path: str, depth: int) -> list[Any]:
        nodes = self._items(obj, path, depth)
        return ["u", [["j", v] if n is None else n for v, n in zip(obj, nodes, strict=True)]]

    def _items(self, obj: list[Any] | tuple[Any, ...], path: str, depth: int) -> list[Any]:
        walk = self.walk
        prefix = f"{path}." if path else ""
        return [walk(item, f"{prefix}{index}", depth + 1) for index, item in enumerate(obj)]


def _json_metadata_error(value: Any, path: str, depth: int) -> DSSError | None:
    """Whether ``value`` is standard JSON (tuples count as arrays); the first offence if not."""
    if depth > 64:
        return DSSError(ErrorCode.METADATA_INVALID, path, "JSON nested at most 64 deep")
    if value is None or isinstance(value, bool | int | str):
        return None
    if isinstance(value, float):
        if math.isfinite(value):
            return None
        return DSSError(ErrorCode.METADATA_INVALID, path, "standard JSON (no NaN/Infinity)")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return DSSError(ErrorCode.METADATA_INVALID, path, "string keys", got_type(key))
            found = _json_metadata_error(item, f"{path}.{key}", depth + 1)
            if found is not None:
                return found
        return None
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = _json_metadata_error(item, f"{path}[{index}]", depth + 1)
            if found is not None:
                return found
        return None
    return DSSError(ErrorCode.METADATA_INVALID, path, "a JSON value", got_type(value))


def op_metadata_text(metadata: Mapping[str, Any] | None) -> str | None:
    """The ``op`` metadata string of a frame, or ``None`` when there is none (§2, §5.10)."""
    if metadata is None:
        return None
    if not isinstance(metadata, Mapping):
        raise DSSError(ErrorCode.METADATA_INVALID, "metadata", "a JSON object", got_type(metadata))
    if not metadata:
        return None
    obj = dict(metadata)
    found = _json_metadata_error(obj, "metadata", 1)
    if found is not None:
        raise found
    try:
        return json.dumps(obj, separators=_COMPACT, allow_nan=False)
    except ValueError as exc:  # e.g. an int past the interpreter's digit limit
        raise DSSError(ErrorCode.METADATA_INVALID, "metadata", "JSON", str(exc)) from exc


def frame_header(
    layout: list[tuple[str, str, list[int], int]], tree: Any, op_text: str | None, limits: Limits
) -> bytes:
    """The length prefix and padded header of a frame whose tensors, in ``layout`` order, are
    (name, dtype, shape, byte length)."""
    if len(layout) > limits.max_tensors:
        raise DSSError(
            ErrorCode.TOO_MANY_TENSORS,
            "value",
            f"at most {limits.max_tensors} tensors",
            str(len(layout)),
        )
    try:
        structure = json.dumps({"v": VERSION, "tree": tree}, separators=_COMPACT, allow_nan=False)
    except ValueError as exc:  # an int past the interpreter's digit limit
        raise DSSError(ErrorCode.UNSUPPORTED_TYPE, "value", "JSON-representable", str(exc)) from exc
    meta = {STRUCTURE_KEY: structure}
    if op_text is not None:
        meta[OP_KEY] = op_text
    # Built as text: the same compact JSON json.dumps writes, in half its time for 10k tensors.
    parts = ["{", _quote(METADATA_KEY), ":", json.dumps(meta, separators=_COMPACT)]
    quote = _quote
    pos = 0
    for name, dtype, shape, nbytes in layout:
        end = pos + nbytes
        dims = ",".join(map(str, shape))
        parts.append(
            f',{quote(name)}:{{"dtype":"{dtype}","shape":[{dims}],"data_offsets":[{pos},{end}]}}'
        )
        pos = end
    parts.append("}")
    text = "".join(parts).encode("ascii")
    padded = len(text) + (-len(text) % 8)
    if padded & 0xFFFF in _PICKLE_LIKE_LENGTHS:
        padded += 8  # §5.1: no frame may start like a pickle (80 02 .. 80 05)
    if padded > limits.max_header_bytes:
        raise DSSError(
            ErrorCode.HEADER_TOO_LARGE,
            "header",
            f"at most {limits.max_header_bytes} bytes",
            str(padded),
        )
    return b"".join((padded.to_bytes(8, "little"), text, b" " * (padded - len(text))))


def assemble_frame(
    records: list[Record], tree: Any, op_text: str | None, limits: Limits
) -> EncodedFrame:
    """Lay out a frame: tensors by descending item size then name (§5.1), header padded to 8."""
    itemsize = DTYPE_ITEMSIZE
    records.sort(key=lambda r: (-itemsize[r[1]], r[0]))
    layout = [(name, dtype, shape, data.nbytes) for name, dtype, shape, data in records]
    head = frame_header(layout, tree, op_text, limits)
    buffers = tuple(r[3] for r in records if r[3].nbytes)
    return EncodedFrame(head, buffers, len(head) + sum(entry[3] for entry in layout))


def iter_frame(
    obj: Any, *, metadata: Mapping[str, Any] | None = None, limits: Limits | None = None
) -> EncodedFrame:
    """Encode ``obj`` as an `EncodedFrame` (header bytes + views of the tensors' memory).

    Args:
        obj: the value (see the module docstring for what maps to what).
        metadata: the ``op`` metadata object (standard JSON), or ``None``.
        limits: the limits the frame must satisfy (the peer's); DSSST1.md §7 defaults if ``None``.

    Raises:
        DSSError: ``dict_key_not_string``, ``unsupported_type``, ``metadata_invalid``,
            ``tree_too_deep``, ``too_many_tensors`` or ``header_too_large``.
    """
    lim = DEFAULT_LIMITS if limits is None else limits
    op_text = op_metadata_text(metadata)
    walker = _Walker(lim.max_depth)
    node = walker.walk(obj, "", 1)
    tree = ["j", obj] if node is None else node
    records = walker.records
    if not records:  # §5.8: the deployed reader requires at least one tensor
        records.append((PLACEHOLDER_NAME, "U8", [1], _PLACEHOLDER_BYTES))
    return assemble_frame(records, tree, op_text, lim)


def dumps(
    obj: Any, *, metadata: Mapping[str, Any] | None = None, limits: Limits | None = None
) -> bytes:
    """Encode ``obj`` into one DSSST1 frame (see `iter_frame`)."""
    return iter_frame(obj, metadata=metadata, limits=limits).tobytes()
