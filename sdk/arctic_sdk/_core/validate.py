"""Client-side body validation: bad input is refused before anything is sent.

The same checks servers run (PROTOCOL.md §2; the one checker is `arctic_sdk.spec.body_check`),
driven by the request message's descriptor and its `(arctic.v1.field)` options. Failures raise
the exception class of the code a server would answer (`InvalidArgumentError`,
`MissingFieldError`, `DtypeMismatchError`, `ShapeMismatchError`, `UnsupportedOptionError`, ...;
all `InvalidArgumentError`s) — the same class the server's answer raises; unknown fields are all
named in one error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from google.protobuf import descriptor_pool

import arctic_sdk.spec.pb.arctic.v1 as _pb  # noqa: F401  (registers the spec's messages)

from .._generated.types import REQUIRED_FIELDS
from ..errors import refused_locally
from ..spec.body_check import BodyError, check_body, leftover_error
from ..spec.model import MethodInfo

_POOL = descriptor_pool.Default()


def validate_body(method: MethodInfo, body: Mapping[str, Any]) -> None:
    """Check the body of a call to `method`, its path parameters included (a checkpoint id is
    checked against the spec's rule before it becomes part of a URL)."""
    if not method.request_type or (not body and not REQUIRED_FIELDS.get(method.request_type)):
        return  # nothing to check (an empty body of an op without required fields)
    desc = _POOL.FindMessageTypeByName(method.request_type)
    try:
        found = check_body(desc, dict(body), options_apart=True)
        bad = leftover_error(desc, found)
    except BodyError as exc:
        bad = exc
    if bad is not None:
        raise refused_locally(
            bad.code,
            f"{method.name}: {bad.text}",
            op=method.name,
            details={"field": bad.path, **bad.details},
        )


def request_fields(method: MethodInfo) -> frozenset[str]:
    """The field names of `method`'s request message (empty without one)."""
    if not method.request_type:
        return frozenset()
    return frozenset(_POOL.FindMessageTypeByName(method.request_type).fields_by_name)
