"""The fake engine's constrained decoding (NUMERICS.md §5.1): a value of the constraint's
language written from the sample's draws, so the answer is valid, deterministic and honest about
what the fake is (it runs no grammar over logits; it writes an instance).

Every choice takes the next draw `z` of the sample's SplitMix64 stream: which of `enum` / `anyOf`
/ `oneOf` / a type list, an integer in its bounds, a string's length and letters, whether an
optional property is present, how many array items, which tag. JSON is written as
`json.dumps(value, ensure_ascii=False)` writes it. A schema keyword the fake does not implement
(`pattern`, `$ref`, `allOf`, ...) or a structural-tag format it does not implement is refused by
name (`unsupported_value`), never ignored.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ...rules.errors import ProtocolError
from ..structured import FIELD, Constraint

__all__ = ["write"]

Draw = Callable[[], int]
LETTERS = "abcdefghijklmnopqrstuvwxyz"
_SCHEMA_KEYS = {
    "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
    "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "enum", "const", "anyOf", "oneOf", "title", "description", "default", "examples", "strict",
    "$schema",
}  # fmt: skip
_SPAN = 100  # an unbounded number side: this far from the other bound (or from 0)


def _refuse(path: str, what: str) -> ProtocolError:
    return ProtocolError(
        "unsupported_option",
        f"field {path}: {what} is not implemented by the fake engine's constrained decoding",
        field=path,
    )


def _bounds(s: Mapping[str, Any], integer: bool) -> tuple[float, float]:
    lo: float | None = None if s.get("minimum") is None else float(s["minimum"])
    hi: float | None = None if s.get("maximum") is None else float(s["maximum"])
    step = 1 if integer else 0
    if s.get("exclusiveMinimum") is not None:
        lo = float(s["exclusiveMinimum"]) + step
    if s.get("exclusiveMaximum") is not None:
        hi = float(s["exclusiveMaximum"]) - step
    if lo is None and hi is None:
        return 0.0, float(_SPAN)
    if lo is None:
        assert hi is not None
        return hi - _SPAN, hi
    if hi is None:
        return lo, lo + _SPAN
    return lo, hi


def value(schema: Any, draw: Draw, path: str) -> Any:
    """A value valid under `schema` (the subset above), choices taken from `draw`."""
    if schema is True or schema == {}:
        return [draw() % 100, "".join(LETTERS[draw() % 26] for _ in range(3)), True][draw() % 3]
    if not isinstance(schema, Mapping):
        raise _refuse(path, f"the schema {json.dumps(schema)[:40]}")
    extra = sorted(set(schema) - _SCHEMA_KEYS)
    if extra:
        raise _refuse(f"{path}.{extra[0]}", f"the schema keyword {extra[0]!r}")
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][draw() % len(schema["enum"])]
    for key in ("anyOf", "oneOf"):
        if key in schema:
            k = draw() % len(schema[key])
            return value(schema[key][k], draw, f"{path}.{key}[{k}]")
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = kind[draw() % len(kind)]
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else None
        if kind is None:
            return value(True, draw, path)
    if kind == "object":
        required = set(schema.get("required") or [])
        out = {}
        for name, sub in (schema.get("properties") or {}).items():
            if name in required or draw() % 2 == 0:
                out[name] = value(sub, draw, f"{path}.properties.{name}")
        return out
    if kind == "array":
        lo = int(schema.get("minItems") or 0)
        hi = int(schema.get("maxItems", lo + 3))
        count = lo + draw() % (hi - lo + 1)
        return [value(schema.get("items", True), draw, f"{path}.items") for _ in range(count)]
    if kind == "string":
        lo = int(schema.get("minLength") or 0)
        hi = int(schema.get("maxLength", lo + 8))
        return "".join(LETTERS[draw() % 26] for _ in range(lo + draw() % (hi - lo + 1)))
    if kind == "integer":
        a, b = _bounds(schema, True)
        return int(a) + draw() % (int(b) - int(a) + 1)
    if kind == "number":
        a, b = _bounds(schema, False)
        return round(a + (b - a) * (draw() % 10001) / 10000, 4)
    if kind == "boolean":
        return draw() % 2 == 0
    if kind == "null":
        return None
    raise _refuse(f"{path}.type", f"the type {kind!r}")


def _tag(fmt: Mapping[str, Any], draw: Draw, path: str, budget: int) -> str:
    return (
        str(fmt["begin"])
        + _format(fmt["content"], draw, f"{path}.content", budget)
        + str(fmt["end"])
    )


def _format(fmt: Any, draw: Draw, path: str, budget: int) -> str:
    """The text of one structural-tag format (xgrammar's format types, the subset below)."""
    if not isinstance(fmt, Mapping):
        raise _refuse(path, "a format that is not an object")
    kind = fmt.get("type")
    if kind == "const_string":
        return str(fmt["value"])
    if kind == "json_schema":
        found = value(fmt["json_schema"], draw, f"{path}.json_schema")
        return json.dumps(found, ensure_ascii=False)
    if kind == "any_text":  # the fake's free text: printable bytes, as its plain samples
        return "".join(chr(32 + draw() % 95) for _ in range(budget))
    if kind == "sequence":
        return "".join(
            _format(e, draw, f"{path}.elements[{i}]", budget) for i, e in enumerate(fmt["elements"])
        )
    if kind == "or":
        k = draw() % len(fmt["elements"])
        return _format(fmt["elements"][k], draw, f"{path}.elements[{k}]", budget)
    if kind == "tag":
        return _tag(fmt, draw, path, budget)
    if kind in ("tags_with_separator", "triggered_tags"):
        tags = fmt["tags"]
        first = bool(fmt.get("stop_after_first"))
        count = 1 if first else (1 if fmt.get("at_least_one") else 0) + draw() % 2
        if kind == "triggered_tags" and not fmt.get("at_least_one") and count == 0:
            return _format({"type": "any_text"}, draw, path, budget)
        sep = str(fmt.get("separator", "")) if kind == "tags_with_separator" else ""
        picks = [draw() % len(tags) for _ in range(count)]
        return sep.join(_tag(tags[k], draw, f"{path}.tags[{k}]", budget) for k in picks)
    raise _refuse(f"{path}.type", f"the format type {kind!r}")


def write(c: Constraint, zs: Iterator[int], budget: int) -> str:
    """The text of one constrained sample, every choice from the draws `zs`; `budget` bounds
    free text (`any_text`), the caller cuts the tokens at the sample's budget."""

    def draw() -> int:
        return next(zs)

    path = f"{FIELD}.{c.kind}"
    if c.kind == "json":
        return json.dumps(value(c.value, draw, path), ensure_ascii=False)
    return _format(c.value["format"], draw, f"{path}.format", budget)
