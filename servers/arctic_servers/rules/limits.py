"""The input limits every server applies before a body or header means anything (PROTOCOL.md
§13, the limit table): JSON depth and encoding, numbers, strings, and the protocol headers.

One place for all three servers and both transports: the protocol core calls `check_headers`
on every call, `load_json` on every JSON body and `check_value` on every decoded DSSST1 body
(gRPC carries JSON-bodied ops as DSSST1 values), and the OpenAI routes parse with `load_json`.
Each refusal is a 4xx with a stable code whose details name the field or header.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from arctic_sdk.spec.value_rules import plain_floats_finite, plain_ints_within

from .errors import ProtocolError

__all__ = [
    "INT_MAX",
    "INT_MIN",
    "JSON_MAX_DEPTH",
    "MAX_HEADER_VALUE",
    "check_headers",
    "check_seq",
    "check_sub_jobs",
    "check_value",
    "load_json",
]

#: Integers anywhere in a body: int64's lower bound to uint64's upper bound (a field's own type
#: narrows it: `arctic_sdk.spec.body_check`). Beyond them no field of the spec can hold the value.
INT_MIN, INT_MAX = -(2**63), 2**64 - 1
#: JSON nesting where a server has no `limits.max_depth` of its own (the OpenAI routes).
JSON_MAX_DEPTH = 64
#: The longest value of a protocol header (`Idempotency-Key`, ids) in characters.
MAX_HEADER_VALUE = 255
SEQ_MAX = 2**63 - 1
_PRINTABLE = re.compile(r"[\x20-\x7e]*")
_TOKEN = re.compile(r"[\x21-\x7e]+")
_DIGITS = re.compile(r"[0-9]{1,19}")
# Headers whose values are printable ASCII of at most MAX_HEADER_VALUE characters.
_ID_HEADERS = ("idempotency-key", "x-arctic-job-id", "x-arctic-sub-job")
_CANON = {
    "idempotency-key": "Idempotency-Key",
    "x-arctic-job-id": "X-Arctic-Job-Id",
    "x-arctic-sub-job": "X-Arctic-Sub-Job",
    "x-arctic-seq": "X-Arctic-Seq",
}


def _header_error(name: str, message: str, expected: str) -> ProtocolError:
    header = _CANON.get(name, name)
    return ProtocolError(
        "invalid_argument", f"header {header}: {message}", field=header, expected=expected
    )


def _shown(value: str) -> str:
    return repr(value if len(value) <= 40 else value[:37] + "...")


def check_seq(raw: str | None) -> int | None:
    """`X-Arctic-Seq`: absent, or decimal digits naming 1 <= n <= 2^63 - 1."""
    if raw is None or raw == "":
        return None
    expected = f"an integer 1 <= n <= {SEQ_MAX}"
    if not _DIGITS.fullmatch(raw) or not 1 <= int(raw) <= SEQ_MAX:
        raise _header_error("x-arctic-seq", f"{_shown(raw)} is not {expected}", expected)
    return int(raw)


def check_headers(headers: Mapping[str, str]) -> None:
    """The protocol's own request headers (lower-case names): printable ASCII, bounded."""
    for name in _ID_HEADERS:
        value = headers.get(name)
        if value is None:
            continue
        expected = f"1-{MAX_HEADER_VALUE} printable ASCII characters"
        if len(value) > MAX_HEADER_VALUE:
            raise _header_error(name, f"is {len(value)} characters long", expected)
        if not value or not _PRINTABLE.fullmatch(value):
            raise _header_error(name, f"{_shown(value)} is not printable ASCII", expected)


def check_sub_jobs(body: Mapping[str, Any], max_sub_jobs: int) -> None:
    """CreateJob: at most `max_sub_jobs` sub-job configs (`limits.max_sub_jobs`)."""
    configs = body.get("sub_job_configs")
    if isinstance(configs, list) and len(configs) > max_sub_jobs:
        raise ProtocolError(
            "invalid_argument",
            f"field sub_job_configs: {len(configs)} sub-jobs, more than this server's "
            f"max_sub_jobs {max_sub_jobs}",
            field="sub_job_configs",
            expected=f"at most {max_sub_jobs} sub-job configs (limits.max_sub_jobs)",
            limit=max_sub_jobs,
        )


def bearer_token(header: str) -> str | None:
    """The token of `Authorization: Bearer <token>`, None when absent; a token outside printable
    ASCII is `unauthenticated` (no server issues one)."""
    token = header[7:].strip() if header[:7].lower() == "bearer " else None
    if token and (len(token) > 4096 or not _TOKEN.fullmatch(token)):
        raise ProtocolError(
            "unauthenticated", "the bearer token is not printable ASCII (or is over 4096 bytes)"
        )
    return token


def _surrogate(text: str) -> bool:
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def check_value(
    value: Any, max_depth: int, where: str = "", depth_code: str = "invalid_argument"
) -> None:
    """A decoded body (JSON, or a DSSST1 value without its tensors): nesting of at most
    `max_depth`, text that is Unicode (no lone surrogate, in keys or values), finite numbers,
    integers in [INT_MIN, INT_MAX]. The first problem is `invalid_argument` naming its path."""
    stack: list[tuple[Any, str, int]] = [(value, where, 0)]
    while stack:
        node, path, depth = stack.pop()
        if isinstance(node, dict):
            if depth >= max_depth:
                raise _depth_error(path, max_depth, depth_code)
            for key, child in node.items():
                if isinstance(key, str) and _surrogate(key):
                    shown = key.encode("utf-8", "backslashreplace").decode()
                    raise _text_error(_join(path, shown))
                _visit(stack, child, _join(path, key), depth)
        elif isinstance(node, list | tuple):
            if depth >= max_depth:
                raise _depth_error(path, max_depth, depth_code)
            if plain_ints_within(node, INT_MIN, INT_MAX) or plain_floats_finite(node):
                continue  # token ids and the like: one pass, not a check per item
            for i, child in enumerate(node):
                _visit(stack, child, f"{path}[{i}]", depth)
        else:
            _check_leaf(node, path)


def _visit(stack: list[tuple[Any, str, int]], child: Any, path: str, depth: int) -> None:
    if isinstance(child, dict | list | tuple):
        stack.append((child, path, depth + 1))
    else:
        _check_leaf(child, path)


def _depth_error(path: str, max_depth: int, code: str) -> ProtocolError:
    return ProtocolError(
        code,
        f"field {path or 'body'}: nests deeper than {max_depth} levels",
        field=path or "body",
        expected=f"at most {max_depth} levels (limits.max_depth)",
        limit=max_depth,
    )


def _text_error(path: str) -> ProtocolError:
    return ProtocolError(
        "invalid_argument",
        f"field {path}: holds a lone surrogate (text that is not Unicode)",
        field=path,
        expected="valid Unicode text",
    )


def _check_leaf(node: Any, path: str) -> None:
    if isinstance(node, str):
        if _surrogate(node):
            raise _text_error(path or "body")
    elif isinstance(node, bool):
        return
    elif isinstance(node, int):
        if not INT_MIN <= node <= INT_MAX:
            digits = len(str(abs(node)))  # JSON integers have at most 4300 digits
            raise ProtocolError(
                "invalid_argument",
                f"field {path}: a {digits}-digit integer is outside [-2^63, 2^64 - 1]",
                field=path,
                expected="an integer that fits int64 / uint64, or a finite double",
            )
    elif isinstance(node, float | np.floating) and not math.isfinite(float(node)):
        raise ProtocolError(
            "invalid_argument",
            f"field {path}: {float(node)!r} is not a finite number",
            field=path,
            expected="a finite number (no NaN or infinity)",
        )


def load_json(raw: bytes | memoryview, max_depth: int) -> Any:
    """Parse a JSON body under the limits: UTF-8 JSON, then `check_value` (depth, text,
    numbers). Failures are `invalid_json` (does not parse, too deep) or `invalid_argument`
    (a value the spec cannot hold, naming its path)."""
    data = bytes(raw)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError("invalid_json", f"the body is not UTF-8: {exc}") from None
    try:
        value = json.loads(text)
    except RecursionError:  # the parser's own guard, long before the stack is at risk
        raise ProtocolError(
            "invalid_json",
            f"the body nests deeper than {max_depth} levels",
            expected=f"at most {max_depth} levels (limits.max_depth)",
            limit=max_depth,
        ) from None
    except ValueError as exc:
        raise ProtocolError("invalid_json", f"the body is not JSON: {exc}") from None
    check_value(value, max_depth, depth_code="invalid_json")
    return value
