"""Templates of the SDK side: the method and error tables, body types, clients and gRPC stubs."""

# The templates hold generated lines of up to 100 columns inside quotes and indentation.
# ruff: noqa: E501

from __future__ import annotations

from arctic_model import ErrorCode, Field, Message, Method, Spec, SpecError
from arctic_render import (
    Layout,
    docstring,
    field_py,
    first_sentence,
    fits,
    import_block,
    is_tensor,
    is_union,
    method_summary,
    module,
    pb2_module,
    py_str,
    py_str_block,
    type_ref,
    value_py,
)

# ---------------------------------------------------------------------------- methods.py


def _method_const(m: Method) -> list[str]:
    def s(v: str) -> str:
        return py_str(v)

    aliases = "(" + ", ".join(s(a) for a in m.aliases) + ("," if len(m.aliases) == 1 else "") + ")"
    params = (
        "("
        + ", ".join(s(p) for p in m.path_params)
        + ("," if len(m.path_params) == 1 else "")
        + ")"
    )
    lines = [
        f"{m.const}: Final = MethodInfo(",
        f"    rpc={s(m.rpc)},",
        f"    name={s(m.name)},",
        f"    python_name={s(m.python_name)},",
        f"    service={s(m.service)},",
        f"    http_method={s(m.http_method)},",
        f"    http_path={s(m.http_path)},",
        f"    body=BodyKind.{m.body},",
        f"    role=Role.{m.role},",
        f"    idempotency=Idempotency.{m.idempotency},",
        f"    fallback=Fallback.{m.fallback},",
        f"    operation_type={s(m.operation_type)},",
    ]
    lines += [
        f"    aliases={aliases},",
        f"    request_type={s(m.request_type)},",
        f"    response_type={s(m.response_type)},",
        f"    inline_preferred={m.inline_preferred},",
        f"    protocol={m.protocol},",
        f"    concurrent={m.concurrent},",
        f"    grpc_shape=GrpcShape.{m.grpc_shape},",
        f"    job_scoped={m.job_scoped},",
        f"    path_params={params},",
    ]
    lines += py_str_block(m.doc, "    ", "doc=")
    lines.append(")")
    return lines


def render_methods(spec: Spec, layout: Layout, head: list[str]) -> str:
    files = "".join(f"\n- `{s.full_name}` (`{s.file}`)" for s in spec.services)
    doc = (
        "The method table: one `MethodInfo` per RPC of the spec's services.\n\n"
        "Everything per-op in the SDK and the servers is driven by these records, never by op-name\n"
        "literals. `BY_NAME` maps canonical op names, `BY_ALIAS` legacy aliases, `BY_RPC` RPC names\n"
        "and `BY_GRPC_PATH` gRPC method paths. Read from the `(arctic.v1.op)` options of:\n" + files
    )
    body = import_block(
        [
            "from __future__ import annotations",
            "from collections.abc import Mapping",
            "from types import MappingProxyType",
            "from typing import Final",
            f"from {layout.runtime_package}._spec import (\n"
            "    BodyKind,\n    Fallback,\n    GrpcShape,\n    Idempotency,\n    MethodInfo,\n"
            "    Role,\n)",
        ],
        layout.sdk_package,
    )
    for i, s in enumerate(spec.services):
        body += ["", f"# {s.full_name}: {first_sentence(s.doc)}".rstrip(": "), ""]
        for i, m in enumerate(s.methods):
            if i:
                body.append("")
            body += _method_const(m)
        body.append("")
    body += ["", "METHODS: Final[tuple[MethodInfo, ...]] = ("]
    body += [f"    {m.const}," for m in spec.methods]
    body += [
        ")",
        '"""Every RPC of the spec, in spec order."""',
        "",
        "BY_NAME: Final[Mapping[str, MethodInfo]] = MappingProxyType({m.name: m for m in METHODS})",
        '"""Canonical op name -> method."""',
        "",
        "BY_ALIAS: Final[Mapping[str, MethodInfo]] = MappingProxyType(",
        "    {alias: m for m in METHODS for alias in m.aliases}",
        ")",
        '"""Legacy alias -> method."""',
        "",
        "BY_RPC: Final[Mapping[str, MethodInfo]] = MappingProxyType({m.rpc: m for m in METHODS})",
        '"""RPC name (`ForwardBackward`) -> method."""',
        "",
        "BY_GRPC_PATH: Final[Mapping[str, MethodInfo]] = MappingProxyType({m.grpc_path: m for m in METHODS})",
        '"""gRPC method path (`/arctic.v1.TrainingService/ForwardBackward`) -> method."""',
    ]
    return module(head, doc, body)


# ---------------------------------------------------------------------------- error_codes.py


def _error_info(e: ErrorCode) -> list[str]:
    lines = [
        f"    ErrorCode.{e.const}: ErrorInfo(",
        f"        code=ErrorCode.{e.const},",
        f"        http_status={e.http_status},",
        f"        grpc_status={py_str(e.grpc_status)},",
        f"        user_fault={e.user_fault},",
        f"        retryable={e.retryable},",
    ]
    lines += py_str_block(e.doc, "        ", "doc=")
    lines.append("    ),")
    return lines


def render_error_codes(spec: Spec, layout: Layout, head: list[str]) -> str:
    enum = spec.error_enum
    name = enum.full_name if enum else "the error enum"
    doc = (
        f"The error table: one `ErrorCode` member and one `ErrorInfo` per value of `{name}`.\n\n"
        "A code's value is its JSON form (the enum value name without its type prefix,\n"
        'lowercased), which is what travels in `{"error": {"code": ...}}`. `ERRORS` gives each\n'
        "code's HTTP status, gRPC status, fault side and retryability."
    )
    class_doc = (enum.doc if enum and enum.doc else "Stable error codes.") + (
        "\n\nMembers are strings: the JSON form of each code."
    )
    body = import_block(
        [
            "from __future__ import annotations",
            "import enum",
            "from collections.abc import Mapping",
            "from types import MappingProxyType",
            "from typing import Final",
            f"from {layout.runtime_package}._spec import ErrorInfo",
        ],
        layout.sdk_package,
    )
    body += [
        "",
        "",
        "class ErrorCode(enum.StrEnum):",
        *docstring(class_doc, "    "),
        "",
    ]
    for e in spec.errors:
        body.append(f"    {e.const} = {py_str(e.code)}")
        body += docstring(e.doc or f"`{e.code}`.", "    ")
    body += [
        "",
        "",
        "ERRORS: Final[Mapping[str, ErrorInfo]] = MappingProxyType(",
        "    {",
    ]
    for e in spec.errors:
        body += ["    " + ln for ln in _error_info(e)]
    body += ["    }", ")", '"""Code (JSON form) -> its row of the error table."""']
    return module(head, doc, body)


# ---------------------------------------------------------------------------- types.py


def _field_doc(f: Field, spec: Spec) -> str:
    parts = [f.doc] if f.doc else []
    notes = []
    if is_tensor(f):
        rule = f.rule
        dtypes = " or ".join(rule.dtypes) if rule and rule.dtypes else "any dtype"
        shape = f"shape [{', '.join(rule.shape)}]" if rule and rule.shape else "any shape"
        notes.append(f"Tensor (a DSSST1 array): {dtypes}, {shape}.")
    if f.kind == "enum" and f.type_name in spec.enums:
        values = ", ".join(f'"{v[0]}"' for v in spec.enums[f.type_name].values)
        notes.append(f"`{f.type_name}`: {values}.")
    if f.rule is not None and f.rule.required:
        notes.append("Required.")
    if notes:
        parts.append(" ".join(notes))
    return "\n".join(parts)


def _union_alias(msg: Message, spec: Spec) -> list[str]:
    members = " | ".join(dict.fromkeys(value_py(f, spec, in_union=True) for f in msg.fields))
    lines = [f"{msg.name}: TypeAlias = {py_str(members)}"]
    doc = msg.doc or f"`{msg.full_name}`."
    doc += f"\n\nUnion message: its JSON value is the member that is set ({', '.join(f.name for f in msg.fields)})."
    return lines + docstring(doc, "")


def _typed_dict(msg: Message, spec: Spec) -> list[str]:
    doc = msg.doc or f"The `{msg.full_name}` message."
    lines = [f"class {msg.name}(TypedDict, total=False):", *docstring(doc, "    ")]
    documented = True  # the class docstring
    for i, f in enumerate(msg.fields):
        fdoc = _field_doc(f, spec)
        if i == 0 or documented or fdoc:
            lines.append("")
        lines.append(f"    {f.name}: {field_py(f, spec)}")
        if fdoc:
            lines += docstring(fdoc, "    ")
        documented = bool(fdoc)
    return lines


def _rules(spec: Spec, full: str, prefix: str, seen: frozenset[str]) -> list[tuple[str, Field]]:
    out: list[tuple[str, Field]] = []
    msg = spec.messages.get(full)
    if msg is None:
        return out
    for f in msg.fields:
        path = prefix + f.name
        if f.rule is not None:
            out.append((path, f))
        nested = spec.messages.get(f.type_name)
        if (
            f.kind == "message"
            and not f.repeated
            and not is_tensor(f)
            and nested is not None
            and not is_union(nested)
            and f.type_name not in seen
        ):
            out += _rules(spec, f.type_name, path + ".", seen | {f.type_name})
    return out


def _tuple(items: tuple[str, ...]) -> str:
    return "(" + ", ".join(py_str(i) for i in items) + ("," if len(items) == 1 else "") + ")"


def render_types(spec: Spec, layout: Layout, head: list[str]) -> str:
    doc = (
        "Typed bodies and results: one `TypedDict` (total=False) per message of the spec.\n\n"
        "Keys are the proto field names (snake_case, as on the wire). Mapping rules: tensors\n"
        "(`arctic.v1.Tensor` fields, or fields whose `(arctic.v1.field)` says `tensor`) are `Any`\n"
        "(a NumPy or torch array; each says its dtypes and shape); enums are their lowercase JSON\n"
        "names (`str`); `google.protobuf.Struct` is `dict[str, Any]`, `Value` is `Any`; repeated\n"
        "fields are lists and maps are `dict[str, ...]`. A message whose fields all belong to one\n"
        "oneof is a union alias of its members' types, and a member message holding exactly one\n"
        "repeated scalar field stands for that list (a oneof of text or token ids is\n"
        "`str | list[int]`).\n\n"
        "`TENSOR_FIELDS` and `REQUIRED_FIELDS` give, per request type, the `(arctic.v1.field)`\n"
        "constraints by dotted field path (singular nested messages are walked; a required field\n"
        "under an absent optional parent is not required)."
    )
    body = import_block(
        [
            "from __future__ import annotations",
            "from collections.abc import Mapping",
            "from dataclasses import dataclass",
            "from types import MappingProxyType",
            "from typing import Any, Final, TypeAlias, TypedDict",
        ],
        layout.sdk_package,
    )
    body += [
        "",
        "",
        "@dataclass(frozen=True)",
        "class FieldRule:",
        '    """The `(arctic.v1.field)` constraints of one body field."""',
        "",
        "    required: bool",
        "    tensor: bool",
        "    dtypes: tuple[str, ...]",
        '    """Allowed DSSST1 dtype names; empty = any."""',
        "    shape: tuple[str, ...]",
        '    """Symbolic dimensions (`("B", "S")`); empty = any shape."""',
        "",
    ]
    unions = [m for m in spec.messages.values() if is_union(m)]
    for msg in unions:
        body += ["", *_union_alias(msg, spec)]
    for msg in spec.messages.values():
        if not is_union(msg):
            body += ["", "", *_typed_dict(msg, spec)]
    request_types = list(
        dict.fromkeys(m.request_type for m in spec.methods if m.request_type in spec.messages)
    )
    body += [
        "",
        "",
        "TENSOR_FIELDS: Final[Mapping[str, Mapping[str, FieldRule]]] = MappingProxyType(",
        "    {",
    ]
    for rt in request_types:
        rules = [
            (p, f) for p, f in _rules(spec, rt, "", frozenset({rt})) if is_tensor(f) and f.rule
        ]
        if not rules:
            body.append(f"        {py_str(rt)}: MappingProxyType({{}}),")
            continue
        body += [f"        {py_str(rt)}: MappingProxyType(", "            {"]
        for path, f in rules:
            assert f.rule is not None
            body += [
                f"                {py_str(path)}: FieldRule(",
                f"                    required={f.rule.required},",
                f"                    tensor={f.rule.tensor},",
                f"                    dtypes={_tuple(f.rule.dtypes)},",
                f"                    shape={_tuple(f.rule.shape)},",
                "                ),",
            ]
        body += ["            }", "        ),"]
    body += [
        "    }",
        ")",
        '"""Request type -> dotted path -> constraints of its tensor fields."""',
        "",
        "REQUIRED_FIELDS: Final[Mapping[str, tuple[str, ...]]] = MappingProxyType(",
        "    {",
    ]
    for rt in request_types:
        paths = tuple(
            p for p, f in _rules(spec, rt, "", frozenset({rt})) if f.rule and f.rule.required
        )
        body.append(f"        {py_str(rt)}: {_tuple(paths)},")
    body += ["    }", ")", '"""Request type -> dotted paths of its required fields."""']
    return module(head, doc, body)


# ---------------------------------------------------------------------------- client.py


def _client_method(m: Method, spec: Spec, aio: bool) -> list[str]:
    req = type_ref(m.request_type, spec) if m.request_type else "Mapping[str, Any]"
    if req == "dict[str, Any]":
        req = "Mapping[str, Any]"
    res = type_ref(m.response_type, spec) if m.response_type else "bytes"
    doc = m.doc or f"The ``{m.name}`` op."
    doc += "\n\n" + "\n".join(method_summary(m))
    sig = [
        "        self,",
        f"        body: {req} | None = None,",
        "        /,",
        "        *,",
        "        options: CallOptions | None = None,",
        "        **fields: Any,",
    ]
    call = f"self._call(methods.{m.const}, body, fields, options)"
    lines = [f"    {'async ' if aio else ''}def {m.python_name}(", *sig, f"    ) -> {res}:"]
    lines += docstring(doc, "        ")
    lines += [
        f"        result = {'await ' if aio else ''}{call}",
        f"        return cast({py_str(res)}, result)",
    ]
    future = "asyncio.Future" if aio else "concurrent.futures.Future"
    sub_doc = (
        f"Submit :meth:`{m.python_name}` without waiting for it: a future of its result.\n\n"
        + first_sentence(m.doc or m.name)
    )
    lines += ["", f"    def submit_{m.python_name}(", *sig, f"    ) -> {future}[{res}]:"]
    lines += docstring(sub_doc, "        ")
    lines.append(f"        return self._submit(methods.{m.const}, body, fields, options)")
    return lines


def render_client(spec: Spec, layout: Layout, head: list[str]) -> str:
    doc = (
        "`Client` and `AsyncClient`: one documented, typed method per op of the method table.\n\n"
        "Each method merges its body mapping and keyword fields and hands them, with the op's\n"
        "`MethodInfo`, to the transport (`ClientBase._call` / `_submit`); all behaviour (routing,\n"
        "encoding, retries, idempotency, polling) lives in the hand-written transports. Every op also\n"
        "has a `submit_<op>` twin that returns a future instead of waiting."
    )
    needs_mapping = any(
        not m.request_type or m.request_type not in spec.messages for m in spec.methods
    )
    body = import_block(
        [
            "from __future__ import annotations",
            "import asyncio",
            "import concurrent.futures",
            *(["from collections.abc import Mapping"] if needs_mapping else []),
            "from typing import Any, cast",
            f"from {layout.runtime_package}._client_base import AsyncClientBase, CallOptions, ClientBase",
            f"from {layout.sdk_package} import methods, types",
        ],
        layout.sdk_package,
    )
    for aio in (False, True):
        cls = "AsyncClient" if aio else "Client"
        base = "AsyncClientBase" if aio else "ClientBase"
        ex = (
            f"{'await ' if aio else ''}client.{spec.methods[0].python_name}" if spec.methods else ""
        )
        cdoc = (
            f"{'Asynchronous' if aio else 'Synchronous'} client of the spec: one "
            f"{'coroutine ' if aio else ''}method per op.\n\n"
            "Call an op with a body mapping, keyword fields, or both (keywords win), plus optional\n"
            "`CallOptions`, e.g.\n\n"
            f"    {ex}({{...}}, options=CallOptions(timeout=30))\n\n"
            f"and `submit_<op>` for a {'asyncio' if aio else 'concurrent.futures'} future of the result."
        )
        body += ["", "", f"class {cls}({base}):", *docstring(cdoc, "    ")]
        for m in spec.methods:
            body += ["", *_client_method(m, spec, aio)]
    return module(head, doc, body)


# ---------------------------------------------------------------------------- grpc_stubs.py


def message_class(full_name: str, spec: Spec, modules: dict[str, str]) -> str:
    """`jobs_pb2.CreateJobRequest`, recording the module to import."""
    file = spec.message_files[full_name]
    pkg, mod = pb2_module(file)
    if modules.setdefault(mod, pkg) != pkg:
        raise SpecError(f"two protobuf modules named {mod} ({pkg}, {modules[mod]})")
    package = spec.file_packages[file]
    cls = full_name.removeprefix(package + ".") if package else full_name
    return f"{mod}.{cls}"


def pb2_imports(modules: dict[str, str], layout: Layout) -> list[str]:
    """One `from <package> import a_pb2, b_pb2` line per package."""
    by_pkg: dict[str, list[str]] = {}
    for mod, pkg in modules.items():
        root = pkg if pkg.startswith("google.protobuf") else f"{layout.pb2_package}.{pkg}"
        by_pkg.setdefault(root, []).append(mod)
    return [
        f"from {root} import {', '.join(sorted(mods))}" for root, mods in sorted(by_pkg.items())
    ]


def grpc_types(m: Method, spec: Spec, modules: dict[str, str]) -> tuple[str, str]:
    return message_class(m.input_type, spec, modules), message_class(m.output_type, spec, modules)


_FACTORY = {"FRAMES": "stream_stream", "UNARY_TO_FRAMES": "unary_stream", "UNARY": "unary_unary"}


def render_grpc_stubs(spec: Spec, layout: Layout, head: list[str]) -> str:
    doc = (
        "gRPC stubs of the spec's services, for the SDK's gRPC transport.\n\n"
        "`make_stubs(channel)` creates one multi-callable per RPC on a `grpc.Channel` or a\n"
        "`grpc.aio.Channel` (both offer the same factories), keyed by the method's `grpc_path`;\n"
        "`MESSAGE_TYPES` gives each RPC's request and response message classes. Importing this\n"
        "module does not import grpc."
    )
    modules: dict[str, str] = {}
    types_lines: list[str] = []
    stub_lines: list[str] = []
    for m in spec.methods:
        req, res = grpc_types(m, spec, modules)
        one = f"        methods.{m.const}.grpc_path: ({req}, {res}),"
        if fits(one):
            types_lines.append(one)
        else:
            types_lines += [
                f"        methods.{m.const}.grpc_path: (",
                f"            {req},",
                f"            {res},",
                "        ),",
            ]
        stub_lines += [
            f"        methods.{m.const}.grpc_path: channel.{_FACTORY[m.grpc_shape]}(",
            f"            methods.{m.const}.grpc_path,",
            f"            request_serializer={req}.SerializeToString,",
            f"            response_deserializer={res}.FromString,",
            "        ),",
        ]
    body = import_block(
        [
            "from __future__ import annotations",
            "from collections.abc import Mapping",
            "from types import MappingProxyType",
            "from typing import Any, Final",
            "from google.protobuf.message import Message",
            f"from {layout.sdk_package} import methods",
            *pb2_imports(modules, layout),
        ],
        layout.sdk_package,
    )
    body += [
        "",
        "MESSAGE_TYPES: Final[Mapping[str, tuple[type[Message], type[Message]]]] = MappingProxyType(",
        "    {",
        *types_lines,
        "    }",
        ")",
        '"""gRPC method path -> (request message class, response message class)."""',
        "",
        "",
        "def make_stubs(channel: Any) -> dict[str, Any]:",
        '    """One multi-callable per RPC on `channel`, keyed by the method\'s `grpc_path`."""',
        "    return {",
        *stub_lines,
        "    }",
    ]
    return module(head, doc, body)


def render_sdk_init(spec: Spec, layout: Layout, head: list[str]) -> str:
    doc = (
        "Generated from the spec by protoc-gen-arctic (`tools/codegen`); nothing here is hand-written.\n\n"
        "`methods` (the method table), `error_codes` (the error table), `types` (typed bodies and\n"
        "results), `client` (`Client`, `AsyncClient`), `grpc_stubs` (gRPC stubs), and the protobuf\n"
        "message modules under `arctic/`. Regenerate with `python tools/codegen/generate.py`."
    )
    return module(head, doc, [])


def render_pb2_init(package: str, mods: list[str], layout: Layout, head: list[str]) -> str:
    doc = f"Protobuf message modules of `{package}` (protoc and mypy-protobuf output)."
    if not mods:
        return module(head, doc, [])
    pkg = f"{layout.pb2_package}.{package}"
    body = [f"from {pkg} import (", *[f"    {m}," for m in mods], ")", ""]
    body += ["__all__ = [", *[f"    {py_str(m)}," for m in mods], "]"]
    return module(
        head, doc + "\n\nImporting the package registers every message of the spec.", body
    )
