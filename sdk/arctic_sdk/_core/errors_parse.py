"""Error bodies -> exceptions (PROTOCOL.md §6), including the deployed shapes.

Readers accept the spec's `{"error": {"code", "message", "details"}}`, JSON nested inside string
messages (the Cortex gateway wraps backend errors that way, sometimes twice), FastAPI's
`{"detail": ...}` (an object, a string, or a list of `{loc, msg, type}`), `{"message", "code":
<int>}`, the legacy "request chunk group is missing chunks" message, and non-JSON text.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any

from ..errors import ArcticError, error_from_code
from ..spec.tables.error_codes import ERRORS, ErrorCode

_MAX_DEPTH = 8
_MAX_SCAN_CHARS = 256 * 1024
_MAX_TEXT = 500
_LEGACY_MISSING = "request chunk group is missing chunks"

# Statuses with one generic code (409 has none: every 409 code is specific).
_GENERIC: dict[int, str] = {}
for _code, _info in ERRORS.items():
    if _info.http_status != 409:
        _GENERIC.setdefault(_info.http_status, _code)
_GENERIC[422] = ErrorCode.INVALID_ARGUMENT


@dataclass(frozen=True)
class ParsedError:
    """What an error body said."""

    code: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)
    body: Any = None


def _decode_embedded(text: str) -> Iterator[Any]:
    """Every JSON object or array embedded in `text`."""
    if len(text) > _MAX_SCAN_CHARS:
        return
    decoder = json.JSONDecoder()
    i = 0
    while True:
        starts = [p for p in (text.find("{", i), text.find("[", i)) if p >= 0]
        if not starts:
            return
        i = min(starts)
        try:
            value, end = decoder.raw_decode(text, i)
        except ValueError:
            i += 1
            continue
        if isinstance(value, dict | list):
            yield value
        i = end


def _walk(value: Any, depth: int = 0) -> Iterator[tuple[int, dict[str, Any]]]:
    """Every dict in `value` (pre-order), with its nesting depth; strings are scanned for JSON."""
    if depth > _MAX_DEPTH:
        return
    if isinstance(value, dict):
        yield depth, value
        for v in value.values():
            yield from _walk(v, depth + 1)
    elif isinstance(value, list):
        for v in value[:64]:
            yield from _walk(v, depth + 1)
    elif isinstance(value, str) and ("{" in value or "[" in value):
        for inner in _decode_embedded(value):
            yield from _walk(inner, depth + 1)


def _decode_strings(value: Any, depth: int = 0) -> Any:
    """`value` with every string that is a whole JSON document replaced by its value."""
    if depth > _MAX_DEPTH:
        return value
    if isinstance(value, dict):
        return {k: _decode_strings(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode_strings(v, depth + 1) for v in value]
    if isinstance(value, str) and value[:1] in ("{", "[") and len(value) <= _MAX_SCAN_CHARS:
        try:
            return _decode_strings(json.loads(value), depth + 1)
        except ValueError:
            return value
    return value


def _fastapi_message(detail: list[Any]) -> str:
    parts = []
    for item in detail:
        if isinstance(item, dict):
            loc = ".".join(str(p) for p in item.get("loc", ()) if p != "body")
            parts.append(f"{loc}: {item.get('msg', item)}" if loc else str(item.get("msg", item)))
        else:
            parts.append(str(item))
    return "; ".join(parts)


def _strong(d: dict[str, Any]) -> ParsedError | None:
    """A dict naming a code of the spec."""
    code = d.get("code")
    if isinstance(code, str) and code in ERRORS:
        msg = d.get("message", d.get("msg", ""))
        details = d.get("details")
        if not isinstance(details, dict):
            details = {k: v for k, v in d.items() if k not in ("code", "message", "msg")}
        return ParsedError(code, str(msg), dict(details))
    msg = d.get("message")
    if isinstance(msg, str) and msg.strip().lower().startswith(_LEGACY_MISSING):
        details = {k: v for k, v in d.items() if k != "message"}
        return ParsedError(ErrorCode.CHUNK_GROUP_MISSING_CHUNKS, msg, details)
    return None


def _weak(obj: Any, status: int | None) -> ParsedError:
    code = _GENERIC.get(status or 0, "")
    if isinstance(obj, dict):
        err = obj.get("error")
        if isinstance(err, dict):
            return _weak(err, status)
        detail = obj.get("detail")
        if isinstance(detail, list):
            return ParsedError(
                code or ErrorCode.INVALID_ARGUMENT, _fastapi_message(detail), {"errors": detail}
            )
        if isinstance(detail, dict):
            return _weak(detail, status)
        for key in ("message", "msg", "detail", "error", "title"):
            if isinstance(obj.get(key), str) and obj[key]:
                details = {k: v for k, v in obj.items() if k not in (key, "code", "details")}
                if isinstance(obj.get("details"), dict):
                    details.update(obj["details"])
                if "code" in obj and not isinstance(obj["code"], bool):
                    details.setdefault("server_code", obj["code"])
                return ParsedError(code, obj[key], details)
        return ParsedError(code, json.dumps(obj, default=str)[:_MAX_TEXT])
    if isinstance(obj, str):
        text = obj.strip()
        return ParsedError(code, text[:_MAX_TEXT] + ("..." if len(text) > _MAX_TEXT else ""))
    return ParsedError(code, f"HTTP {status}" if status else "error")


def parse_error(raw: Any, status: int | None = None) -> ParsedError:
    """Parse an error body (bytes, text, or already-decoded JSON) answered with `status`."""
    if isinstance(raw, bytes | bytearray | memoryview):
        text = bytes(raw).decode("utf-8", "replace")
        try:
            raw = json.loads(text)
        except ValueError:
            raw = text
    best: tuple[int, ParsedError] | None = None
    for depth, d in _walk(raw):
        found = _strong(d)
        if found is not None and (best is None or depth > best[0]):
            best = (depth, found)
    body = _decode_strings(raw)
    if best is not None:
        p = best[1]
        return ParsedError(p.code, p.message or _weak(raw, status).message, p.details, body)
    weak = _weak(raw, status)
    return ParsedError(weak.code, weak.message, weak.details, body)


def retry_after(
    headers: Mapping[str, str], details: Mapping[str, Any] | None = None
) -> float | None:
    """Seconds from `Retry-After` (seconds or an HTTP date) or `details.retry_after_s`."""
    raw = headers.get("retry-after")
    if raw:
        try:
            value = float(raw)
            if math.isfinite(value):
                return max(0.0, value)
        except ValueError:
            try:
                return max(0.0, parsedate_to_datetime(raw).timestamp() - time.time())
            except (TypeError, ValueError):
                pass
    if details:
        given = details.get("retry_after_s")
        if isinstance(given, int | float) and not isinstance(given, bool) and given >= 0:
            return float(given)
    return None


def _redact(value: Any, redact: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: _redact(v, redact) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact(v, redact) for v in value]
    return value


def to_exception(
    parsed: ParsedError,
    *,
    status: int | None,
    op: str | None = None,
    request_id: str | None = None,
    retry_after_s: float | None = None,
    failed: bool = False,
    redact: Callable[[str], str] = lambda s: s,
    grpc_status: str | None = None,
) -> ArcticError:
    """The typed exception of a parsed error (secrets redacted from every string)."""
    return error_from_code(
        parsed.code,
        redact(parsed.message),
        status=status,
        details=_redact(parsed.details, redact),
        body=_redact(parsed.body, redact),
        request_id=request_id,
        retry_after=retry_after_s,
        op=op,
        failed=failed,
        grpc_status=grpc_status,
    )
