"""`SamplingParams.structured_outputs` (constrained decoding): the one reading every engine and
the servers' shared checks use.

Exactly one of `json` (a JSON schema) and `structural_tag` (an xgrammar structural tag) is set,
each as JSON text; both are parsed under the protocol's JSON limits (depth, numbers, text) so a
hostile constraint is a 400 naming its field, never an engine error. The vLLM sampler hands the
text to vLLM's `StructuredOutputsParams` (xgrammar decodes it); the fake engine writes a value of
the constraint's language from its draws (`engines/fake/structured.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..rules import limits
from ..rules.errors import ProtocolError

__all__ = ["FIELD", "Constraint", "parse"]

FIELD = "sampling_params.structured_outputs"
KINDS = ("json", "structural_tag")


@dataclass(frozen=True)
class Constraint:
    """One parsed constraint: its kind (`json` / `structural_tag`), the text as sent, the value."""

    kind: str
    text: str
    value: Any


def _bad(path: str, message: str, expected: str) -> ProtocolError:
    return ProtocolError(
        "invalid_argument", f"field {path}: {message}", field=path, expected=expected
    )


def parse(sp: Mapping[str, Any]) -> Constraint | None:
    """The request's constraint (None when absent or empty); `invalid_argument` naming the field
    for two kinds at once, text that is not JSON, or a value of the wrong shape."""
    so = sp.get("structured_outputs")
    if not so:
        return None
    if not isinstance(so, Mapping):
        raise _bad(FIELD, "expected an object", "{json} or {structural_tag}")
    given = [k for k in KINDS if so.get(k)]
    if len(given) != 1:
        raise _bad(
            FIELD,
            f"{len(given)} constraints given ({', '.join(given) or 'none'}); exactly one is used",
            "exactly one of json, structural_tag",
        )
    kind = given[0]
    path = f"{FIELD}.{kind}"
    text = so[kind]
    if not isinstance(text, str):
        raise _bad(path, f"expected JSON text, got {type(text).__name__}", "JSON text")
    try:
        value = limits.load_json(text.encode("utf-8", "surrogatepass"), limits.JSON_MAX_DEPTH)
    except ProtocolError as exc:
        raise _bad(path, f"not JSON within the limits: {exc.message}", "JSON text") from None
    if kind == "json" and not isinstance(value, dict | bool):
        raise _bad(path, "a JSON schema is an object (or true)", "a JSON schema object")
    if kind == "structural_tag" and not (
        isinstance(value, dict)
        and value.get("type") == "structural_tag"
        and isinstance(value.get("format"), dict)
    ):
        raise _bad(
            path,
            'expected {"type": "structural_tag", "format": {...}}',
            "an xgrammar structural tag",
        )
    return Constraint(kind, text, value)
