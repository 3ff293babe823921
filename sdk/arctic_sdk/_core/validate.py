"""Client-side body validation: bad input is refused before anything is sent.

The same checks servers run (PROTOCOL.md §2), driven by the request message's descriptor and
its `(arctic.v1.field)` options: unknown fields (all of them, in one error), value types, enum
names, required fields, tensor dtypes and symbolic shapes. `google.protobuf.Struct` and `Value`
fields pass through. Failures raise `InvalidArgumentError` with the code a server would answer
(`invalid_argument`, `missing_field`, `dtype_mismatch`, `shape_mismatch`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from google.protobuf import descriptor_pool
from google.protobuf.descriptor import Descriptor, FieldDescriptor

import arctic_sdk._generated.arctic.v1 as _pb  # noqa: F401  (registers the spec's messages)

from .._generated.arctic.v1 import options_pb2, training_pb2
from .._generated.types import REQUIRED_FIELDS
from .._spec import MethodInfo
from ..errors import InvalidArgumentError

_TENSOR = training_pb2.Tensor.DESCRIPTOR.full_name
_STRUCT = "google.protobuf.Struct"
_VALUE = "google.protobuf.Value"
_DTYPES = {
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
_POOL = descriptor_pool.Default()


def _dtype_name(value: Any) -> str | None:
    dt = getattr(value, "dtype", None)
    return None if dt is None else _DTYPES.get(str(dt).removeprefix("torch."))


def _enum_names(fd: FieldDescriptor) -> set[str]:
    et = fd.enum_type
    assert et is not None
    prefix = "".join("_" + c if c.isupper() else c for c in et.name).lstrip("_").upper() + "_"
    names = {v.name.removeprefix(prefix).lower() for v in et.values}
    names.discard("unspecified")
    return names


def _is_array(value: Any) -> bool:
    return isinstance(value, np.ndarray) or (
        hasattr(value, "shape") and hasattr(value, "dtype") and not isinstance(value, type)
    )


def _kind(value: Any) -> str:
    if _is_array(value):
        return f"a {type(value).__name__} of dtype {getattr(value, 'dtype', '?')}"
    return type(value).__name__


class _Bad(Exception):
    def __init__(self, code: str, path: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.code, self.path, self.message, self.details = code, path, message, details


class _Walker:
    def __init__(self) -> None:
        self.dims: dict[str, tuple[int, str]] = {}
        self.unknown: list[str] = []

    def message(self, desc: Descriptor, value: Any, path: str) -> None:
        if not isinstance(value, Mapping):
            raise _Bad(
                "invalid_argument", path or "body", f"expected an object, got {_kind(value)}"
            )
        fields = desc.fields_by_name
        for key in value:
            if not isinstance(key, str) or key not in fields:
                self.unknown.append(f"{path}.{key}" if path else str(key))
        for fd in desc.fields:
            fpath = f"{path}.{fd.name}" if path else fd.name
            if fd.name not in value or value[fd.name] is None:
                if fd.GetOptions().Extensions[options_pb2.field].required:
                    raise _Bad("missing_field", fpath, "is required")
                continue
            self.field(fd, value[fd.name], fpath)

    def field(self, fd: FieldDescriptor, value: Any, path: str) -> None:
        mt = fd.message_type
        if mt is not None and mt.GetOptions().map_entry:
            if not isinstance(value, Mapping):
                raise _Bad("invalid_argument", path, f"expected an object, got {_kind(value)}")
            vfd = mt.fields_by_name["value"]
            for k, v in value.items():
                self.single(vfd, v, f"{path}.{k}")
        elif fd.is_repeated:
            if not isinstance(value, list | tuple):
                raise _Bad("invalid_argument", path, f"expected a list, got {_kind(value)}")
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
                    raise _Bad("invalid_argument", path, f"expected an object, got {_kind(value)}")
            elif mt.full_name == _VALUE or (not isinstance(value, Mapping) and _bare(mt, value)):
                return
            else:
                self.message(mt, value, path)
            return
        if fd.enum_type is not None:
            names = _enum_names(fd)
            if not (
                isinstance(value, str)
                and (value.lower() in names or value in fd.enum_type.values_by_name)
            ):
                raise _Bad(
                    "invalid_argument",
                    path,
                    f"{value!r} is not one of {sorted(names)}",
                    expected=sorted(names),
                )
            return
        t = fd.type
        if t == FieldDescriptor.TYPE_STRING:
            ok, want = isinstance(value, str), "a string"
        elif t == FieldDescriptor.TYPE_BOOL:
            ok, want = isinstance(value, bool | np.bool_), "a boolean"
        elif t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
            ok = isinstance(value, int | float | np.number) and not isinstance(value, bool)
            want = "a number"
        elif t == FieldDescriptor.TYPE_BYTES:
            ok, want = isinstance(value, bytes | bytearray | memoryview), "bytes"
        else:
            ok = isinstance(value, int | np.integer) and not isinstance(value, bool)
            want = "an integer"
        if not ok:
            raise _Bad("invalid_argument", path, f"expected {want}, got {_kind(value)}")

    def tensor(self, fd: FieldDescriptor, value: Any, path: str) -> None:
        opts = fd.GetOptions().Extensions[options_pb2.field]
        if isinstance(value, list):
            try:
                value = np.asarray(value)
            except ValueError as exc:
                raise _Bad("invalid_argument", path, f"not a rectangular array ({exc})") from None
            if value.dtype == np.float64 and opts.dtypes and "F64" not in opts.dtypes:
                value = value.astype(np.float32)
        if not _is_array(value):
            raise _Bad("invalid_argument", path, f"expected a tensor, got {_kind(value)}")
        name = _dtype_name(value)
        if opts.dtypes and name not in opts.dtypes and not (value.size == 0 and name == "F64"):
            raise _Bad(
                "dtype_mismatch",
                path,
                f"dtype {name or value.dtype} is not one of {list(opts.dtypes)}",
                dtype=str(name or value.dtype),
                expected=list(opts.dtypes),
            )
        if not opts.shape:
            return
        symbols = [s.strip() for s in opts.shape.split(",")]
        shape = tuple(int(d) for d in value.shape)
        if len(shape) != len(symbols):
            raise _Bad(
                "shape_mismatch",
                path,
                f"has shape {list(shape)}, expected rank {len(symbols)} [{opts.shape}]",
                shape=list(shape),
                expected=f"[{opts.shape}]",
            )
        for sym, size in zip(symbols, shape, strict=True):
            seen = self.dims.setdefault(sym, (size, path))
            if seen[0] != size:
                raise _Bad(
                    "shape_mismatch",
                    path,
                    f"dimension {sym} is {size} but {seen[1]} has {sym} = {seen[0]}",
                    shape=list(shape),
                    expected=f"{sym} = {seen[0]} (from {seen[1]})",
                )


def _bare(desc: Descriptor, value: Any) -> bool:
    """A one-oneof message (or one repeated scalar) also takes its bare member value."""
    members = list(desc.fields)
    if len(members) == 1 and members[0].is_repeated:
        fd = members[0]
        if fd.message_type is None and isinstance(value, list | tuple):
            _Walker().field(fd, list(value), desc.name)
            return True
        if fd.message_type is None and _is_array(value) and getattr(value, "ndim", 0) == 1:
            return True
    if desc.oneofs and len(desc.oneofs) == 1 and len(desc.oneofs[0].fields) == len(members):
        for fd in members:
            if fd.message_type is None and fd.type == FieldDescriptor.TYPE_STRING:
                if isinstance(value, str):
                    return True
            elif fd.message_type is not None and _bare(fd.message_type, value):
                return True
    return False


def validate_body(method: MethodInfo, body: Mapping[str, Any]) -> None:
    """Check the body of a call to `method` (path parameters already removed)."""
    if not method.request_type or (not body and not REQUIRED_FIELDS.get(method.request_type)):
        return  # nothing to check (an empty body of an op without required fields)
    desc = _POOL.FindMessageTypeByName(method.request_type)
    params = set(method.path_params)
    w = _Walker()
    try:
        w.message(desc, {k: v for k, v in body.items() if k not in params}, "")
    except _Bad as bad:
        raise InvalidArgumentError(
            f"{method.name}: field {bad.path}: {bad.message}",
            code=bad.code,
            op=method.name,
            details={"field": bad.path, **bad.details},
        ) from None
    if w.unknown:
        raise InvalidArgumentError(
            f"{method.name}: unknown field(s) {', '.join(w.unknown)} in {desc.name}; expected "
            f"only {', '.join(f.name for f in desc.fields)}",
            code="invalid_argument",
            op=method.name,
            details={"field": w.unknown[0], "unknown_fields": w.unknown},
        )
