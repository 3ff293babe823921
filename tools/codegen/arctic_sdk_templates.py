"""Templates of the SDK side: the method and error tables, body types, clients and gRPC stubs."""

# The templates hold generated lines of up to 100 columns inside quotes and indentation.
# ruff: noqa: E501

from __future__ import annotations

from arctic_render import (
    Layout,
    docstring,
    field_py,
    first_sentence,
    fits,
    import_block,
    is_tensor,
    is_union,
    literal_py,
    method_summary,
    module,
    pb2_module,
    py_str,
    py_str_block,
    scalar_py,
    type_ref,
    value_py,
)
from arctic_types import ErrorCode, Field, Message, Method, Spec, SpecError

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
            f"from {layout.model_module} import (\n"
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
            f"from {layout.model_module} import ErrorInfo",
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


# ---------------------------------------------------------------------------- error_classes.py

# The hand-written categories of `{runtime_package}._error_base` a code's class derives from.
_CATEGORY_BY_STATUS = {
    401: "AuthenticationError",
    403: "AuthenticationError",
    404: "NotFoundError",
    405: "NotFoundError",
    409: "ConflictError",
    413: "PayloadTooLargeError",
    429: "RateLimitError",
    500: "InternalServerError",
    501: "UnimplementedError",
    503: "ServiceUnavailableError",
    504: "ServerTimeoutError",
}


def error_class_name(e: ErrorCode) -> str:
    """`shape_mismatch` -> `ShapeMismatchError`."""
    return "".join(part.capitalize() for part in e.code.split("_")) + "Error"


def error_parent(e: ErrorCode) -> str:
    """The category a code's class derives from: every gRPC INVALID_ARGUMENT code is an
    `InvalidArgumentError`; otherwise by HTTP status (chunk-group conflicts are
    `ChunkGroupError`s; a retryable 5xx without a category is a `TransientError`)."""
    if e.grpc_status == "INVALID_ARGUMENT":
        return "InvalidArgumentError"
    if e.http_status == 409 and e.code.startswith("chunk_group_"):
        return "ChunkGroupError"
    if e.http_status == 500 and e.retryable:
        return "TransientError"
    if e.http_status in _CATEGORY_BY_STATUS:
        return _CATEGORY_BY_STATUS[e.http_status]
    if 400 <= e.http_status < 500:
        return "UserError"
    if e.http_status >= 500:
        return "TransientError" if e.retryable else "ServerError"
    return "ArcticError"


def render_error_classes(spec: Spec, layout: Layout, head: list[str]) -> str:
    doc = (
        "One exception class per stable error code: the class a code raises, whether the SDK\n"
        "refused a call before sending it or a server (over HTTP or gRPC) refused or failed it.\n\n"
        "Each derives from a hand-written category of `_error_base` (`error_parent`: every gRPC\n"
        "INVALID_ARGUMENT code is an `InvalidArgumentError`, the others by HTTP status); a code\n"
        "whose class name is its category's (`invalid_argument`, `not_found`, `unimplemented`)\n"
        "raises the category itself. `ERROR_CLASSES` maps every code to its class."
    )
    plan = [(e, error_class_name(e), error_parent(e)) for e in spec.errors]
    bases = sorted({p for _, _, p in plan} | {n for _, n, p in plan if n == p} | {"ArcticError"})
    body = import_block(
        [
            "from __future__ import annotations",
            "from collections.abc import Mapping",
            "from types import MappingProxyType",
            "from typing import Final",
            f"from {layout.runtime_package}._error_base import (\n"
            + "".join(f"    {b},\n" for b in bases)
            + ")",
            f"from {layout.spec_package}.error_codes import ErrorCode",
        ],
        layout.sdk_package,
    )
    names = [n for _, n, p in plan if n != p]
    body += [
        "",
        "__all__ = [",
        *[f"    {py_str(n)}," for n in sorted([*names, "ERROR_CLASSES"])],
        "]",
    ]
    for e, name, parent in plan:
        if name == parent:
            continue
        body += ["", "", f"class {name}({parent}):"]
        body += docstring(f"`{e.code}`: {e.doc}" if e.doc else f"`{e.code}`.", "    ")
        body += ["", f"    default_code = ErrorCode.{e.const}"]
    body += [
        "",
        "",
        "ERROR_CLASSES: Final[Mapping[str, type[ArcticError]]] = MappingProxyType(",
        "    {",
        *[f"        ErrorCode.{e.const}: {name}," for e, name, _ in plan],
        "    }",
        ")",
        '"""Code (JSON form) -> the exception class it raises."""',
    ]
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
    rule = f.rule
    if rule is not None and rule.values and not rule.alias:
        notes.append("One of " + ", ".join(f'"{v}"' for v in rule.values) + ".")
    if rule is not None and rule.default_value:
        notes.append(f"Default: {rule.default_value}.")
    if rule is not None and rule.losses:
        notes.append("Read only by loss_fn " + ", ".join(rule.losses) + ".")
    if rule is not None and rule.requires:
        notes.append(f"Read only with `{rule.requires}`.")
    if rule is not None and rule.required:
        notes.append("Required.")
    if notes:
        parts.append(" ".join(notes))
    return "\n".join(parts)


def literal_aliases(spec: Spec) -> dict[str, tuple[tuple[str, ...], str]]:
    """Named `Literal` types of string fields with `values`: alias -> (values, doc)."""
    out: dict[str, tuple[tuple[str, ...], str]] = {}
    for msg in spec.messages.values():
        for f in msg.fields:
            rule = f.rule
            if rule is None or not rule.alias or not rule.values:
                continue
            old = out.get(rule.alias)
            if old is not None and old[0] != rule.values:
                raise SpecError(f"alias {rule.alias!r} names two different sets of values")
            doc = f"The values of `{msg.full_name}.{f.name}`" + (
                f" (default {rule.default_value!r})." if rule.default_value else "."
            )
            out.setdefault(rule.alias, (rule.values, doc))
    clash = set(out) & {m.name for m in spec.messages.values()}
    if clash:
        raise SpecError(f"alias names clash with message names: {sorted(clash)}")
    return out


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
        "`str | list[int]`). A string field whose `(arctic.v1.field)` lists its `values` is a\n"
        "`Literal` of them, named by its `alias` (`LossFn`).\n\n"
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
            "from typing import Any, Final, "
            + ("Literal, " if literal_aliases(spec) else "")
            + "TypeAlias, TypedDict",
        ],
        layout.sdk_package,
    )
    public = [
        "FieldRule",
        *literal_aliases(spec),
        *(m.name for m in spec.messages.values()),
        "REQUIRED_FIELDS",
        "TENSOR_FIELDS",
    ]
    body += ["", "__all__ = [", *[f"    {py_str(n)}," for n in sorted(public)], "]"]
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
    aliases = literal_aliases(spec)
    for name, (values, alias_doc) in aliases.items():
        body += ["", f"{name}: TypeAlias = {literal_py(values)}", *docstring(alias_doc, "")]
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


def _param_value(f: Field, spec: Spec) -> str:
    """The Python type of one value of a request field as a client keyword argument."""
    rule = f.rule
    if f.kind == "scalar" and rule is not None and rule.values and f.type_name == "string":
        return f"types.{rule.alias}" if rule.alias else literal_py(rule.values)
    if f.kind == "scalar":
        return scalar_py(f.type_name)
    if f.kind == "enum" or is_tensor(f):
        return "str" if f.kind == "enum" else "Any"
    if f.type_name == "google.protobuf.Struct":
        return "Mapping[str, Any]"
    if f.type_name.startswith("google.protobuf."):
        return "Any"
    msg = spec.messages.get(f.type_name)
    if msg is None:
        return "Mapping[str, Any]"
    return f"types.{msg.name}"


def _param_type(f: Field, spec: Spec) -> str:
    if f.map_value is not None:
        return f"Mapping[str, {_param_value(f.map_value, spec)}]"
    if f.repeated:
        return f"Sequence[{_param_value(f, spec)}]"
    return _param_value(f, spec)


_JOB_DOC = "The job (default: the client's `job_id`)."
_OPTIONS_DOC = (
    "Per-call overrides (`CallOptions`: timeout, retries, idempotency key, job, sub-job)."
)


def client_params(m: Method, spec: Spec) -> list[tuple[str, str, str]]:
    """(name, type, doc) of an op's keyword arguments: its request fields, then any path
    parameter the request message does not hold (`job_id` of data-plane ops)."""
    msg = spec.messages.get(m.request_type)
    out = [(f.name, _param_type(f, spec), _field_doc(f, spec)) for f in (msg.fields if msg else ())]
    names = {n for n, _, _ in out}
    for p in m.path_params:
        if p not in names:
            out.append((p, "str", _JOB_DOC if p == "job_id" else f"Path parameter `{p}`."))
    return out


def _args_doc(params: list[tuple[str, str, str]]) -> list[str]:
    """A Google-style `Args:` section (continuation lines indented under their name)."""
    lines = ["Args:"]
    for name, _, doc in [*params, ("options", "", _OPTIONS_DOC)]:
        text = " ".join(doc.split()) if doc else "(undocumented in the spec)"
        words, cur = text.split(" "), f"    {name}:"
        for w in words:
            if len(cur) + 1 + len(w) > 88 and cur.strip() != f"{name}:":
                lines.append(cur)
                cur = "        " + w
            else:
                cur += " " + w
        lines.append(cur)
    return lines


def _client_method(m: Method, spec: Spec, aio: bool) -> list[str]:
    req = type_ref(m.request_type, spec) if m.request_type else "Mapping[str, Any]"
    if req == "dict[str, Any]":
        req = "Mapping[str, Any]"
    res = type_ref(m.response_type, spec) if m.response_type else "bytes"
    params = client_params(m, spec)
    doc = m.doc or f"The ``{m.name}`` op."
    doc += "\n\n" + "\n".join(_args_doc(params))
    doc += "\n\n" + "\n".join(method_summary(m))
    sig = [
        "        self,",
        f"        body: {req} | None = None,",
        "        /,",
        "        *,",
        *[f"        {name}: {typ} | None = None," for name, typ, _ in params],
        "        options: CallOptions | None = None,",
        "        **unknown: Never,",
    ]
    fields = "{" + ", ".join(f"{py_str(n)}: {n}" for n, _, _ in params) + "}"
    call_args = f"methods.{m.const}, body, {fields}, options, unknown"
    call = f"self._call({call_args})"
    if not fits(f"        result = {'await ' if aio else ''}{call}"):
        call = (
            "self._call(\n            "
            + ",\n            ".join([f"methods.{m.const}", "body", fields, "options", "unknown"])
            + ",\n        )"
        )
        if not all(fits(ln) for ln in call.split("\n")):
            inner = ["            {"] + [f"                {py_str(n)}: {n}," for n, _, _ in params]
            inner += ["            },"]
            call = "\n".join(
                [
                    "self._call(",
                    f"            methods.{m.const},",
                    "            body,",
                    *inner,
                    "            options,",
                    "            unknown,",
                    "        )",
                ]
            )
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
        + f"\n\nTakes the arguments of :meth:`{m.python_name}`."
    )
    submit = call.replace("self._call(", "self._submit(")
    lines += ["", f"    def submit_{m.python_name}(", *sig, f"    ) -> {future}[{res}]:"]
    lines += docstring(sub_doc, "        ")
    lines.append(f"        return {submit}")
    return lines


def render_client(spec: Spec, layout: Layout, head: list[str]) -> str:
    doc = (
        "`Client` and `AsyncClient`: one documented, typed method per op of the method table.\n\n"
        "Each method merges its body mapping and keyword fields and hands them, with the op's\n"
        "`MethodInfo`, to the transport (`ClientBase._call` / `_submit`); all behaviour (routing,\n"
        "encoding, retries, idempotency, polling) lives in the hand-written transports. Every op also\n"
        "has a `submit_<op>` twin that returns a future instead of waiting."
    )
    uses = "\n".join(
        "\n".join(_client_method(m, spec, aio)) for m in spec.methods for aio in (False, True)
    )
    abc = [n for n in ("Mapping", "Sequence") if f"{n}[" in uses]
    typing = [n for n in ("Any", "Literal") if f"{n}[" in uses or n == "Any"]
    body = import_block(
        [
            "from __future__ import annotations",
            "import asyncio",
            "import concurrent.futures",
            *([f"from collections.abc import {', '.join(abc)}"] if abc else []),
            f"from typing import {', '.join(typing)}, Never, cast",
            f"from {layout.runtime_package}._client_base import AsyncClientBase, CallOptions, ClientBase",
            *(
                [f"from {layout.sdk_package} import methods, types"]
                if layout.spec_package == layout.sdk_package
                else [
                    f"from {layout.spec_package} import methods",
                    f"from {layout.sdk_package} import types",
                ]
            ),
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
            "Call an op with its request fields as keyword arguments (each documented under\n"
            "`Args`), a body mapping, or both (keywords win; `None` = unset), plus optional\n"
            "`CallOptions`, e.g.\n\n"
            f"    {ex}({{...}}, options=CallOptions(timeout=30))\n\n"
            f"and `submit_<op>` for a {'asyncio' if aio else 'concurrent.futures'} future of the result.\n"
            "An unknown keyword is refused with `InvalidArgumentError` naming it (and the\n"
            "closest known one); type checkers flag it too (`**unknown: Never`)."
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
            f"from {layout.spec_package} import methods",
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
        "The SDK's generated half: `types` (typed bodies and results), `error_classes` (one\n"
        "exception class per code), `client` (`Client`, `AsyncClient`) and `grpc_stubs` (gRPC\n"
        "stubs). The spec's own tables and protobuf modules are public: `arctic_sdk.spec`.\n"
        "Regenerate with `python tools/codegen/generate.py`."
    )
    return module(head, doc, [])


def render_tables_init(spec: Spec, layout: Layout, head: list[str]) -> str:
    doc = (
        "The spec's tables, generated by protoc-gen-arctic (`tools/codegen`) from `proto/`.\n\n"
        "`methods` (the method table: one `MethodInfo` per RPC) and `error_codes` (the error table:\n"
        "`ErrorCode`, `ERRORS`). Part of the public spec model (`arctic_sdk.spec`), which the SDK,\n"
        "the servers and the conformance runner all read. Regenerate with\n"
        "`python tools/codegen/generate.py`."
    )
    return module(head, doc, [])


def render_pb2_root_init(spec: Spec, layout: Layout, head: list[str]) -> str:
    doc = (
        "The spec's protobuf message modules (protoc and mypy-protobuf output, imports moved under\n"
        f"`{layout.pb2_package}`), e.g. `{layout.pb2_package}.arctic.v1.training_pb2`."
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
