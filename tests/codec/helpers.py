"""Helpers for the codec tests: hand-built frames and exact value comparison."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

import dssst1


def raw_frame(
    header: Any, data: bytes = b"", *, pad: bool = True, length: int | None = None
) -> bytes:
    """A frame from a header (dict -> compact JSON, str -> UTF-8, bytes as is) and data bytes."""
    if isinstance(header, dict):
        text = json.dumps(header, separators=(",", ":")).encode()
    elif isinstance(header, str):
        text = header.encode()
    else:
        text = bytes(header)
    if pad:
        text += b" " * (-len(text) % 8)
    n = len(text) if length is None else length
    return n.to_bytes(8, "little") + text + data


def dss(tree: Any, *, v: Any = "DSSST1", op: Any = None, **extra: str) -> dict[str, str]:
    """A ``__metadata__`` object holding ``{"v": v, "tree": tree}`` (and ``op`` when given)."""
    meta = {"dss": json.dumps({"v": v, "tree": tree}), **extra}
    if op is not None:
        meta["op"] = op if isinstance(op, str) else json.dumps(op)
    return meta


def frame_of(tree: Any, tensors: dict[str, tuple[str, list[int], bytes]], **meta: Any) -> bytes:
    """A frame of ``tree`` and tensors (name -> (dtype, shape, bytes)), laid out in order."""
    header: dict[str, Any] = {"__metadata__": dss(tree, **meta)}
    data = b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {
            "dtype": dtype,
            "shape": shape,
            "data_offsets": [len(data), len(data) + len(raw)],
        }
        data += raw
    return raw_frame(header, data)


def header_of(frame: bytes) -> dict[str, Any]:
    """The parsed header of a frame."""
    n = int.from_bytes(frame[:8], "little")
    return json.loads(frame[8 : 8 + n])


def tree_of(frame: bytes) -> Any:
    """The structure tree of a frame."""
    return json.loads(header_of(frame)["__metadata__"]["dss"])["tree"]


def code_of(fn: Any, *args: Any, **kwargs: Any) -> str:
    """The DSSError code ``fn(*args, **kwargs)`` raises (fails the test if it raises none)."""
    try:
        fn(*args, **kwargs)
    except dssst1.DSSError as exc:
        return str(exc.code)
    raise AssertionError("no DSSError raised")


def same(a: Any, b: Any) -> bool:
    """Exact equality: types (tuple vs list, float vs int), dtypes, shapes, bytes, NaN == NaN."""
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (
            a == b and math.copysign(1, a) == math.copysign(1, b)
        )
    return bool(a == b)
