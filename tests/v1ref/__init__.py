"""Reference model of the *deployed* DSSST1 v1 codec: the yardstick for compatibility tests.

Independent of ``dssst1`` (never import it here). Written from ``/work/shared/DESIGN.md`` §2 and
``reference/arctic.md`` §1; it reproduces what the deployed Arctic writer emits and what its reader
accepts, hazards included:

* tensor names are dotted paths (``kwargs.input_ids``, ``nested.1.x``, ``__root__`` for a bare
  tensor); on a path collision the later tensor overwrites the earlier one and both tree nodes
  name the survivor;
* tensor-free dicts and lists become ``["j", value]`` leaves (``json.dumps`` defaults: tuples turn
  into lists, int keys into strings, NaN / Infinity written as bare tokens); tuples are always
  ``["u", ...]``; dict keys must be ``str`` only in a dict that holds a tensor;
* 0-dim arrays are stored with shape ``[1]`` and the flag ``{"scalar": true}``;
* with no tensor the placeholder ``__dss_empty__`` (uint8, shape ``[1]``, value 0) is added, and the
  reader drops a tensor of that name unconditionally (a user tensor so named vanishes);
* the reader tries safetensors first and only then blames a pickle / zip prefix, so a valid frame
  whose header length happens to start with the bytes ``80 02`` .. ``80 05`` is accepted.

NumPy arrays stand in for torch tensors (bfloat16 / float8 through ``ml_dtypes``). Differences from
the deployed code, all deliberate: the safetensors blob is written here, byte-identical to
``safetensors.numpy.save`` (checked in ``tests/test_vectors.py``), because safetensors keeps
``__metadata__`` in a randomly seeded hash map, so deployed frames hold ``dss`` and ``op`` in either
order; this writer always puts ``dss`` first. A reshape failure raises NumPy's ``ValueError`` where
torch raises ``RuntimeError``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import safetensors

WIRE_FORMAT_VERSION = "DSSST1"
PLACEHOLDER_KEY = "__dss_empty__"
ROOT_KEY = "__root__"
MAX_HEADER_BYTES = 64 * 1024 * 1024
PICKLE_SIGNATURES = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")
ZIP_SIGNATURE = b"PK\x03\x04"


class V1WireError(ValueError):
    """The deployed codec's ``WireError``."""


#: safetensors dtype name -> NumPy dtype, in the order of safetensors' ``Dtype`` enum. The Rust
#: serializer lays tensors out by this rank (descending), then by name (DSSST1.md §10). These are
#: exactly the dtypes of DSSST1.md §4 (``C64`` included).
_TABLE = """
BOOL bool_  U8 uint8  I8 int8  F8_E5M2 float8_e5m2  F8_E4M3 float8_e4m3fn  I16 int16  U16 uint16
F16 float16  BF16 bfloat16  I32 int32  U32 uint32  F32 float32  C64 complex64  F64 float64
I64 int64  U64 uint64
"""
_WORDS = _TABLE.split()
DTYPES: dict[str, np.dtype[Any]] = {
    name: np.dtype(getattr(np, dt, None) or getattr(ml_dtypes, dt))
    for name, dt in zip(_WORDS[::2], _WORDS[1::2], strict=True)
}
_RANK = {name: rank for rank, name in enumerate(DTYPES)}
_NAMES = {dt: name for name, dt in DTYPES.items()}


def dtype_name(dtype: np.dtype[Any]) -> str:
    """The safetensors name of a NumPy dtype (``TypeError`` when safetensors has none)."""
    try:
        return _NAMES[dtype.newbyteorder("=")]
    except KeyError:
        raise TypeError(f"dtype {dtype} has no safetensors name") from None


# --------------------------------------------------------------------------- safetensors blob


def _js(obj: Any) -> str:  # serde_json's compact form
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def save_safetensors(tensors: dict[str, np.ndarray], metadata: dict[str, str] | None) -> bytes:
    """The blob ``safetensors.numpy.save`` writes, ``metadata`` keys in insertion order.

    A tensor named ``__metadata__`` becomes a second ``__metadata__`` key, as with safetensors.
    """
    order = sorted(tensors, key=lambda n: (-_RANK[dtype_name(tensors[n].dtype)], n))
    fields = [] if metadata is None else [f'"__metadata__":{_js(metadata)}']
    data: list[bytes] = []
    offset = 0
    for name in order:
        arr = tensors[name]
        raw = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes(order="C")
        entry = {
            "dtype": dtype_name(arr.dtype),
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        fields.append(f"{_js(name)}:{_js(entry)}")
        data.append(raw)
        offset += len(raw)
    header = ("{" + ",".join(fields) + "}").encode("utf-8")
    header += b" " * (-len(header) % 8)
    return len(header).to_bytes(8, "little") + header + b"".join(data)


_deserialize: Callable[[bytes], list[tuple[str, dict[str, Any]]]] = safetensors.deserialize


def _load_tensors(data: bytes) -> dict[str, np.ndarray]:
    out = {}
    for name, info in _deserialize(data):
        arr = np.frombuffer(bytes(info["data"]), dtype=DTYPES[info["dtype"]])
        out[name] = arr.reshape(info["shape"])
    return out


def _read_header(data: bytes) -> Any:
    if len(data) < 8:
        raise V1WireError("payload too short to be a DSSST1 safetensors blob")
    n = int.from_bytes(data[:8], "little")
    if n <= 0 or 8 + n > len(data) or n > MAX_HEADER_BYTES:
        raise V1WireError("invalid DSSST1 safetensors header length")
    header = json.loads(data[8 : 8 + n].decode("utf-8"))
    return header.get("__metadata__", {}) or {}


# --------------------------------------------------------------------------- codec


def _has_tensor(obj: Any) -> bool:
    if isinstance(obj, np.ndarray):
        return True
    if isinstance(obj, dict):
        return any(_has_tensor(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return any(_has_tensor(v) for v in obj)
    return False


def _encode(obj: Any, tensors: dict[str, np.ndarray], path: str) -> list[Any]:
    def child(key: object) -> str:
        return f"{path}.{key}" if path else str(key)

    if isinstance(obj, np.ndarray):
        name = path or ROOT_KEY
        arr = obj.copy(order="C")
        node: list[Any] = ["t", name]
        if arr.ndim == 0:
            arr = arr.reshape(1)
            node = ["t", name, {"scalar": True}]
        tensors[name] = arr  # a colliding path silently replaces the earlier tensor
        return node
    if isinstance(obj, tuple):
        return ["u", [_encode(v, tensors, child(i)) for i, v in enumerate(obj)]]
    if isinstance(obj, list) and _has_tensor(obj):
        return ["l", [_encode(v, tensors, child(i)) for i, v in enumerate(obj)]]
    if isinstance(obj, dict) and _has_tensor(obj):
        items = []
        for key, value in obj.items():
            if not isinstance(key, str):
                raise V1WireError(f"DSSST1 dict keys must be strings, got {type(key)!r}")
            items.append([key, _encode(value, tensors, child(key))])
        return ["d", items]
    return ["j", obj]


def dumps(obj: Any, *, metadata: dict[str, Any] | None = None) -> bytes:
    """Encode ``obj`` exactly as the deployed writer does (``dss`` before ``op``)."""
    tensors: dict[str, np.ndarray] = {}
    tree = _encode(obj, tensors, "")
    if not tensors:
        tensors[PLACEHOLDER_KEY] = np.zeros(1, dtype=np.uint8)
    header = {"dss": json.dumps({"v": WIRE_FORMAT_VERSION, "tree": tree})}
    if metadata:
        header["op"] = json.dumps(metadata)
    return save_safetensors(tensors, header)


def _decode(node: Any, tensors: dict[str, np.ndarray]) -> Any:
    tag = node[0]
    if tag == "t":
        arr = tensors[node[1]]  # KeyError, not V1WireError, as deployed
        flags = node[2] if len(node) > 2 else None
        return arr.reshape(()) if isinstance(flags, dict) and flags.get("scalar") else arr
    if tag == "j":
        return node[1]
    if tag == "d":
        return {key: _decode(child, tensors) for key, child in node[1]}
    if tag == "l":
        return [_decode(child, tensors) for child in node[1]]
    if tag == "u":
        return tuple(_decode(child, tensors) for child in node[1])
    raise V1WireError(f"unknown DSSST1 node tag {tag!r}")


def loads(data: Any) -> Any:
    """Decode a frame as the deployed reader does (NumPy arrays instead of torch tensors)."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise V1WireError("DSSST1 loads expects bytes")
    data = bytes(data)
    try:
        tensors = _load_tensors(data)
        meta = _read_header(data)
    except Exception as exc:  # only a frame safetensors refuses is blamed on pickle / zip
        if data[:2] in PICKLE_SIGNATURES or data[:4] == ZIP_SIGNATURE:
            raise V1WireError("refusing a pickle / torch.save payload") from exc
        raise V1WireError(f"not a valid DSSST1 safetensors payload: {exc}") from exc
    raw = meta.get("dss")
    if raw is None:
        raise V1WireError("DSSST1 structure missing from safetensors header")
    info = json.loads(raw)
    if info.get("v") != WIRE_FORMAT_VERSION:
        raise V1WireError(f"unsupported DSSST1 wire version {info.get('v')!r}")
    tensors.pop(PLACEHOLDER_KEY, None)
    return _decode(info["tree"], tensors)


def read_metadata(data: Any) -> Any:
    """The ``op`` metadata; ``{}`` when the header cannot be read (an unparsable ``op`` raises)."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise V1WireError("DSSST1 read_metadata expects bytes")
    try:
        raw = _read_header(bytes(data)).get("op")
    except ValueError:  # V1WireError, bad JSON, bad UTF-8
        return {}
    return json.loads(raw) if raw else {}


from .chunks import (  # noqa: E402  (chunks builds on dumps / loads above)
    decode_byte_chunks,
    decode_envelope,
    encode_byte_chunks,
    read_byte_chunk_metadata,
)

__all__ = [
    "DTYPES",
    "V1WireError",
    "decode_byte_chunks",
    "decode_envelope",
    "dtype_name",
    "dumps",
    "encode_byte_chunks",
    "loads",
    "read_byte_chunk_metadata",
    "read_metadata",
    "save_safetensors",
]
