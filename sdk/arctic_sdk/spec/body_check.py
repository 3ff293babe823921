"""The one body checker, shared by the SDK (before sending) and the servers (on arrival).

It walks a body — a JSON object or a decoded DSSST1 value — against the op's `request_type`
message and its `(arctic.v1.field)` options (PROTOCOL.md §2): value types, enum names, the
values a string field takes, string `pattern` and `max_length`, numbers that fit their field's
type (integers in its range, doubles finite: no NaN, no infinity), required fields, tensor dtypes
and symbolic shapes, and the per-loss fields of forward-backward / forward (a field
`processing.loss_fn` does not read is refused, never ignored; PROTOCOL.md §9);
`google.protobuf.Struct` and `Value` fields pass through. The first hard problem raises
`BodyError` (code, field, message, details); unknown fields (each with the fields expected at its
place and a "did you mean"), missing fields and fields the loss does not read are collected over
the whole body, and `leftover_error` turns them into the one error each side raises in its own
type — unknown fields first, so a misspelt `kwargz` is named as such rather than reported as a
missing `kwargs`.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from arctic_sdk.spec.pb.arctic.v1 import options_pb2, training_pb2
from arctic_sdk.spec.proto_json import SYNONYMS, enum_to_json

from . import value_rules

_TENSOR = training_pb2.Tensor.DESCRIPTOR.full_name
_STRUCT = "google.protobuf.Struct"
_VALUE = "google.protobuf.Value"
# Messages of knobs: a server reports their unknown keys as `unsupported_option`, not bad fields.
OPTION_MESSAGES = frozenset({training_pb2.LossConfig.DESCRIPTOR.full_name})
# The field whose value selects the loss that the `(arctic.v1.field).losses` options refer to.
LOSS_SELECTOR = "processing.loss_fn"

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

    def __init__(
        self, code: str, path: str, message: str, *, whole: bool = False, **details: Any
    ) -> None:
        super().__init__(message)
        self.code, self.path, self.message, self.details = code, path, message, details
        self.whole = whole  # the message names its fields itself

    @property
    def text(self) -> str:
        """The error message: `field {path}: {message}` unless the message names its fields."""
        return self.message if self.whole else f"field {self.path}: {self.message}"


@dataclass
class Leftovers:
    """What a walk collects instead of raising: unknown fields (with the fields expected at
    their place), unknown knobs of `OPTION_MESSAGES` (when the walk keeps them apart), missing
    required fields, and fields the chosen loss does not read."""

    unknown: list[str] = field(default_factory=list)
    unsupported: list[str] = field(default_factory=list)
    expected: dict[str, list[str]] = field(default_factory=dict)  # unknown path -> siblings
    missing: list[str] = field(default_factory=list)
    unread: list[str] = field(default_factory=list)  # "path: why"
    loss_fn: str = ""


def closest(name: str, candidates: Iterable[str]) -> str | None:
    """The candidate `name` is most likely a misspelling of, if one is close enough."""
    found = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return found[0] if found else None


def check_body(
    desc: Descriptor, body: Any, *, options_apart: bool = False, synonyms: bool = False
) -> Leftovers:
    """Check `body` against the message `desc`; raise `BodyError` on the first hard problem.

    `options_apart`: unknown keys of `OPTION_MESSAGES` go to `Leftovers.unsupported` rather than
    `Leftovers.unknown`. `synonyms`: enum fields also take the deployed synonyms (PROTOCOL.md §2).
    """
    w = _Walker(options_apart=options_apart, synonyms=synonyms)
    w.message(desc, body, "")
    if w.restricted:
        w.selected = w.selected or _default_at(desc, LOSS_SELECTOR)
        w.loss_rules()
    return w.found


def _default_at(desc: Descriptor, path: str) -> str:
    """The `(arctic.v1.field).default_value` of the field at dotted `path` under `desc`."""
    fd: FieldDescriptor | None = None
    cur: Descriptor | None = desc
    for name in path.split("."):
        fd = cur.fields_by_name.get(name) if cur is not None else None
        if fd is None:
            return ""
        cur = fd.message_type
    return str(_field_opts(fd).default_value) if fd is not None else ""


def _unknown_text(found: Leftovers, paths: list[str]) -> str:
    parts = []
    for path in paths:
        parent, _, name = path.rpartition(".")
        siblings = found.expected.get(path, [])
        near = closest(name.split("[")[0], siblings)
        text = path
        if near:
            text += f" (did you mean {_join(parent, near)}?)"
        text += f"; expected there: {', '.join(siblings) or 'nothing'}"
        parts.append(text)
    return "; ".join(parts)


def _suggestions(found: Leftovers, paths: list[str]) -> dict[str, str]:
    out = {}
    for path in paths:
        parent, _, name = path.rpartition(".")
        near = closest(name, found.expected.get(path, []))
        if near:
            out[path] = _join(parent, near)
    return out


def leftover_error(desc: Descriptor, found: Leftovers) -> BodyError | None:
    """The one error of a walk's leftovers, or None: unknown fields (all named, each with the
    fields expected at its place and a "did you mean"), then unknown knobs (`unsupported_option`),
    then missing required fields, then fields the chosen loss does not read."""
    if found.unknown:
        return BodyError(
            "invalid_argument",
            found.unknown[0],
            f"unknown field(s) in {desc.name}: {_unknown_text(found, found.unknown)}",
            whole=True,
            unknown_fields=list(found.unknown),
            expected_fields={p: found.expected.get(p, []) for p in found.unknown},
            did_you_mean=_suggestions(found, found.unknown),
        )
    if found.unsupported:
        return BodyError(
            "unsupported_option",
            found.unsupported[0],
            f"unknown option(s) {_unknown_text(found, found.unsupported)}; they cannot be honoured",
            whole=True,
            options=list(found.unsupported),
            expected_fields={p: found.expected.get(p, []) for p in found.unsupported},
            did_you_mean=_suggestions(found, found.unsupported),
        )
    if found.missing:
        return BodyError("missing_field", found.missing[0], "is required")
    if found.unread:
        paths = [u.split(":", 1)[0] for u in found.unread]
        return BodyError(
            "invalid_argument",
            paths[0],
            f"field(s) not read by loss_fn {found.loss_fn!r}, refused rather than ignored: "
            + "; ".join(found.unread),
            whole=True,
            loss_fn=found.loss_fn,
            unread_fields=paths,
        )
    return None


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
        self.present: set[str] = set()  # paths of the fields set
        self.restricted: list[tuple[str, tuple[str, ...], str]] = []  # (path, losses, requires)
        self.selected = ""  # the value (or default) of LOSS_SELECTOR

    def message(self, desc: Descriptor, value: Any, path: str) -> None:
        if not isinstance(value, Mapping):
            raise BodyError(
                "invalid_argument", path or "body", f"expected an object, got {_kind(value)}"
            )
        fields = desc.fields_by_name
        apart = self.options_apart and desc.full_name in OPTION_MESSAGES
        unknown = self.found.unsupported if apart else self.found.unknown
        for key in value:
            if not isinstance(key, str) or key not in fields:
                unknown.append(_join(path, str(key)))
                self.found.expected[unknown[-1]] = [f.name for f in desc.fields]
        for fd in desc.fields:
            fpath = _join(path, fd.name)
            opts = _field_opts(fd)
            if fd.name not in value or value[fd.name] is None:
                if opts.required:
                    self.found.missing.append(fpath)
                if opts.default_value and fpath == LOSS_SELECTOR:
                    self.selected = opts.default_value
                continue
            self.present.add(fpath)
            if opts.losses or opts.requires:
                self.restricted.append((fpath, tuple(opts.losses), opts.requires))
            if fpath == LOSS_SELECTOR and isinstance(value[fd.name], str):
                self.selected = value[fd.name] or opts.default_value  # "" = unset (proto3)
            self.field(fd, value[fd.name], fpath)

    def loss_rules(self) -> None:
        """Fields present that the selected loss does not read (`(arctic.v1.field).losses`), or
        whose `requires` field is absent."""
        for path, losses, requires in self.restricted:
            if losses and self.selected not in losses:
                self.found.unread.append(f"{path}: read only by {', '.join(losses)}")
            elif requires and requires not in self.present:
                self.found.unread.append(f"{path}: read only with {requires}")
        self.found.loss_fn = self.selected

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
            plain = fd.message_type is None and fd.enum_type is None
            if plain and value_rules.repeated_scalars_fit(fd, _field_opts(fd), value):
                return  # token ids: one pass over the list, not a check per item
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
        allowed = list(_field_opts(fd).values)
        if allowed and value != "" and value not in allowed:
            near = closest(str(value), allowed)
            raise BodyError(
                "invalid_argument",
                path,
                f"{value!r} is not one of {allowed}"
                + (f" (did you mean {near!r}?)" if near else ""),
                expected=allowed,
            )
        if isinstance(value, str):
            opts = _field_opts(fd)
            if opts.pattern or opts.max_length:
                bad = value_rules.string_rule_error(opts, value)
                if bad is not None:
                    expected = opts.pattern or f"at most {opts.max_length} characters"
                    raise BodyError("invalid_argument", path, bad, expected=expected)
        elif not isinstance(value, bool | np.bool_ | bytes | bytearray | memoryview):
            wrong = value_rules.range_error(fd, value)
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
        members = desc.fields
        if len(members) == 1 and members[0].is_repeated:
            fd = members[0]
            if fd.message_type is None and isinstance(value, list | tuple):
                self.field(fd, value, desc.name)  # a scalar list: no state of the walk changes
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
