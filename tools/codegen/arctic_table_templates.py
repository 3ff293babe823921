"""Templates of the spec tables: the method table, the error table and the error classes."""

# The templates hold generated lines of up to 100 columns inside quotes and indentation.
# ruff: noqa: E501

from __future__ import annotations

from arctic_render import (
    Layout,
    docstring,
    first_sentence,
    import_block,
    module,
    py_str,
    py_str_block,
)
from arctic_types import ErrorCode, Method, Spec

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
        f"    engine={m.engine},",
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
