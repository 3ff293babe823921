"""Body validation driven by the spec's message descriptors and `(arctic.v1.field)` options.

One walker checks every op's body — JSON or DSSST1 — against its `request_type` message: unknown
fields, value types, enum names, required fields, and for tensors their dtype and symbolic shape.
Every failure is a `ProtocolError` naming the field, the value and what was expected.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from arctic_sdk._generated.arctic.v1 import options_pb2, training_pb2

from .errors import ProtocolError

_TENSOR = training_pb2.Tensor.DESCRIPTOR.full_name
_STRUCT = "google.protobuf.Struct"
_VALUE = "google.protobuf.Value"
# Messages of knobs: their unknown keys are `unsupported_option` (all listed), not a bad field.
_OPTION_MESSAGES = frozenset({training_pb2.LossConfig.DESCRIPTOR.full_name})
# Deployed enum synonyms readers accept (PROTOCOL.md §2).
_ENUM_SYNONYMS = {"succeeded": "completed", "done": "completed", "canceled": "cancelled",
                  "log_probability": "log_prob"}  # fmt: skip

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


def enum_json_name(enum_type_name: str, value_name: str) -> str:
    """`JOB_STATE_RUNNING` of `JobState` -> "running" (PROTOCOL.md §2)."""
    prefix = "".join("_" + c if c.isupper() else c for c in enum_type_name).lstrip("_").upper()
    return value_name.removeprefix(prefix + "_").lower()


def _field_opts(fd: FieldDescriptor) -> options_pb2.FieldOptions:
    return fd.GetOptions().Extensions[options_pb2.field]


def _is_array(value: Any) -> bool:
    return isinstance(value, np.ndarray) or (
        hasattr(value, "shape") and hasattr(value, "dtype") and not isinstance(value, type)
    )


def _bad(code: str, field: str, message: str, **details: Any) -> ProtocolError:
    return ProtocolError(code, f"field {field}: {message}", field=field, **details)


class _Walker:
    def __init__(self) -> None:
        self.dims: dict[str, tuple[int, str]] = {}  # symbol -> (size, field that fixed it)
        self.unknown: list[str] = []
        self.unsupported: list[str] = []

    def message(self, desc: Descriptor, value: Any, path: str) -> None:
        if not isinstance(value, Mapping):
            raise _bad(
                "invalid_argument", path or "body", f"expected an object, got {_kind(value)}"
            )
        fields = desc.fields_by_name
        unknown = self.unsupported if desc.full_name in _OPTION_MESSAGES else self.unknown
        for key in value:
            if not isinstance(key, str) or key not in fields:
                unknown.append(_join(path, str(key)))
        for fd in desc.fields:
            opts = _field_opts(fd)
            fpath = _join(path, fd.name)
            if fd.name not in value or value[fd.name] is None:
                if opts.required:
                    raise _bad("missing_field", fpath, "is required")
                continue
            self.field(fd, value[fd.name], fpath)

    def field(self, fd: FieldDescriptor, value: Any, path: str) -> None:
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            if not isinstance(value, Mapping):
                raise _bad("invalid_argument", path, f"expected an object, got {_kind(value)}")
            vfd = fd.message_type.fields_by_name["value"]
            for k, v in value.items():
                self.single(vfd, v, f"{path}.{k}")
            return
        if fd.is_repeated:
            if not isinstance(value, list | tuple):
                raise _bad("invalid_argument", path, f"expected a list, got {_kind(value)}")
            for i, item in enumerate(value):
                self.single(fd, item, f"{path}[{i}]")
            return
        self.single(fd, value, path)

    def single(self, fd: FieldDescriptor, value: Any, path: str) -> None:
        mt = fd.message_type
        if mt is not None:
            if mt.full_name == _TENSOR:
                self.tensor(fd, value, path)
            elif mt.full_name == _STRUCT:
                if not isinstance(value, Mapping):
                    raise _bad("invalid_argument", path, f"expected an object, got {_kind(value)}")
            elif mt.full_name == _VALUE or (
                not isinstance(value, Mapping) and _bare_form(mt, value)
            ):
                return
            else:
                self.message(mt, value, path)
            return
        if fd.enum_type is not None:
            names = {enum_json_name(fd.enum_type.name, v.name) for v in fd.enum_type.values}
            names.discard("unspecified")
            ok = isinstance(value, str) and (
                value.lower() in names
                or _ENUM_SYNONYMS.get(value.lower()) in names
                or value in fd.enum_type.values_by_name
            )
            if not ok:
                raise _bad(
                    "invalid_argument",
                    path,
                    f"{value!r} is not one of {sorted(names)}",
                    expected=sorted(names),
                )
            return
        t = fd.type
        if t in (FieldDescriptor.TYPE_STRING,):
            ok = isinstance(value, str)
            want = "a string"
        elif t == FieldDescriptor.TYPE_BOOL:
            ok = isinstance(value, bool | np.bool_)
            want = "a boolean"
        elif t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
            ok = isinstance(value, int | float | np.number) and not isinstance(value, bool)
            want = "a number"
        elif t == FieldDescriptor.TYPE_BYTES:
            ok = isinstance(value, bytes | bytearray | memoryview)
            want = "bytes"
        else:
            ok = isinstance(value, int | np.integer) and not isinstance(value, bool)
            want = "an integer"
        if not ok:
            raise _bad("invalid_argument", path, f"expected {want}, got {_kind(value)}")

    def tensor(self, fd: FieldDescriptor, value: Any, path: str) -> None:
        opts = _field_opts(fd)
        if isinstance(value, list):  # a JSON-ish nested list is accepted and coerced later
            try:
                value = np.asarray(value)
            except ValueError as exc:
                raise _bad("invalid_argument", path, f"not a rectangular array ({exc})") from None
            if value.dtype == np.float64 and "F64" not in opts.dtypes and opts.dtypes:
                value = value.astype(np.float32)
        if not _is_array(value):
            raise _bad("invalid_argument", path, f"expected a tensor, got {_kind(value)}")
        name = dtype_name(value)
        if opts.dtypes and name not in opts.dtypes and not (value.size == 0 and name == "F64"):
            raise _bad(
                "dtype_mismatch",
                path,
                f"dtype {name or value.dtype} is not one of {list(opts.dtypes)}",
                dtype=str(name or value.dtype),
                expected=list(opts.dtypes),
            )
        if opts.shape:
            symbols = [s.strip() for s in opts.shape.split(",")]
            shape = tuple(int(d) for d in value.shape)
            if len(shape) != len(symbols):
                raise _bad(
                    "shape_mismatch",
                    path,
                    f"has shape {list(shape)}, expected rank {len(symbols)} [{opts.shape}]",
                    shape=list(shape),
                    expected=f"[{opts.shape}]",
                )
            for sym, size in zip(symbols, shape, strict=True):
                seen = self.dims.get(sym)
                if seen is None:
                    self.dims[sym] = (size, path)
                elif seen[0] != size:
                    raise _bad(
                        "shape_mismatch",
                        path,
                        f"dimension {sym} is {size} but {seen[1]} has {sym} = {seen[0]}",
                        shape=list(shape),
                        expected=f"{sym} = {seen[0]} (from {seen[1]})",
                    )


def _bare_form(desc: Descriptor, value: Any) -> bool:
    """A message made of one oneof (or one repeated scalar) also accepts its bare member value.

    `Prompt` accepts "text" or [1, 2, 3]; `TokenIds` accepts [1, 2, 3].
    """
    members = list(desc.fields)
    if len(members) == 1 and members[0].is_repeated:
        fd = members[0]
        if fd.message_type is None and isinstance(value, list | tuple):
            w = _Walker()
            w.field(fd, list(value), desc.name)
            return True
        if fd.message_type is None and _is_array(value) and getattr(value, "ndim", 0) == 1:
            return True
    if desc.oneofs and len(desc.oneofs) == 1 and len(desc.oneofs[0].fields) == len(members):
        for fd in members:
            if fd.message_type is None and fd.type == FieldDescriptor.TYPE_STRING:
                if isinstance(value, str):
                    return True
            elif fd.message_type is not None and _bare_form(fd.message_type, value):
                return True
    return False


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _kind(value: Any) -> str:
    if _is_array(value):
        return f"a {type(value).__name__} of dtype {getattr(value, 'dtype', '?')}"
    return type(value).__name__


def validate_body(desc: Descriptor, body: Any) -> None:
    """Check `body` against the message `desc`; raise `ProtocolError` on the first problem.

    Unknown fields are collected over the whole body and reported together
    (`invalid_argument`, `details.unknown_fields`), so a caller fixes them in one round.
    """
    w = _Walker()
    w.message(desc, body, "")
    if w.unknown:
        raise ProtocolError(
            "invalid_argument",
            f"unknown field(s) {', '.join(w.unknown)} in {desc.name}; expected only "
            f"{', '.join(f.name for f in desc.fields)}",
            field=w.unknown[0],
            unknown_fields=w.unknown,
        )
    if w.unsupported:
        raise ProtocolError(
            "unsupported_option",
            f"unknown option(s) {', '.join(w.unsupported)}; this server cannot honour them",
            field=w.unsupported[0],
            options=w.unsupported,
        )
