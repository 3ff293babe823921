"""JSON parsing for readers: the strict header parser (R7, R8) and the lax inner parser.

Two dialects meet in a frame (`proto/DSSST1.md` §2): the safetensors header is standard JSON whose
objects must not repeat a key, while the ``dss`` and ``op`` strings inside it may hold the
``NaN`` / ``Infinity`` / ``-Infinity`` tokens the deployed writer emits.

Speed matters here (a header parse is most of a decode), so both parsers call the C scanner of
the standard library directly and fall back to the full decoder only to produce its error or to
skip leading whitespace. The header scanner turns every JSON object into a tuple of (key, value)
pairs (a C call, no Python hook per object); `header_dict` then builds the dicts of the header
object, its ``__metadata__`` and its tensor entries and notices repeated keys by length. Objects
nested deeper stay tuples: no valid header has any (R9 / R14 refuse them), so `deep_duplicate`
looks for repeated keys in them only when a later check has failed, to report R8 first.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from json.scanner import make_scanner
from typing import Any, cast

from ._errors import DSSError, ErrorCode

__all__ = [
    "JSON_ERRORS",
    "deep_duplicate",
    "header_dict",
    "json_type",
    "loads_inner",
    "parse_header",
]

#: What the parsers below may raise on bad input (recursion: deeply nested arrays).
JSON_ERRORS = (ValueError, RecursionError)

_JSON_SPACE = " \t\n\r"


def _refuse_constant(token: str) -> Any:
    raise ValueError(f"non-standard JSON token {token}")


def _scanner(decoder: json.JSONDecoder) -> Callable[[str], Any]:
    scan_once = cast(Any, make_scanner)(decoder)
    decode = decoder.decode

    def parse(text: str) -> Any:
        try:
            value, end = scan_once(text, 0)
        except StopIteration:  # not a JSON value at 0: the decoder skips space or says why
            return decode(text)
        if end != len(text) and text[end:].strip(_JSON_SPACE):
            return decode(text)  # raises "Extra data"
        return value

    return parse


_scan_header = _scanner(json.JSONDecoder(object_pairs_hook=tuple, parse_constant=_refuse_constant))

#: Parse the JSON inside a ``dss`` / ``op`` string (NaN / Infinity accepted).
loads_inner: Callable[[str], Any] = _scanner(json.JSONDecoder())


def _duplicate(pairs: tuple[tuple[str, Any], ...], where: str) -> DSSError | None:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            return DSSError(
                ErrorCode.HEADER_DUPLICATE_KEY, f"{where}[{key!r}]", "unique keys", "a repeat"
            )
        seen.add(key)
    return None


def parse_header(text: str) -> tuple[tuple[str, Any], ...]:
    """R7: the header text as a JSON object, in pair form (objects are tuples of pairs)."""
    try:
        pairs = _scan_header(text)
    except JSON_ERRORS as exc:
        raise DSSError(ErrorCode.HEADER_NOT_JSON, "header", "a JSON object", str(exc)) from exc
    if type(pairs) is not tuple:
        got = "a JSON " + ("array" if type(pairs) is list else type(pairs).__name__)
        raise DSSError(ErrorCode.HEADER_NOT_JSON, "header", "a JSON object", got)
    return pairs


def header_dict(pairs: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    """R8 for the header object, its tensor entries and ``__metadata__``: the header as dicts.

    Objects nested deeper stay in pair form; only invalid headers have any (see `deep_duplicate`).
    """
    header: dict[str, Any] = dict(pairs)
    if len(header) != len(pairs):
        raise _duplicate(pairs, "header") or AssertionError("unreachable")
    for key, value in pairs:
        if type(value) is tuple:
            obj = dict(value)
            if len(obj) != len(value):
                raise _duplicate(value, f"header[{key!r}]") or AssertionError("unreachable")
            header[key] = obj
    return header


def deep_duplicate(pairs: tuple[tuple[str, Any], ...]) -> DSSError | None:
    """R8 in any object of the header, however deep (for the error path of later checks)."""
    stack: list[tuple[Any, str]] = [(pairs, "header")]
    while stack:
        value, where = stack.pop()
        if type(value) is tuple:
            found = _duplicate(value, where)
            if found is not None:
                return found
            stack.extend((item, f"{where}[{key!r}]") for key, item in value)
        elif type(value) is list:
            stack.extend((item, f"{where}[{index}]") for index, item in enumerate(value))
    return None


def json_type(value: object) -> str:
    """The JSON type name of a parsed header value, for error texts."""
    if value is None:
        return "null"
    if type(value) is bool:
        return "a boolean"
    if type(value) is int or type(value) is float:
        return f"the number {value!r}"[:60]
    if type(value) is str:
        return "a string"
    if type(value) is list:
        return "an array"
    return "an object"
