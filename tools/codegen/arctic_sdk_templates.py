"""Templates of the SDK side: the typed bodies (`types.py`) and the clients (`client.py`)."""

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
    py_str,
    scalar_py,
    type_ref,
    value_py,
)
from arctic_types import Field, Message, Method, Spec, SpecError

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
