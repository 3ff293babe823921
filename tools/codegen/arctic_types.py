"""The method model's types: what `arctic_model.build_spec` reads from the spec and the templates
render (methods and services, the error table, messages, fields and their rules, enums)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field


class SpecError(Exception):
    """The spec cannot be generated from; reported as the plugin's error."""


def upper_snake(camel: str) -> str:
    """`ForwardBackward` -> `FORWARD_BACKWARD`; acronyms stay whole (`HTTPPath` -> `HTTP_PATH`)."""
    s = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", camel)
    return s.upper()


def enum_suffix(enum_name: str, value_name: str) -> str:
    """`BODY_KIND_DSSST1` of `BodyKind` -> `DSSST1` (the value name without the type prefix)."""
    return value_name.removeprefix(upper_snake(enum_name) + "_")


def clean_comment(text: str) -> str:
    """A `SourceCodeInfo` comment as plain text: one leading space per line removed, trimmed."""
    lines = [ln[1:] if ln.startswith(" ") else ln for ln in text.split("\n")]
    lines = [ln.rstrip() for ln in lines]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


@dataclass(frozen=True)
class Method:
    """One RPC with its `(arctic.v1.op)` binding."""

    service: str
    rpc: str
    name: str
    python_name: str
    const: str
    http_method: str
    http_path: str
    body: str  # the spec.model.BodyKind member name: NONE, JSON, DSSST1
    role: str  # spec.model.Role member name
    idempotency: str  # spec.model.Idempotency member name
    fallback: str  # spec.model.Fallback member name
    operation_type: str
    aliases: tuple[str, ...]
    request_type: str
    response_type: str
    inline_preferred: bool
    protocol: bool
    concurrent: bool
    engine: bool
    grpc_shape: str  # spec.model.GrpcShape member name
    job_scoped: bool
    path_params: tuple[str, ...]
    doc: str
    input_type: str  # the gRPC method's own message types
    output_type: str

    @property
    def grpc_path(self) -> str:
        return f"/{self.service}/{self.rpc}"


@dataclass(frozen=True)
class Service:
    full_name: str
    name: str
    file: str
    doc: str
    methods: tuple[Method, ...]


@dataclass(frozen=True)
class ErrorCode:
    code: str  # JSON form, "shape_mismatch"
    const: str  # enum member name, "SHAPE_MISMATCH"
    number: int
    http_status: int
    grpc_status: str
    user_fault: bool
    retryable: bool
    doc: str


@dataclass(frozen=True)
class FieldRule:
    """`(arctic.v1.field)` of one field."""

    required: bool
    tensor: bool
    dtypes: tuple[str, ...]
    shape: tuple[str, ...]
    values: tuple[str, ...] = ()
    losses: tuple[str, ...] = ()
    default_value: str = ""
    requires: str = ""
    alias: str = ""
    bounds: tuple[float | None, float | None, float | None, float | None] = (None,) * 4
    expected: str = ""  # ge, gt, le, lt; the refusal's `expected` text

    @property
    def bounded(self) -> bool:
        return any(b is not None for b in self.bounds)


@dataclass(frozen=True)
class Field:
    name: str
    number: int
    kind: str  # "scalar", "enum" or "message"
    type_name: str  # scalar type ("int64") or full name of the enum / message
    repeated: bool
    map_key: str | None  # scalar type of a map's key, None when not a map
    map_value: Field | None
    oneof: str | None  # the real (non-synthetic) oneof the field belongs to
    doc: str
    rule: FieldRule | None

    @property
    def is_map(self) -> bool:
        return self.map_value is not None


@dataclass(frozen=True)
class Message:
    full_name: str
    name: str  # Python name: nested messages are joined, `OuterInner`
    file: str
    doc: str
    fields: tuple[Field, ...]
    oneofs: tuple[str, ...]  # real oneofs


@dataclass(frozen=True)
class Enum:
    full_name: str
    name: str
    doc: str
    values: tuple[tuple[str, int, str], ...]  # (JSON name, number, doc), number 0 excluded


@dataclass
class Spec:
    """Everything read from one CodeGeneratorRequest."""

    files: tuple[str, ...]  # files to generate, sorted
    services: list[Service] = field(default_factory=list)
    errors: list[ErrorCode] = field(default_factory=list)
    error_enum: Enum | None = None
    messages: dict[str, Message] = field(default_factory=dict)  # generated files only
    enums: dict[str, Enum] = field(default_factory=dict)
    message_files: dict[str, str] = field(default_factory=dict)  # every message -> its file
    file_packages: dict[str, str] = field(default_factory=dict)  # every file -> its package

    @property
    def methods(self) -> list[Method]:
        return [m for s in self.services for m in s.methods]
