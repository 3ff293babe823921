"""The "typed value" JSON notation of ``tests/vectors/index.json`` (see tests/vectors/README.md).

``None``, ``bool``, ``int`` and ``str`` are themselves; everything else is a one-key object:
``{"float": repr}``, ``{"bytes": hex}``, ``{"list": [...]}``, ``{"tuple": [...]}``,
``{"dict": [[key, value], ...]}`` (ordered; keys are typed values too) and
``{"array": {"dtype": <safetensors name>, "shape": [...], "hex": <little-endian C-order bytes>}}``.
Two values are equal when their :func:`canonical` strings are equal (so ``True != 1``,
``NaN == NaN`` and ``-0.0 != 0.0``).
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from . import DTYPES, dtype_name

__all__ = ["canonical", "from_typed", "to_typed"]


def to_typed(value: Any) -> Any:
    """The typed-value form of a decoded Python value (NumPy arrays for tensors)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return {"float": repr(value)}
    if isinstance(value, bytes | bytearray):
        return {"bytes": bytes(value).hex()}
    if isinstance(value, np.ndarray):
        raw = value.astype(value.dtype.newbyteorder("<"), copy=False).tobytes(order="C")
        return {
            "array": {
                "dtype": dtype_name(value.dtype),
                "shape": list(value.shape),
                "hex": raw.hex(),
            }
        }
    if isinstance(value, tuple):
        return {"tuple": [to_typed(v) for v in value]}
    if isinstance(value, list):
        return {"list": [to_typed(v) for v in value]}
    if isinstance(value, dict):
        return {"dict": [[to_typed(k), to_typed(v)] for k, v in value.items()]}
    raise TypeError(f"no typed-value form for {type(value).__name__}")


def from_typed(typed: Any) -> Any:
    """The Python value a typed value stands for (arrays as NumPy arrays)."""
    if typed is None or isinstance(typed, bool | int | str):
        return typed
    if not isinstance(typed, dict) or len(typed) != 1:
        raise ValueError(f"not a typed value: {typed!r}")
    ((tag, body),) = typed.items()
    if tag == "float":
        value = float(body)
        if repr(value) != body and not math.isnan(value):
            raise ValueError(f"float {body!r} is not in repr form")
        return value
    if tag == "bytes":
        return bytes.fromhex(body)
    if tag == "list":
        return [from_typed(v) for v in body]
    if tag == "tuple":
        return tuple(from_typed(v) for v in body)
    if tag == "dict":
        return {from_typed(k): from_typed(v) for k, v in body}
    if tag == "array":
        dtype = DTYPES[body["dtype"]].newbyteorder("<")
        return np.frombuffer(bytes.fromhex(body["hex"]), dtype=dtype).reshape(body["shape"]).copy()
    raise ValueError(f"unknown typed-value tag {tag!r}")


def canonical(typed: Any) -> str:
    """A string that is equal for equal typed values."""
    return json.dumps(typed, ensure_ascii=True, separators=(",", ":"), allow_nan=False)
