"""Client-side body validation: bad input is refused before anything is sent.

The same checks servers run (PROTOCOL.md §2; the one checker is `arctic_sdk._body_check`),
driven by the request message's descriptor and its `(arctic.v1.field)` options. Failures raise
`InvalidArgumentError` with the code a server would answer (`invalid_argument`, `missing_field`,
`dtype_mismatch`, `shape_mismatch`); unknown fields are all named in one error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from google.protobuf import descriptor_pool

import arctic_sdk._generated.arctic.v1 as _pb  # noqa: F401  (registers the spec's messages)

from .._body_check import BodyError, check_body, unknown_fields_message
from .._generated.types import REQUIRED_FIELDS
from .._spec import MethodInfo
from ..errors import InvalidArgumentError

_POOL = descriptor_pool.Default()


def validate_body(method: MethodInfo, body: Mapping[str, Any]) -> None:
    """Check the body of a call to `method`, its path parameters included (a checkpoint id is
    checked against the spec's rule before it becomes part of a URL)."""
    if not method.request_type or (not body and not REQUIRED_FIELDS.get(method.request_type)):
        return  # nothing to check (an empty body of an op without required fields)
    desc = _POOL.FindMessageTypeByName(method.request_type)
    try:
        found = check_body(desc, dict(body))
    except BodyError as bad:
        raise InvalidArgumentError(
            f"{method.name}: field {bad.path}: {bad.message}",
            code=bad.code,
            op=method.name,
            details={"field": bad.path, **bad.details},
        ) from None
    if found.unknown:
        raise InvalidArgumentError(
            f"{method.name}: {unknown_fields_message(desc, found.unknown)}",
            code="invalid_argument",
            op=method.name,
            details={"field": found.unknown[0], "unknown_fields": found.unknown},
        )


def request_fields(method: MethodInfo) -> frozenset[str]:
    """The field names of `method`'s request message (empty without one)."""
    if not method.request_type:
        return frozenset()
    return frozenset(_POOL.FindMessageTypeByName(method.request_type).fields_by_name)
