"""Case values: the typed YAML notation, `${...}` templates, and paths into answers.

Typed notation (conformance/cases/README.md): a mapping with exactly one of these keys is a typed
value, anything else is plain JSON.

    {tensor: {dtype: I64, shape: [B, S], fill: tokens}}     a NumPy array (DSSST1 dtype names)
    {tensor: {dtype: F32, values: [[0.5, 1.0]]}}           explicit values
    {bytes: "00ff"}  {tuple: [1, 2]}  {float: "nan"}
    {envelope: VALUE}                                      an InlineEnvelope of VALUE's frame

Templates: a string holding `${expr}` is expanded; a string that is exactly one template keeps the
value's type. `expr` is a name (a saved value, a case var, or a run value such as `job`), a path
below it (`st.result.weight_version`), a slice (`text[2:5]`), `uuid` (fresh each time) or
`uuid:NAME` (one UUID per name per case), `len(expr)`, or arithmetic on names and numbers with
spaced operators (`limits.max_chunks + 1`, `loss * n`).

Paths: `a.b[0].c`, `a[*].b` (every element), `a[-1]`, `a[id=x]` (the elements whose `id` is `x`).
"""

from __future__ import annotations

import ast
import math
import re
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import ml_dtypes
import numpy as np

import dssst1

DTYPES: dict[str, Any] = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": ml_dtypes.bfloat16,
    "F8_E4M3": ml_dtypes.float8_e4m3fn,
    "F8_E5M2": ml_dtypes.float8_e5m2,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U64": np.uint64,
    "U32": np.uint32,
    "U16": np.uint16,
    "U8": np.uint8,
    "BOOL": np.bool_,
    "C64": np.complex64,
}
_NAMES = {np.dtype(v).name: k for k, v in DTYPES.items()}
_TEMPLATE = re.compile(r"\$\{([^}]+)\}")
_SLICE = re.compile(r"^(.*)\[(-?\d*):(-?\d*)\]$")
_ARITH = re.compile(r" [-+*/] ")
_OPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}
_TOKEN = re.compile(r"\.?([^.\[\]]+)|\[(\*|-?\d+)\]|\[(\w+)=([^\]]*)\]")
TYPED_KEYS = ("tensor", "bytes", "tuple", "float", "envelope")


class CaseDataError(ValueError):
    """A case file is malformed (a bug in the case data, not in the server)."""


def dtype_name(value: Any) -> str | None:
    """The DSSST1 dtype name of an array, or None."""
    dt = getattr(value, "dtype", None)
    return None if dt is None else _NAMES.get(np.dtype(dt).name)


def is_tensor(value: Any) -> bool:
    return isinstance(value, np.ndarray)


# ---------------------------------------------------------------------------- templates


class Scope:
    """Names a case can refer to: run values, case vars, saved values, named UUIDs."""

    def __init__(self, *layers: Mapping[str, Any]) -> None:
        self.values: dict[str, Any] = {}
        for layer in layers:
            self.values.update(layer)
        self._uuids: dict[str, str] = {}

    def set(self, name: str, value: Any) -> None:
        self.values[name] = value

    def lookup(self, expr: str) -> Any:
        expr = expr.strip()
        if expr == "uuid":
            return str(uuid.uuid4())
        if expr.startswith("uuid:"):
            return self._uuids.setdefault(expr[5:], str(uuid.uuid4()))
        if expr.startswith("len(") and expr.endswith(")"):
            return len(self.lookup(expr[4:-1]))
        if _ARITH.search(expr):
            return self._arith(ast.parse(expr, mode="eval").body, expr)
        m = _SLICE.match(expr)
        if m:
            base = self.lookup(m.group(1))
            lo = int(m.group(2)) if m.group(2) else None
            hi = int(m.group(3)) if m.group(3) else None
            return base[lo:hi]
        head, _, rest = expr.partition(".")
        name, bracket, tail = head.partition("[")
        if name not in self.values:
            raise CaseDataError(
                f"${{{expr}}}: no value named {name!r} (known: {sorted(self.values)})"
            )
        value = self.values[name]
        path = (bracket + tail if bracket else "") + ("." + rest if rest else "")
        if not path:
            return value
        found = get_path(value, path)
        if not found:
            raise CaseDataError(f"${{{expr}}}: path {path!r} is not in the saved value")
        return found[0]

    def _arith(self, node: ast.expr, expr: str) -> Any:
        """`a + 1`, `loss * n`: numbers and names joined by + - * / (with spaces around them);
        a string or list var times a number repeats it (`${open * 100000}`: deep JSON)."""
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = self._arith(node.left, expr), self._arith(node.right, expr)
            if isinstance(left, str | list) or isinstance(right, str | list):
                if isinstance(node.op, ast.Mult):
                    return left * int(right) if isinstance(left, str | list) else right * int(left)
                if not isinstance(node.op, ast.Add):
                    raise CaseDataError(f"${{{expr}}}: strings and lists take only + and *")
            return _OPS[type(node.op)](left, right)
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.Name | ast.Attribute):
            value = self.lookup(ast.unparse(node))
            if isinstance(value, str | list | int):
                return value
            return float(value)
        raise CaseDataError(f"${{{expr}}}: only names, numbers and + - * / are allowed")

    def expand(self, value: Any) -> Any:
        """Expand templates anywhere in a YAML value (typed values are kept as notation)."""
        if isinstance(value, str):
            return self._string(value)
        if isinstance(value, list):
            return [self.expand(v) for v in value]
        if isinstance(value, dict):
            return {
                self._string(k) if isinstance(k, str) else k: self.expand(v)
                for k, v in value.items()
            }
        return value

    def _string(self, text: str) -> Any:
        whole = _TEMPLATE.fullmatch(text)
        if whole:
            return self.lookup(whole.group(1))
        return _TEMPLATE.sub(lambda m: str(self.lookup(m.group(1))), text)


# ---------------------------------------------------------------------------- typed values


def build(value: Any, dims: Mapping[str, Any] | None = None) -> Any:
    """Turn typed notation into Python values (arrays, bytes, tuples, floats)."""
    dims = dims or {}
    if isinstance(value, list):
        return [build(v, dims) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        key, arg = next(iter(value.items()))
        if key == "tensor":
            return tensor(arg, dims)
        if key == "bytes":
            return bytes.fromhex(str(arg))
        if key == "tuple":
            return tuple(build(v, dims) for v in arg)
        if key == "float":
            return float(arg)
        if key == "envelope":  # an InlineEnvelope (DSSST1.md §9) of the value's frame
            return dssst1.inline_envelope(dssst1.dumps(build(arg, dims)))
    return {k: build(v, dims) for k, v in value.items()}


def _dim(d: Any, dims: Mapping[str, Any]) -> int:
    if isinstance(d, str):
        if d not in dims:
            raise CaseDataError(f"shape symbol {d!r} has no value in the case's vars")
        return int(dims[d])
    return int(d)


def tensor(spec: Mapping[str, Any], dims: Mapping[str, Any]) -> np.ndarray[Any, Any]:
    dtype_key = str(spec.get("dtype", "F32"))
    if dtype_key not in DTYPES:
        raise CaseDataError(f"tensor dtype {dtype_key!r} is not a DSSST1 dtype")
    dtype = np.dtype(DTYPES[dtype_key])
    if "values" in spec:
        arr = np.asarray(spec["values"], dtype=np.float64 if dtype.kind == "f" else None)
        out = arr.astype(dtype)
        if "shape" in spec:
            out = out.reshape([_dim(d, dims) for d in spec["shape"]])
        return out
    shape = [_dim(d, dims) for d in spec.get("shape", [])]
    n = int(np.prod(shape)) if shape else 1
    fill = spec.get("fill", "zeros")
    flat: np.ndarray[Any, Any]
    if fill == "zeros":
        flat = np.zeros(n)
    elif fill == "ones":
        flat = np.ones(n)
    elif fill == "range":
        flat = np.arange(n)
    elif fill == "tokens":  # ids of printable bytes under a byte-level tokenizer, never special
        flat = (np.arange(n) * 7 + 11) % 90 + 35
    elif fill == "signs":  # alternating +1 / -1 (advantages)
        flat = np.where(np.arange(n) % 2 == 0, 1.0, -1.0)
    elif isinstance(fill, int | float) and not isinstance(fill, bool):
        flat = np.full(n, fill)
    else:
        raise CaseDataError(
            f"tensor fill {fill!r} is not zeros, ones, range, tokens, signs or a number"
        )
    return np.asarray(flat).astype(dtype).reshape(shape)


# ---------------------------------------------------------------------------- paths


def _tokens(path: str) -> list[str | int | tuple[str, str]]:
    out: list[str | int | tuple[str, str]] = []
    pos = 0
    while pos < len(path):
        m = _TOKEN.match(path, pos)
        if m is None or m.end() == pos:
            raise CaseDataError(f"path {path!r} is malformed at {path[pos:]!r}")
        if m.group(1) is not None:
            out.append(m.group(1))
        elif m.group(3) is not None:
            out.append((m.group(3), m.group(4)))
        else:
            idx = m.group(2)
            out.append("*" if idx == "*" else int(idx))
        pos = m.end()
    return out


def get_path(value: Any, path: str) -> list[Any]:
    """Every value `path` selects (empty when a segment is missing); `$` is the whole value."""
    current = [value]
    if path in ("$", ""):
        return current
    for tok in _tokens(path):
        nxt: list[Any] = []
        for v in current:
            if tok == "*":
                if isinstance(v, list | tuple) or is_tensor(v):
                    nxt.extend(list(v))
            elif isinstance(tok, tuple):  # [key=value]: the elements (objects) that have it
                key, want = tok
                if isinstance(v, list | tuple):
                    nxt.extend(e for e in v if isinstance(e, Mapping) and str(e.get(key)) == want)
            elif isinstance(tok, int):
                if (isinstance(v, list | tuple) or is_tensor(v)) and -len(v) <= tok < len(v):
                    nxt.append(v[tok])
            elif isinstance(v, Mapping) and tok in v:
                nxt.append(v[tok])
        current = nxt
    return current


# ---------------------------------------------------------------------------- display


def summarize(value: Any, limit: int = 600) -> str:
    """A short, readable rendering of an answer or body (tensors as dtype+shape)."""
    text = _render(value, 0)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _render(value: Any, depth: int) -> str:
    if is_tensor(value):
        flat = value.reshape(-1)[:6]
        head = ", ".join(_num(x) for x in flat.tolist())
        more = ", ..." if value.size > 6 else ""
        return f"<{dtype_name(value) or value.dtype} {list(value.shape)} [{head}{more}]>"
    if isinstance(value, bytes | bytearray | memoryview):
        return f"<{len(value)} bytes>"
    if depth > 6:
        return "..."
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {_render(v, depth + 1)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        items = [_render(v, depth + 1) for v in list(value)[:8]]
        if len(value) > 8:
            items.append(f"... {len(value)} items")
        return "[" + ", ".join(items) + "]"
    if isinstance(value, float):
        return _num(value)
    return repr(value)


def _num(x: Any) -> str:
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return f"{x:.6g}" if isinstance(x, float) else str(x)


def plain(value: Any) -> Any:
    """A JSON-serialisable copy (arrays as {dtype, shape, values}, bytes as their length)."""
    if is_tensor(value):
        return {
            "dtype": dtype_name(value),
            "shape": list(value.shape),
            "values": value.reshape(-1)[:16].tolist(),
        }
    if isinstance(value, bytes | bytearray | memoryview):
        return f"<{len(value)} bytes>"
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, np.generic):
        return value.item()
    return value


Expander = Callable[[Any], Any]
