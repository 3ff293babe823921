"""Server-side body validation: the spec's one body checker (`arctic_sdk.spec.body_check`), with
its failures as `ProtocolError`s.

Every op's body — JSON or DSSST1 — is checked against its `request_type` message: unknown
fields, value types, enum names (with the deployed synonyms), required fields, and for tensors
their dtype and symbolic shape; then each number field's `(arctic.v1.field)` bounds from the
generated request-rule table (`arctic_sdk.spec.tables.request_rules`), so no server keeps its own
copy of a field's range. Every failure names the field, the value and what was expected; unknown
knobs of an options message (`LossConfig`) are `unsupported_option`.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import Descriptor

from arctic_sdk.spec.body_check import BodyError, check_body, dtype_name, leftover_error
from arctic_sdk.spec.tables.request_rules import BOUNDS
from arctic_sdk.spec.value_rules import bound_error

from .errors import ProtocolError

__all__ = ["dtype_name", "validate_body"]


def validate_body(desc: Descriptor, body: Any) -> None:
    """Check `body` against the message `desc`; raise `ProtocolError` on the first problem.

    Unknown fields are collected over the whole body and reported together
    (`invalid_argument`, `details.unknown_fields`, each with the fields expected at its place and
    a "did you mean"), so a caller fixes them in one round; then unknown knobs
    (`unsupported_option`), missing fields, and fields the chosen loss does not read.
    """
    try:
        found = check_body(desc, body, options_apart=True, synonyms=True)
        bad = leftover_error(desc, found)
    except BodyError as exc:
        bad = exc
    if bad is not None:
        raise ProtocolError(bad.code, bad.text, field=bad.path, **bad.details)
    wrong = bound_error(BOUNDS.get(desc.full_name, ()), body)
    if wrong is not None:
        path, message, expected = wrong
        raise ProtocolError(
            "invalid_argument", f"field {path}: {message}", field=path, expected=expected
        )
