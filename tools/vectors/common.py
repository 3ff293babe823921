"""The Vector record, the ordered registry and the byte-level frame-building helpers."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tests import v1ref

from . import REPO

VECTOR_DIR = REPO / "tests" / "vectors"
HAND_WRITTEN = frozenset({"README.md"})  # files in VECTOR_DIR this script does not generate
UNSET: Any = object()
NAN, INF = float("nan"), float("inf")
#: ``N mod 65536`` of the header lengths whose little-endian bytes start with a pickle opcode
#: (80 02 .. 80 05): 640, 896, 1152, 1408. DSSST1.md §5.1: a new writer never emits one.
PICKLE_LIKE_N = frozenset(0x80 | (p << 8) for p in range(2, 6))
MAX_HEADER = 64 * 1024 * 1024


def pickle_like(n: int) -> bool:
    return n % 65536 in PICKLE_LIKE_N


@dataclass
class Vector:
    id: str
    kind: str  # "frame" | "chunks" | "envelope"
    origin: str  # "v1-writer" | "new-writer" | "hand-built"
    spec_ref: str
    description: str
    payload: Any  # frame bytes | list of chunk-frame bytes | envelope JSON value
    expected: Any = UNSET  # the decoded Python value (valid vectors)
    error_code: str | None = None  # invalid vectors
    alt_error_codes: tuple[str, ...] = ()
    expected_op: Any = UNSET  # op metadata of a valid frame, when it has one
    expected_v1: Any = UNSET  # valid: what the deployed reader yields when it differs
    v1_error: str | None = None  # valid: the exception class the deployed reader raises
    chunk_kind: str | None = None
    limits: dict[str, int] | None = None


VECTORS: list[Vector] = []


def add(vec: Vector) -> None:
    if any(v.id == vec.id for v in VECTORS):
        raise ValueError(f"duplicate vector id {vec.id}")
    VECTORS.append(vec)


# --------------------------------------------------------------------------- frame building


class Raw(str):
    """JSON text inserted into a header verbatim (for duplicate keys, NaN, broken JSON...)."""

    __slots__ = ()


def js(obj: Any) -> str:
    """Standard, compact JSON (what a DSSST1.md §5 writer emits)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def dss(tree: Any, v: Any = "DSSST1") -> str:
    return js({"v": v, "tree": tree})


def hdr(*fields: tuple[str, Any]) -> str:
    """A header object from ``(key, value)`` pairs, in order; duplicates allowed."""
    return "{" + ",".join(f"{js(k)}:{v if isinstance(v, Raw) else js(v)}" for k, v in fields) + "}"


def blob(
    header: str | bytes, data: bytes = b"", *, pad: bool = True, n: int | None = None
) -> bytes:
    """``N`` + header (+ spaces to a multiple of 8 when ``pad``) + data; ``n`` overrides ``N``.

    ``pad`` pads as DSSST1.md §5.1 tells a writer: to a multiple of 8, and 8 more spaces when
    ``N mod 65536`` would be 640, 896, 1152 or 1408 (a pickle-like prefix).
    """
    hb = header.encode("utf-8") if isinstance(header, str) else header
    if pad:
        hb += b" " * (-len(hb) % 8)
        if pickle_like(len(hb)):
            hb += b" " * 8
    return (len(hb) if n is None else n).to_bytes(8, "little") + hb + data


def entry(arr: np.ndarray, begin: int) -> dict[str, Any]:
    return {
        "dtype": v1ref.dtype_name(arr.dtype),
        "shape": list(arr.shape),
        "data_offsets": [begin, begin + arr.nbytes],
    }


def layout(
    tensors: Sequence[tuple[str, np.ndarray]], *, spec_order: bool = True
) -> tuple[list[tuple[str, Any]], bytes]:
    """Header entries and data section; DSSST1.md §5.1 order (item size desc, then name)."""
    items = sorted(tensors, key=lambda t: (-t[1].dtype.itemsize, t[0])) if spec_order else tensors
    entries: list[tuple[str, Any]] = []
    data = b""
    for name, arr in items:
        entries.append((name, entry(arr, len(data))))
        data += np.ascontiguousarray(arr).tobytes()
    return entries, data


def frame(
    tree: Any,
    tensors: Sequence[tuple[str, np.ndarray]],
    *,
    op: Any = None,
    extra_meta: dict[str, str] | None = None,
    pad: bool = True,
    spec_order: bool = True,
    metadata_last: bool = False,
) -> bytes:
    """A frame in the DSSST1.md §5 writer style (standard compact JSON everywhere)."""
    meta = {"dss": dss(tree)}
    if op is not None:
        meta["op"] = js(op)
    meta.update(extra_meta or {})
    entries, data = layout(tensors, spec_order=spec_order)
    fields = (
        [*entries, ("__metadata__", meta)] if metadata_last else [("__metadata__", meta), *entries]
    )
    return blob(hdr(*fields), data, pad=pad)


def u8(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=np.uint8).copy()


# The base tensor most invalid frames are built around.
X = np.arange(4, dtype=np.float32)
XB = X.tobytes()
XE = entry(X, 0)
TREE_X = ["d", [["x", ["t", "x"]]]]
META_X = {"dss": dss(TREE_X)}


def with_x(metadata: Any) -> bytes:
    """A frame holding tensor ``x`` whose ``__metadata__`` is ``metadata`` (JSON or Raw)."""
    return blob(hdr(("__metadata__", metadata), ("x", XE)), XB)


def with_entry(e: Any, data: bytes = XB) -> bytes:
    """A frame whose tree is ``{"x": <t x>}`` and whose ``x`` entry is ``e`` (JSON or Raw)."""
    return blob(hdr(("__metadata__", META_X), ("x", e)), data)


# --------------------------------------------------------------------------- helpers for adding


def v1_frame(
    vid: str,
    obj: Any,
    ref: str,
    desc: str,
    *,
    metadata: Any = None,
    expected: Any = UNSET,
    **kw: Any,
) -> None:
    """A valid frame exactly as the deployed writer produces it from ``obj``."""
    data = v1ref.dumps(obj, metadata=metadata)
    exp = obj if expected is UNSET else expected
    op = metadata if metadata else UNSET
    add(Vector(vid, "frame", "v1-writer", ref, desc, data, expected=exp, expected_op=op, **kw))


def ok_frame(
    vid: str, origin: str, data: bytes, expected: Any, ref: str, desc: str, **kw: Any
) -> None:
    add(Vector(vid, "frame", origin, ref, desc, data, expected=expected, **kw))


def bad_frame(
    vid: str, code: str, ref: str, desc: str, data: bytes, *, origin: str = "hand-built", **kw: Any
) -> None:
    add(Vector(vid, "frame", origin, ref, desc, data, error_code=code, **kw))


RESPONSE_OPTIONS = {"response_options": {"format": "dssst1", "delivery": "chunked"}}
