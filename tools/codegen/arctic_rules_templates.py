"""Template of the request-rule table (`arctic_sdk.spec.tables.request_rules`).

Each number field whose `(arctic.v1.field)` carries bounds (`ge`, `gt`, `le`, `lt`) becomes one
`Bound` row per message that reaches it through singular message fields, at its dotted path from
that message; `BY_OP` gives each op's rows (its `request_type`'s). Servers check these once, in the
protocol layer, so no server keeps a hand-written copy of a field's range.
"""

# ruff: noqa: E501

from __future__ import annotations

from arctic_render import Layout, import_block, module, py_str
from arctic_types import Field, Message, Spec


def _num(x: float) -> str:
    return repr(float(x))


def _row(path: str, f: Field) -> str:
    assert f.rule is not None
    args = [py_str(path)]
    for name, value in zip(("ge", "gt", "le", "lt"), f.rule.bounds, strict=True):
        if value is not None:
            args.append(f"{name}={_num(value)}")
    if f.rule.expected:
        args.append(f"expected={py_str(f.rule.expected)}")
    return f"Bound({', '.join(args)})"


def bound_rows(
    spec: Spec, msg: Message, prefix: str = "", seen: frozenset[str] = frozenset()
) -> list[str]:
    """The `Bound(...)` rows of `msg`'s fields and of its singular message fields' (cycles cut)."""
    rows: list[str] = []
    for f in msg.fields:
        path = prefix + f.name
        if f.rule is not None and f.rule.bounded and f.kind == "scalar" and not f.repeated:
            rows.append(_row(path, f))
        elif (
            f.kind == "message"
            and not f.repeated
            and f.type_name in spec.messages
            and f.type_name not in seen | {msg.full_name}  # a recursive message: cut
        ):
            inner = spec.messages[f.type_name]
            rows += bound_rows(spec, inner, path + ".", seen | {msg.full_name})
    return rows


def render_request_rules(spec: Spec, layout: Layout, head: list[str]) -> str:
    doc = (
        "The request-rule table: each number field's `(arctic.v1.field)` bounds, per message and per op.\n\n"
        "`BOUNDS` maps a message's full name to the `Bound` rows of the fields it reaches (dotted\n"
        "paths from the message), `BY_OP` an op's name to its request body's rows. The protocol\n"
        "layer of every server checks a body against `BY_OP` before the call is accepted\n"
        "(`arctic_sdk.spec.value_rules.bound_error`)."
    )
    body = import_block(
        [
            "from __future__ import annotations",
            "from collections.abc import Mapping",
            "from types import MappingProxyType",
            "from typing import Final",
            f"from {layout.model_module} import Bound",
        ],
        layout.sdk_package,
    )
    tables: dict[str, list[str]] = {}
    for name in sorted(spec.messages):
        rows = bound_rows(spec, spec.messages[name])
        if rows:
            tables[name] = rows
    body += ["", "BOUNDS: Final[Mapping[str, tuple[Bound, ...]]] = MappingProxyType(", "    {"]
    for name, rows in tables.items():
        body += [f"        {py_str(name)}: (", *[f"            {r}," for r in rows], "        ),"]
    body += ["    }", ")", '"""Message full name -> its fields\' bounds."""', ""]
    ops = [m for m in spec.methods if m.request_type in tables]
    body += ["BY_OP: Final[Mapping[str, tuple[Bound, ...]]] = MappingProxyType(", "    {"]
    body += [f"        {py_str(m.name)}: BOUNDS[{py_str(m.request_type)}]," for m in ops]
    body += [
        "    }",
        ")",
        '"""Op name -> its request body\'s bounds (ops without any are absent)."""',
    ]
    return module(head, doc, body)
