"""Expectations: does a `Reply` say what the spec requires? Each check answers the first
difference as a sentence, or None.

The `expect` vocabulary is documented in conformance/cases/README.md.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from arctic_sdk.spec.tables.error_codes import ERRORS

from .values import CaseDataError, Scope, dtype_name, get_path, is_tensor, summarize
from .wire import Reply

#: Codes a DSSST1 reader raises (DSSST1.md §6, §8, §9): never the answer to a well-formed frame.
CODEC_CODES = frozenset(c for c, e in ERRORS.items() if e.doc.startswith("DSSST1"))
TERMINAL = ("completed", "failed", "cancelled")
EXPECT_KEYS = frozenset(
    {
        "ok",
        "status",
        "error",
        "error_any",
        "failed",
        "fails_with",
        "http_status",
        "grpc_status",
        "error_body",
        "fields",
        "headers",
        "not_codec_error",
        "not_error",
        "refuses",
        "or_refuses",
        "http",
        "grpc",
    }
)


def _num(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float | np.integer | np.floating):
        return float(value)
    return None


def _same(a: Any, b: Any) -> bool:
    if is_tensor(a) or is_tensor(b):
        return (
            is_tensor(a)
            and is_tensor(b)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
        )
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    x, y = _num(a), _num(b)
    if x is not None and y is not None:
        return x == y or (math.isnan(x) and math.isnan(y))
    a = a.item() if isinstance(a, np.generic) else a
    b = b.item() if isinstance(b, np.generic) else b
    return type(a) is type(b) and bool(a == b)


def _array(value: Any) -> np.ndarray[Any, Any] | None:
    if is_tensor(value):
        arr: np.ndarray[Any, Any] = value
        return arr
    if isinstance(value, list | tuple) and all(_num(v) is not None for v in _flat(value)):
        return np.asarray(value, dtype=np.float64)
    if _num(value) is not None:
        return np.asarray([value], dtype=np.float64)
    return None


def _flat(value: Any) -> list[Any]:
    if isinstance(value, list | tuple):
        return [x for v in value for x in _flat(v)]
    return [value]


_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int | np.integer) and not isinstance(v, bool),
    "number": lambda v: _num(v) is not None,
    "boolean": lambda v: isinstance(v, bool | np.bool_),
    "object": lambda v: isinstance(v, Mapping),
    "list": lambda v: isinstance(v, list | tuple),
    "tensor": is_tensor,
    "bytes": lambda v: isinstance(v, bytes | bytearray),
    "null": lambda v: v is None,
}


def _compare(op: str, value: Any, arg: Any) -> str | None:
    x, y = _num(value), _num(arg)
    if x is None or y is None:
        return f"{summarize(value, 80)} is not a number to compare with {arg!r}"
    ok = {"gt": x > y, "ge": x >= y, "lt": x < y, "le": x <= y}[op]
    sign = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}[op]
    return None if ok else f"{x:g} is not {sign} {y:g}"


def match(name: str, arg: Any, value: Any, dims: Mapping[str, Any]) -> str | None:
    """One matcher against one selected value; None when it holds."""
    if name == "eq":
        return None if _same(value, arg) else f"{summarize(value, 160)} != {summarize(arg, 160)}"
    if name == "ne":
        return None if not _same(value, arg) else f"{summarize(value, 160)} should differ"
    if name == "in":
        return None if any(_same(value, a) for a in arg) else f"{value!r} is not one of {arg}"
    if name in ("gt", "ge", "lt", "le"):
        return _compare(name, value, arg)
    if name == "type":
        ok = _TYPES[str(arg)](value)
        return None if ok else f"{summarize(value, 80)} is not a {arg} ({type(value).__name__})"
    if name == "nonempty":
        return None if bool(len(value)) == bool(arg) else f"{summarize(value, 80)} emptiness"
    if name in ("len", "len_le", "len_ge"):
        if not hasattr(value, "__len__"):
            return f"{summarize(value, 80)} has no length"
        n = len(value)
        ok = {"len": n == arg, "len_le": n <= arg, "len_ge": n >= arg}[name]
        sign = {"len": "==", "len_le": "<=", "len_ge": ">="}[name]
        return None if ok else f"length {n}, expected {sign} {arg}"
    if name == "contains":
        hit = str(arg) in value if isinstance(value, str) else any(_same(v, arg) for v in value)
        return None if hit else f"{summarize(value, 120)} does not contain {arg!r}"
    if name == "matches":
        ok = isinstance(value, str) and re.search(str(arg), value) is not None
        return None if ok else f"{value!r} does not match /{arg}/"
    if name == "prefix_of":
        if isinstance(value, str):
            ok = str(arg).startswith(value)
        else:
            ok = isinstance(value, list | tuple) and _same(list(arg[: len(value)]), list(value))
        return None if ok else f"{summarize(value, 80)} is not a prefix of {summarize(arg, 80)}"
    if name == "starts_with":  # the value begins with arg (a string or a list)
        if isinstance(value, str):
            ok = value.startswith(str(arg))
        else:
            ok = isinstance(value, list | tuple) and _same(list(value[: len(arg)]), list(arg))
        return None if ok else f"{summarize(value, 120)} does not start with {summarize(arg, 120)}"
    if name == "cut_at_stop":
        text, stop = str(arg["text"]), str(arg["stop"])
        want = text[: text.find(stop)] if stop in text else text
        return None if value == want else f"{value!r} is not {want!r} (cut before {stop!r})"
    if name == "contains_item":  # some element (an object) has these key values
        items = value if isinstance(value, list | tuple) else []
        hit = any(
            isinstance(i, Mapping) and all(_same(i.get(k), v) for k, v in arg.items())
            for i in items
        )
        return None if hit else f"no element of {summarize(value, 160)} has {arg}"
    if name == "count_items":  # how many elements (objects) have arg.where's key values
        items = value if isinstance(value, list | tuple) else []
        n = sum(
            1
            for i in items
            if isinstance(i, Mapping) and all(_same(i.get(k), v) for k, v in arg["where"].items())
        )
        return (
            None if n == arg["eq"] else f"{n} element(s) have {arg['where']}, expected {arg['eq']}"
        )
    if name == "lacks_item":
        items = value if isinstance(value, list | tuple) else []
        hit = any(
            isinstance(i, Mapping) and all(_same(i.get(k), v) for k, v in arg.items())
            for i in items
        )
        return None if not hit else f"an element of {summarize(value, 160)} has {arg}"
    if name == "close_to":  # {value, rel}: a float equal up to a relative tolerance
        x, target = _num(value), float(arg["value"])
        tol = float(arg.get("rel", 1e-5)) * max(abs(target), 1e-12)
        ok = x is not None and abs(x - target) <= tol
        return None if ok else f"{value!r} is not within {tol:g} of {target!r}"
    if name == "ordered_in":  # a list whose items appear in this order in `arg` (no repeats)
        if not isinstance(value, list | tuple):
            return f"{summarize(value, 80)} is not a list"
        pos = [list(arg).index(v) if v in arg else -1 for v in value]
        ok = all(p >= 0 for p in pos) and all(a < b for a, b in itertools.pairwise(pos))
        return None if ok else f"{list(value)} is not in the order {list(arg)}"
    if name == "sha256":
        ok = isinstance(value, bytes | bytearray) and hashlib.sha256(value).hexdigest() == arg
        return None if ok else f"{summarize(value, 60)} does not have sha256 {arg}"
    if name == "dtype":
        got = dtype_name(value) if is_tensor(value) else type(value).__name__
        return None if got == arg else f"dtype {got}, expected {arg}"
    if name == "shape":
        dims_want = [int(dims[d]) if isinstance(d, str) else int(d) for d in arg]
        shape = list(value.shape) if is_tensor(value) else _list_shape(value)
        return None if shape == dims_want else f"shape {shape}, expected {dims_want} ({arg})"
    return _tensor_match(name, arg, value)


def _list_shape(value: Any) -> list[int] | None:
    if not isinstance(value, list | tuple):
        return None
    inner = _list_shape(value[0]) if value else []
    return [len(value), *(inner or [])]


def _tensor_match(name: str, arg: Any, value: Any) -> str | None:
    arr = _array(value)
    if arr is None:
        return f"{summarize(value, 80)} is not numeric"
    a = arr.astype(np.float64) if arr.dtype.kind != "c" else arr
    if name == "finite":
        bad = ~np.isfinite(a)
        if not arg or not bad.any():
            return None
        return f"{int(bad.sum())} non-finite value(s), e.g. {a[bad].flat[0]}"
    if name in ("all_le", "all_lt", "all_ge", "all_gt"):
        ok = {"all_le": a <= arg, "all_lt": a < arg, "all_ge": a >= arg, "all_gt": a > arg}[name]
        if bool(np.all(ok)):
            return None
        return f"{int((~ok).sum())} value(s) break {name} {arg}, e.g. {a[~ok].flat[0]:g}"
    if name == "last_column_zero":
        if a.ndim < 2:
            return f"rank {a.ndim}, expected a [B, S] tensor"
        col = a[..., -1]
        return None if bool(np.all(col == 0)) else f"last column is {summarize(col, 120)}, not 0"
    if name == "any_nonzero":
        return None if bool(np.any(a != 0)) == bool(arg) else "every value is 0"
    raise CaseDataError(f"unknown matcher {name!r}")


def check_fields(
    fields: Mapping[str, Any], value: Any, scope: Scope, dims: Mapping[str, Any]
) -> str | None:
    for path, spec in fields.items():
        spec = scope.expand(spec)
        if "${" in path:  # `data[id=${job}]`
            path = str(scope.expand(path))
        if not isinstance(spec, Mapping):
            spec = {"eq": spec}
        found = [scope.lookup(path[1:])] if path.startswith("@") else get_path(value, path)
        if "present" in spec:  # true / false, or "optional": absent, or matching the rest
            optional = spec["present"] == "optional"
            if not optional and bool(found) != bool(spec["present"]):
                return f"{path}: {'missing' if not found else 'present, should be absent'}"
            if not found:
                continue
        if not found:
            return f"{path}: missing in {summarize(value, 200)}"
        for name, arg in spec.items():
            if name == "present":
                continue
            for v in found:
                if name == "json":  # a string holding JSON: its value against these fields
                    diff = _json_fields(arg, v, scope, dims)
                else:
                    diff = match(name, arg, v, dims)
                if diff is not None:
                    return f"{path}: {diff}"
    return None


def _json_fields(
    fields: Mapping[str, Any], value: Any, scope: Scope, dims: Mapping[str, Any]
) -> str | None:
    if not isinstance(value, str):
        return f"{summarize(value, 80)} is not a string holding JSON"
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        return f"{value[:120]!r} is not JSON ({exc})"
    diff = check_fields(fields, parsed, scope, dims)
    return None if diff is None else f"(JSON {value[:120]!r}) {diff}"


# ---------------------------------------------------------------------------- error replies


def error_body_problem(reply: Reply) -> str | None:
    """Why the body is not the spec's `{"error": {"code", "message", "details"}}` (PROTOCOL §6)."""
    body = reply.body
    if body is None:
        where = "x-arctic-error-bin trailer" if reply.transport == "grpc" else "body"
        return f"no error body ({where} missing)"
    if not isinstance(body, Mapping) or not isinstance(body.get("error"), Mapping):
        return f'the error body is not {{"error": {{...}}}}: {summarize(body, 160)}'
    err = body["error"]
    if not isinstance(err.get("code"), str) or err["code"] not in ERRORS:
        return f"error.code {err.get('code')!r} is not a code of errors.proto"
    if not isinstance(err.get("message"), str) or not err["message"]:
        return "error.message is missing or empty"
    if err.get("details") is not None and not isinstance(err["details"], Mapping):
        return f"error.details is not an object: {err['details']!r}"
    return None


def status_of(code: str, transport: str) -> str:
    e = ERRORS[code]
    return e.grpc_status if transport == "grpc" else str(e.http_status)


def check_error(reply: Reply, codes: Sequence[str], body_optional: bool) -> str | None:
    want = " or ".join(f"{c} ({status_of(c, reply.transport)})" for c in codes)
    if not reply.is_error:
        return f"answered {reply.describe_status()} ({_brief(reply)}), expected refusal {want}"
    got = reply.grpc_code if reply.transport == "grpc" else str(reply.status)
    if got not in {status_of(c, reply.transport) for c in codes}:
        return f"answered {reply.describe_status()}, expected {want}"
    if reply.body is None and body_optional:
        return None
    problem = error_body_problem(reply)
    if problem is not None:
        return problem
    code = reply.code
    if code is None or code not in codes:
        return f"error.code {code!r} ({got}), expected {want}"
    own = status_of(code, reply.transport)
    if own != got:
        return f"status {got} does not belong to error.code {code} ({own})"
    return None


def _brief(reply: Reply) -> str:
    body = reply.body
    if isinstance(body, Mapping) and "status" in body:
        err = body.get("error")
        code = err.get("code") if isinstance(err, Mapping) else None
        return f"status {body.get('status')}" + (f", error {code}" if code else "")
    return summarize(body, 80)
