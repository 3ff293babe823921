"""The method model of protoc-gen-arctic: everything the templates need, read from one request.

`build_spec(request)` walks the `CodeGeneratorRequest` once: the services and their
`(arctic.v1.op)` options (the method table), the enum whose values carry `(arctic.v1.error)`
(the error table), and every message with its fields and `(arctic.v1.field)` options. Comments
come from each file's `SourceCodeInfo`, so the generated docstrings are the proto comments.

The options are decoded with a descriptor pool built from the request itself (no compiled
`options_pb2` is imported), so the generator also works on a changed or a toy copy of the spec.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Iterable, Mapping
from typing import Any

from arctic_types import (
    Enum,
    ErrorCode,
    Field,
    FieldRule,
    Message,
    Method,
    Service,
    Spec,
    SpecError,
    clean_comment,
    enum_suffix,
    upper_snake,
)
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.compiler import plugin_pb2

OP_EXTENSION = "arctic.v1.op"
ERROR_EXTENSION = "arctic.v1.error"
FIELD_EXTENSION = "arctic.v1.field"
TENSOR_MESSAGE = "arctic.v1.Tensor"

# SourceCodeInfo path components (descriptor.proto field numbers).
_FILE_MESSAGE, _FILE_ENUM, _FILE_SERVICE = 4, 5, 6
_MESSAGE_FIELD, _MESSAGE_NESTED, _MESSAGE_ENUM = 2, 3, 4
_SERVICE_METHOD = 2
_ENUM_VALUE = 2

FDP = descriptor_pb2.FieldDescriptorProto
_SCALARS = {
    FDP.TYPE_DOUBLE: ("double", "float"),
    FDP.TYPE_FLOAT: ("float", "float"),
    FDP.TYPE_INT64: ("int64", "int"),
    FDP.TYPE_UINT64: ("uint64", "int"),
    FDP.TYPE_INT32: ("int32", "int"),
    FDP.TYPE_FIXED64: ("fixed64", "int"),
    FDP.TYPE_FIXED32: ("fixed32", "int"),
    FDP.TYPE_BOOL: ("bool", "bool"),
    FDP.TYPE_STRING: ("string", "str"),
    FDP.TYPE_BYTES: ("bytes", "bytes"),
    FDP.TYPE_UINT32: ("uint32", "int"),
    FDP.TYPE_SFIXED32: ("sfixed32", "int"),
    FDP.TYPE_SFIXED64: ("sfixed64", "int"),
    FDP.TYPE_SINT32: ("sint32", "int"),
    FDP.TYPE_SINT64: ("sint64", "int"),
}


class _Options:
    """Decodes custom options with a pool built from the request's own descriptors."""

    def __init__(self, files: Iterable[descriptor_pb2.FileDescriptorProto]) -> None:
        self.pool = descriptor_pool.DescriptorPool()
        names = []
        for f in files:
            self.pool.Add(f)
            names.append(f.name)
        self._classes = message_factory.GetMessageClassesForFiles(names, self.pool)

    def get(self, options: Any, options_type: str, extension: str) -> Any | None:
        """The extension's value on an options message, or None when unset or unknown."""
        try:
            ext = self.pool.FindExtensionByName(extension)
        except KeyError:
            return None
        cls = self._classes[f"google.protobuf.{options_type}"]
        parsed = cls.FromString(options.SerializeToString())
        if not parsed.HasExtension(ext):
            return None
        return parsed.Extensions[ext]

    def enum_value_name(self, enum_full_name: str, number: int) -> str:
        return str(self.pool.FindEnumTypeByName(enum_full_name).values_by_number[number].name)


def _comments(f: descriptor_pb2.FileDescriptorProto) -> dict[tuple[int, ...], str]:
    out: dict[tuple[int, ...], str] = {}
    for loc in f.source_code_info.location:
        text = loc.leading_comments or loc.trailing_comments
        if text:
            out[tuple(loc.path)] = clean_comment(text)
    return out


def _snake(camel: str) -> str:
    return upper_snake(camel).lower()


def _shape(value: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in value.split(",") if s.strip())


def _option_member(opts: _Options, enum: str, number: int, rpc: str, what: str) -> str:
    try:
        name = opts.enum_value_name(enum, number)
    except KeyError as exc:
        raise SpecError(f"{rpc}: {what} has the unknown value {number}") from exc
    member = enum_suffix(enum.rsplit(".", 1)[-1], name)
    if member == "UNSPECIFIED":
        raise SpecError(f"{rpc}: (arctic.v1.op).{what} is unspecified")
    return member


def _method(
    opts: _Options,
    service: descriptor_pb2.ServiceDescriptorProto,
    service_full: str,
    m: descriptor_pb2.MethodDescriptorProto,
    doc: str,
) -> Method:
    rpc = f"{service_full}.{m.name}"
    op = opts.get(m.options, "MethodOptions", OP_EXTENSION)
    if op is None:
        raise SpecError(f"{rpc}: no (arctic.v1.op) option")
    if not op.name or not op.http_method or not op.http_path.startswith("/"):
        raise SpecError(f"{rpc}: (arctic.v1.op) needs name, http_method and an http_path")
    if m.client_streaming and m.server_streaming:
        shape = "FRAMES"
    elif m.server_streaming and not m.client_streaming:
        shape = "UNARY_TO_FRAMES"
    elif not m.client_streaming and not m.server_streaming:
        shape = "UNARY"
    else:
        raise SpecError(f"{rpc}: client-streaming-only RPCs have no binding")
    input_type = m.input_type.lstrip(".")
    output_type = m.output_type.lstrip(".")
    request_type = op.request_type or ("" if shape == "FRAMES" else input_type)
    response_type = op.response_type or (output_type if shape == "UNARY" else "")
    if op.engine and (op.protocol or not response_type or not op.http_path.startswith("/{job_id}")):
        raise SpecError(
            f"{rpc}: an `engine` op runs on a job's sub-job and answers a message: it needs a "
            "/{job_id} route and a result type, and cannot be a `protocol` op"
        )
    enum = "arctic.v1."
    return Method(
        service=service_full,
        rpc=m.name,
        name=op.name,
        python_name=_snake(m.name),
        const=upper_snake(m.name),
        http_method=op.http_method,
        http_path=op.http_path,
        body=_option_member(opts, enum + "BodyKind", op.body, rpc, "body"),
        role=_option_member(opts, enum + "Role", op.role, rpc, "role"),
        idempotency=_option_member(
            opts, enum + "IdempotencyClass", op.idempotency, rpc, "idempotency"
        ),
        fallback=_option_member(opts, enum + "Fallback", op.fallback, rpc, "fallback"),
        operation_type=op.operation_type,
        aliases=tuple(op.aliases),
        request_type=request_type,
        response_type=response_type,
        inline_preferred=op.inline_preferred,
        protocol=op.protocol,
        concurrent=op.concurrent,
        engine=op.engine,
        grpc_shape=shape,
        job_scoped=op.http_path.startswith("/{job_id}"),
        path_params=tuple(re.findall(r"{(\w+)}", op.http_path)),
        doc=doc,
        input_type=input_type,
        output_type=output_type,
    )


def _bounds(rule: Any) -> tuple[float | None, float | None, float | None, float | None]:
    """`(arctic.v1.field)` ge, gt, le, lt (None when unset; a spec without them: all None)."""
    names = ("ge", "gt", "le", "lt")
    known = {f.name for f in rule.DESCRIPTOR.fields}
    ge, gt, le, lt = (
        float(getattr(rule, n)) if n in known and rule.HasField(n) else None for n in names
    )
    return ge, gt, le, lt


def _field(
    opts: _Options,
    f: descriptor_pb2.FieldDescriptorProto,
    msg: descriptor_pb2.DescriptorProto,
    map_entries: Mapping[str, descriptor_pb2.DescriptorProto],
    doc: str,
) -> Field:
    rule_msg = opts.get(f.options, "FieldOptions", FIELD_EXTENSION)
    rule = None
    if rule_msg is not None:
        rule = FieldRule(
            required=rule_msg.required,
            tensor=rule_msg.tensor,
            dtypes=tuple(rule_msg.dtypes),
            shape=_shape(rule_msg.shape),
            values=tuple(getattr(rule_msg, "values", ())),
            losses=tuple(getattr(rule_msg, "losses", ())),
            default_value=str(getattr(rule_msg, "default_value", "")),
            requires=str(getattr(rule_msg, "requires", "")),
            alias=str(getattr(rule_msg, "alias", "")),
            bounds=_bounds(rule_msg),
            expected=str(getattr(rule_msg, "expected", "")),
        )
    oneof = None
    if f.HasField("oneof_index") and not f.proto3_optional:
        oneof = msg.oneof_decl[f.oneof_index].name
    repeated = f.label == FDP.LABEL_REPEATED
    type_name = f.type_name.lstrip(".")
    if f.type in _SCALARS:
        kind, type_name = "scalar", _SCALARS[f.type][0]
    elif f.type == FDP.TYPE_ENUM:
        kind = "enum"
    elif f.type in (FDP.TYPE_MESSAGE, FDP.TYPE_GROUP):
        kind = "message"
    else:
        raise SpecError(f"{msg.name}.{f.name}: unsupported field type {f.type}")
    map_key, map_value = None, None
    if kind == "message" and repeated and type_name in map_entries:
        entry = map_entries[type_name]
        key_fd, value_fd = entry.field[0], entry.field[1]
        map_key = _SCALARS[key_fd.type][0]
        map_value = _field(opts, value_fd, entry, {}, "")
    return Field(
        name=f.name,
        number=f.number,
        kind=kind,
        type_name=type_name,
        repeated=repeated,
        map_key=map_key,
        map_value=map_value,
        oneof=oneof,
        doc=doc,
        rule=rule,
    )


def _walk_messages(
    opts: _Options,
    spec: Spec,
    f: descriptor_pb2.FileDescriptorProto,
    comments: Mapping[tuple[int, ...], str],
    generate: bool,
) -> None:
    prefix = f".{f.package}" if f.package else ""
    spec.file_packages[f.name] = f.package

    def visit_enum(
        e: descriptor_pb2.EnumDescriptorProto, full: str, py: str, path: tuple[int, ...]
    ) -> None:
        values = tuple(
            (
                enum_suffix(e.name, v.name).lower(),
                v.number,
                comments.get((*path, _ENUM_VALUE, i), ""),
            )
            for i, v in enumerate(e.value)
            if v.number != 0
        )
        if generate:
            spec.enums[full] = Enum(full, py, comments.get(path, ""), values)

    def visit(
        msg: descriptor_pb2.DescriptorProto, parent: str, py_parent: str, path: tuple[int, ...]
    ) -> None:
        full = f"{parent}.{msg.name}"
        py = py_parent + msg.name
        spec.message_files[full.lstrip(".")] = f.name
        entries = {
            f"{full}.{n.name}".lstrip("."): n for n in msg.nested_type if n.options.map_entry
        }
        for i, nested in enumerate(msg.nested_type):
            if not nested.options.map_entry:
                visit(nested, full, py, (*path, _MESSAGE_NESTED, i))
        for i, e in enumerate(msg.enum_type):
            visit_enum(e, f"{full}.{e.name}".lstrip("."), py + e.name, (*path, _MESSAGE_ENUM, i))
        if not generate:
            return
        fields = tuple(
            _field(opts, fd, msg, entries, comments.get((*path, _MESSAGE_FIELD, i), ""))
            for i, fd in enumerate(msg.field)
        )
        real_oneofs = {
            fd.oneof_index
            for fd in msg.field
            if fd.HasField("oneof_index") and not fd.proto3_optional
        }
        spec.messages[full.lstrip(".")] = Message(
            full_name=full.lstrip("."),
            name=py,
            file=f.name,
            doc=comments.get(path, ""),
            fields=fields,
            oneofs=tuple(msg.oneof_decl[i].name for i in sorted(real_oneofs)),
        )

    for i, msg in enumerate(f.message_type):
        visit(msg, prefix, "", (_FILE_MESSAGE, i))
    for i, e in enumerate(f.enum_type):
        visit_enum(e, f"{f.package}.{e.name}".lstrip("."), e.name, (_FILE_ENUM, i))


def _errors(
    opts: _Options,
    spec: Spec,
    f: descriptor_pb2.FileDescriptorProto,
    comments: Mapping[tuple[int, ...], str],
) -> None:
    for ei, e in enumerate(f.enum_type):
        bound = [opts.get(v.options, "EnumValueOptions", ERROR_EXTENSION) for v in e.value]
        if all(o is None for o in bound):
            continue
        if spec.errors:
            raise SpecError(f"{e.name}: a second enum with (arctic.v1.error) values")
        for vi, (v, o) in enumerate(zip(e.value, bound, strict=True)):
            if o is None:
                if v.number != 0:
                    raise SpecError(f"{e.name}.{v.name}: no (arctic.v1.error) option")
                continue
            if not o.http_status or not o.grpc_status:
                raise SpecError(f"{e.name}.{v.name}: (arctic.v1.error) needs both statuses")
            suffix = enum_suffix(e.name, v.name)
            spec.errors.append(
                ErrorCode(
                    code=suffix.lower(),
                    const=suffix,
                    number=v.number,
                    http_status=o.http_status,
                    grpc_status=o.grpc_status,
                    user_fault=o.user_fault,
                    retryable=o.retryable,
                    doc=comments.get((_FILE_ENUM, ei, _ENUM_VALUE, vi), ""),
                )
            )
        full = f"{f.package}.{e.name}".lstrip(".")
        spec.error_enum = Enum(full, e.name, comments.get((_FILE_ENUM, ei), ""), ())


def build_spec(request: plugin_pb2.CodeGeneratorRequest) -> Spec:
    """The method model, error table and message model of the files to generate."""
    opts = _Options(request.proto_file)
    to_generate = set(request.file_to_generate)
    spec = Spec(files=tuple(sorted(to_generate)))
    by_name = {f.name: f for f in request.proto_file}
    for name in sorted(by_name):
        f = by_name[name]
        generate = name in to_generate
        comments = _comments(f) if generate else {}
        # Files that extend descriptor options hold the generator's own option messages.
        _walk_messages(opts, spec, f, comments, generate and not f.extension)
        if not generate:
            continue
        _errors(opts, spec, f, comments)
        for si, s in enumerate(f.service):
            full = f"{f.package}.{s.name}".lstrip(".")
            methods = tuple(
                _method(
                    opts, s, full, m, comments.get((_FILE_SERVICE, si, _SERVICE_METHOD, mi), "")
                )
                for mi, m in enumerate(s.method)
            )
            spec.services.append(
                Service(full, s.name, f.name, comments.get((_FILE_SERVICE, si), ""), methods)
            )
    _check(spec)
    return spec


_RESERVED_CONSTS = {"METHODS", "BY_NAME", "BY_ALIAS", "BY_RPC", "BY_GRPC_PATH"}
_RESERVED_ATTRS = {"close", "submit"}
_TYPING_NAMES = {"Any", "TypeAlias", "TypedDict", "FieldRule", "Final", "Mapping", "dataclass"}


def _check(spec: Spec) -> None:
    seen: dict[str, str] = {}
    for m in spec.methods:
        for label in (m.name, *m.aliases):
            if label in seen:
                raise SpecError(f"op name or alias {label!r} used by {seen[label]} and {m.rpc}")
            seen[label] = m.rpc
        if m.const in _RESERVED_CONSTS or m.python_name in _RESERVED_ATTRS:
            raise SpecError(f"{m.rpc}: its Python name {m.python_name!r} is reserved")
        if keyword.iskeyword(m.python_name):
            raise SpecError(f"{m.rpc}: its Python name {m.python_name!r} is a keyword")
    rpcs = [m.rpc for m in spec.methods]
    if len(rpcs) != len(set(rpcs)):
        raise SpecError("RPC names must be unique across services")
    names = [msg.name for msg in spec.messages.values()]
    clash = {n for n in names if names.count(n) > 1} | (set(names) & _TYPING_NAMES)
    if clash:
        raise SpecError(f"message names clash in the generated types module: {sorted(clash)}")
