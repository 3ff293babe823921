"""The one body checker, shared by the SDK (before sending) and the servers (on arrival).

It walks a body — a JSON object or a decoded DSSST1 value — against the op's `request_type`
message and its `(arctic.v1.field)` options (PROTOCOL.md §2): value types, enum names, required
fields, tensor dtypes and symbolic shapes; `google.protobuf.Struct` and `Value` fields pass
through. Strings obey their field's `pattern` and `max_length`; numbers fit their field's type
(integers in its range, doubles finite: no NaN, no infinity). The first hard problem raises
`BodyError` (code, field, message, details); unknown fields are collected over the whole body
and returned, so each side reports all of them in one error of its own type.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from ._generated.arctic.v1 import options_pb2, training_pb2
from ._proto_json import SYNONYMS, enum_to_json

_TENSOR = training_pb2.Tensor.DESCRIPTOR.full_name
_STRUCT = "google.protobuf.Struct"
_VALUE = "google.protobuf.Value"
# Messages of knobs: a server reports their unknown keys as `unsupported_option`, not bad fields.
OPTION_MESSAGES = frozenset({training_pb2.LossConfig.DESCRIPTOR.full_name})

_NUMPY_DTYPE_NAMES = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint64": "U64",
    "uint32": "U32",
    "uint16": "U16",
    "uint8": "U8",
    "bool": "BOOL",
}


def dtype_name(value: Any) -> str | None:
    """DSSST1 dtype name of an array (NumPy, or anything with a NumPy-named `dtype`)."""
    dt = getattr(value, "dtype", None)
    if dt is None:
        return None
    return _NUMPY_DTYPE_NAMES.get(str(dt).removeprefix("torch."))


class BodyError(Exception):
    """The first hard problem of a body: a spec error code, the field's path, what was wrong."""

    def __init__(self, code: str, path: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.code, self.path, self.message, self.details = code, path, message, details


@dataclass
class Leftovers:
    """What a walk collects instead of raising: unknown fields, and unknown knobs of
    `OPTION_MESSAGES` (when the walk keeps them apart)."""

    unknown: list[str] = field(default_factory=list)
    unsupported: list[str] = field(default_factory=list)


def check_body(
    desc: Descriptor, body: Any, *, options_apart: bool = False, synonyms: bool = False
) -> Leftovers:
    """Check `body` against the message `desc`; raise `BodyError` on the first hard problem.

    `options_apart`: unknown keys of `OPTION_MESSAGES` go to `Leftovers.unsupported` rather than
    `Leftovers.unknown`. `synonyms`: enum fields also take the deployed synonyms (PROTOCOL.md §2).
    """
    w = _Walker(options_apart=options_apart, synonyms=synonyms)
    w.message(desc, body, "")
    return w.found


def unknown_fields_message(desc: Descriptor, unknown: list[str]) -> str:
    """The text of the one error naming every unknown field of a body."""
    return (
        f"unknown field(s) {', '.join(unknown)} in {desc.name}; expected only "
        f"{', '.join(f.name for f in desc.fields)}"
    )


def _field_opts(fd: FieldDescriptor) -> options_pb2.FieldOptions:
    return fd.GetOptions().Extensions[options_pb2.field]


def _is_array(value: Any) -> bool:
    return isinstance(value, np.ndarray) or (
        hasattr(value, "shape") and hasattr(value, "dtype") and not isinstance(value, type)
    )


def _kind(value: Any) -> str:
    if _is_array(value):
        return f"a {type(value).__name__} of dtype {getattr(value, 'dtype', '?')}"
    return type(value).__name__


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


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


def _range_error(fd: FieldDescriptor, value: Any) -> tuple[str, str] | None:
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


def _scalar_ok(fd: FieldDescriptor, value: Any) -> tuple[bool, str]:
    """Whether `value` fits the non-message, non-enum field `fd`, and what was wanted."""
    t = fd.type
    if t == FieldDescriptor.TYPE_STRING:
        return isinstance(value, str), "a string"
    if t == FieldDescriptor.TYPE_BOOL:
        return isinstance(value, bool | np.bool_), "a boolean"
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        ok = isinstance(value, int | float | np.number) and not isinstance(value, bool)
        return ok, "a number"
    if t == FieldDescriptor.TYPE_BYTES:
        return isinstance(value, bytes | bytearray | memoryview), "bytes"
    return isinstance(value, int | np.integer) and not isinstance(value, bool), "an integer"


class _Walker:
    def __init__(self, *, options_apart: bool, synonyms: bool) -> None:
        self.options_apart, self.synonyms = options_apart, synonyms
        self.dims: dict[str, tuple[int, str]] = {}  # symbol -> (size, field that fixed it)
        self.found = Leftovers()

    def message(self, desc: Descriptor, value: Any, path: str) -> None:
        if not isinstance(value, Mapping):
            raise BodyError(
                "invalid_argument", path or "body", f"expected an object, got {_kind(value)}"
            )
        fields = desc.fields_by_name
        apart = self.options_apart and desc.full_name in OPTION_MESSAGES
        unknown = self.found.unsupported if apart else self.found.unknown
        before = len(unknown)
        for key in value:
            if not isinstance(key, str) or key not in fields:
                unknown.append(_join(path, str(key)))
        for fd in desc.fields:
            fpath = _join(path, fd.name)
            if fd.name not in value or value[fd.name] is None:
                # a missing required field next to unknown ones is most likely misspelt: the
                # unknown fields are the error to report
                if _field_opts(fd).required and len(unknown) == before:
                    raise BodyError("missing_field", fpath, "is required")
                continue
            self.field(fd, value[fd.name], fpath)

    def field(self, fd: FieldDescriptor, value: Any, path: str) -> None:
        mt = fd.message_type
        if mt is not None and mt.GetOptions().map_entry:
            if not isinstance(value, Mapping):
                raise BodyError("invalid_argument", path, f"expected an object, got {_kind(value)}")
            vfd = mt.fields_by_name["value"]
            for k, v in value.items():
                self.single(vfd, v, f"{path}.{k}")
        elif fd.is_repeated:
            if not isinstance(value, list | tuple):
                raise BodyError("invalid_argument", path, f"expected a list, got {_kind(value)}")
            for i, item in enumerate(value):
                self.single(fd, item, f"{path}[{i}]")
        else:
            self.single(fd, value, path)

    def single(self, fd: FieldDescriptor, value: Any, path: str) -> None:
        mt = fd.message_type
        if mt is not None:
            if mt.full_name == _TENSOR:
                self.tensor(fd, value, path)
            elif mt.full_name == _STRUCT:
                if not isinstance(value, Mapping):
                    raise BodyError(
                        "invalid_argument", path, f"expected an object, got {_kind(value)}"
                    )
            elif mt.full_name == _VALUE or (
                not isinstance(value, Mapping) and self.bare(mt, value)
            ):
                return
            else:
                self.message(mt, value, path)
            return
        if fd.enum_type is not None:
            self.enum(fd, value, path)
            return
        ok, want = _scalar_ok(fd, value)
        if not ok:
            raise BodyError("invalid_argument", path, f"expected {want}, got {_kind(value)}")
        if isinstance(value, str):
            opts = _field_opts(fd)
            if opts.pattern or opts.max_length:
                bad = string_rule_error(opts, value)
                if bad is not None:
                    expected = opts.pattern or f"at most {opts.max_length} characters"
                    raise BodyError("invalid_argument", path, bad, expected=expected)
        elif not isinstance(value, bool | np.bool_ | bytes | bytearray | memoryview):
            wrong = _range_error(fd, value)
            if wrong is not None:
                raise BodyError("invalid_argument", path, wrong[0], expected=wrong[1])

    def enum(self, fd: FieldDescriptor, value: Any, path: str) -> None:
        et = fd.enum_type
        assert et is not None
        names = {enum_to_json(et, v.name) for v in et.values}
        names.discard("unspecified")
        ok = isinstance(value, str) and (
            value.lower() in names
            or (self.synonyms and SYNONYMS.get(value.lower()) in names)
            or value in et.values_by_name
        )
        if not ok:
            raise BodyError(
                "invalid_argument",
                path,
                f"{value!r} is not one of {sorted(names)}",
                expected=sorted(names),
            )

    def tensor(self, fd: FieldDescriptor, value: Any, path: str) -> None:
        opts = _field_opts(fd)
        if isinstance(value, list):  # a JSON-ish nested list is accepted and coerced later
            try:
                value = np.asarray(value)
            except ValueError as exc:
                raise BodyError(
                    "invalid_argument", path, f"not a rectangular array ({exc})"
                ) from None
            if value.dtype == np.float64 and opts.dtypes and "F64" not in opts.dtypes:
                value = value.astype(np.float32)
        if not _is_array(value):
            raise BodyError("invalid_argument", path, f"expected a tensor, got {_kind(value)}")
        name = dtype_name(value)
        if opts.dtypes and name not in opts.dtypes and not (value.size == 0 and name == "F64"):
            raise BodyError(
                "dtype_mismatch",
                path,
                f"dtype {name or value.dtype} is not one of {list(opts.dtypes)}",
                dtype=str(name or value.dtype),
                expected=list(opts.dtypes),
            )
        if opts.shape:
            self.shape(opts.shape, tuple(int(d) for d in value.shape), path)

    def shape(self, spec: str, shape: tuple[int, ...], path: str) -> None:
        symbols = [s.strip() for s in spec.split(",")]
        if len(shape) != len(symbols):
            raise BodyError(
                "shape_mismatch",
                path,
                f"has shape {list(shape)}, expected rank {len(symbols)} [{spec}]",
                shape=list(shape),
                expected=f"[{spec}]",
            )
        for sym, size in zip(symbols, shape, strict=True):
            seen = self.dims.setdefault(sym, (size, path))
            if seen[0] != size:
                raise BodyError(
                    "shape_mismatch",
                    path,
                    f"dimension {sym} is {size} but {seen[1]} has {sym} = {seen[0]}",
                    shape=list(shape),
                    expected=f"{sym} = {seen[0]} (from {seen[1]})",
                )

    def bare(self, desc: Descriptor, value: Any) -> bool:
        """A message made of one oneof (or one repeated scalar) also takes its bare member value.

        `Prompt` accepts "text" or [1, 2, 3]; `TokenIds` accepts [1, 2, 3].
        """
        members = list(desc.fields)
        if len(members) == 1 and members[0].is_repeated:
            fd = members[0]
            if fd.message_type is None and isinstance(value, list | tuple):
                _Walker(options_apart=self.options_apart, synonyms=self.synonyms).field(
                    fd, list(value), desc.name
                )
                return True
            if fd.message_type is None and _is_array(value) and getattr(value, "ndim", 0) == 1:
                return True
        if desc.oneofs and len(desc.oneofs) == 1 and len(desc.oneofs[0].fields) == len(members):
            for fd in members:
                if fd.message_type is None and fd.type == FieldDescriptor.TYPE_STRING:
                    if isinstance(value, str):
                        return True
                elif fd.message_type is not None and self.bare(fd.message_type, value):
                    return True
        return False
