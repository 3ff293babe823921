"""Value rules of the spec's fields: a string's `pattern` / `max_length`, a number's range by its
proto type (integers in range, doubles finite), and a number's `(arctic.v1.field)` bounds (the
generated `tables.request_rules`). Used by the body checker, the servers' protocol layer and the
checkpoint-id resolver of the servers (PROTOCOL.md §13)."""

from __future__ import annotations

import functools
import math
import numbers
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from google.protobuf.descriptor import FieldDescriptor

from arctic_sdk.spec.model import Bound
from arctic_sdk.spec.pb.arctic.v1 import options_pb2

_INT_RANGES = {
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1, "an int64"),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1, "an int64"),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1, "an int64"),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1, "a uint64"),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1, "a uint64"),
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1, "an int32"),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1, "an int32"),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1, "an int32"),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1, "a uint32"),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1, "a uint32"),
}


@functools.lru_cache(maxsize=64)
def _regex(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def string_rule_error(opts: options_pb2.FieldOptions, value: str) -> str | None:
    """What is wrong with `value` under a string field's `pattern` / `max_length`, or None."""
    if opts.max_length and len(value) > opts.max_length:
        return f"is {len(value)} characters long, longer than {opts.max_length}"
    if opts.pattern and _regex(opts.pattern).fullmatch(value) is None:
        shown = value if len(value) <= 80 else value[:77] + "..."
        return f"{shown!r} does not match {opts.pattern}"
    return None


def range_error(fd: FieldDescriptor, value: Any) -> tuple[str, str] | None:
    """(what is wrong, expected) when a number does not fit its field's type, else None."""
    t = fd.type
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        try:
            x = float(value)
        except OverflowError:
            return "is too large for a double", "a finite number"
        if not math.isfinite(x):
            return f"{value!r} is not a finite number", "a finite number (no NaN or infinity)"
        return None
    lo, hi, name = _INT_RANGES.get(t, (None, None, ""))
    if lo is not None and hi is not None and not lo <= int(value) <= hi:
        n = int(value)
        shown = str(n) if abs(n) < 10**30 else f"a {len(str(abs(n)))}-digit integer"
        return f"{shown} is outside {name}", f"{name}: {lo} <= n <= {hi}"
    return None


def plain_ints_within(items: Sequence[Any], lo: float, hi: float) -> bool:
    """Whether every item is a plain `int` (not a bool, not a numpy scalar) in [lo, hi], in one
    pass: the common large list (a prompt's token ids) without a check per item. False says
    nothing about which item is wrong; the caller then checks item by item for its error."""
    if not items:
        return True
    return all(type(v) is int for v in items) and lo <= min(items) and max(items) <= hi


def plain_floats_finite(items: Sequence[Any]) -> bool:
    """Whether every item is a plain finite `float`, in one pass (see `plain_ints_within`)."""
    return all(type(v) is float for v in items) and all(map(math.isfinite, items))


def repeated_scalars_fit(
    fd: FieldDescriptor, opts: options_pb2.FieldOptions, items: Sequence[Any]
) -> bool:
    """Whether every item of the repeated scalar field `fd` passes the checks a single value of it
    gets (type, the proto type's range, finiteness), in one pass; only for fields without a value
    list or string rules. False: check item by item, which names the first bad one."""
    if opts.values or opts.pattern or opts.max_length:
        return False
    t = fd.type
    rng = _INT_RANGES.get(t)
    if rng is not None:
        return plain_ints_within(items, rng[0], rng[1])
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return plain_floats_finite(items)
    if t == FieldDescriptor.TYPE_STRING:
        return all(type(v) is str for v in items)
    return False


def bound_error(
    bounds: Iterable[Bound], body: Mapping[str, Any], prefix: str = ""
) -> tuple[str, str, str] | None:
    """(field path, what is wrong, expected) of the first present field of `body` outside its
    bounds, else None. Absent and null fields are not checked; `prefix` is prepended to paths
    (a `SamplingParams` checked inside another body: "sampling_params.")."""
    for b in bounds:
        value: Any = body
        for name in b.path.split("."):
            value = value.get(name) if isinstance(value, Mapping) else None
        if value is None:
            continue
        number = isinstance(value, numbers.Real) and not isinstance(value, bool)
        if not number or not b.holds(float(value)):
            return prefix + b.path, f"{value!r} is not {b.bounds}", b.expected or b.bounds
    return None
