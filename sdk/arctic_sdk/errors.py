"""The SDK's one exception hierarchy: one class per stable error code, under a few categories.

Every failure the SDK raises is an `ArcticError`. The class says who is at fault and what to do:

- `UserError`: fix the call (bad input, auth, not found, conflict); retrying the same call fails
  the same way. Categories by status: `BadRequestError` (400, 406, 415), `AuthenticationError`
  (401/403), `NotFoundError` (404/405), `ConflictError` (409; chunk-group errors are
  `ChunkGroupError`), `PayloadTooLargeError` (413).
- `ServerError`: the server failed (`InternalServerError`, `UnimplementedError`); the transient
  ones (`TransientError`: `RateLimitError`, `ServiceUnavailableError`, `ServerTimeoutError`,
  `ArcticConnectionError`) were already retried by the SDK within its retry budget.
- `OutcomeUnknownError`: a mutating call may or may not have executed (a server without
  idempotency support lost the answer); the SDK did not retry it.
- `ArcticTimeoutError` (also a builtin `TimeoutError`): the call's deadline passed.

**One code, one class.** Each stable code of `errors.proto` raises its own class, generated
from the error table (`arctic_sdk._generated.error_classes`): `missing_field` raises
`MissingFieldError`, `job_not_running` `JobNotRunningError`, and so on, the same class whether
the SDK refused the input before sending it or a server refused it over HTTP or gRPC. Every
code whose gRPC status is INVALID_ARGUMENT derives from `InvalidArgumentError` (itself a
`BadRequestError` and a builtin `ValueError`), so `except InvalidArgumentError` catches every
refused input; the other codes derive from their status's category (`JobNotFoundError` is a
`NotFoundError`, `SequenceConflictError` a `ConflictError`).

A request that ran on the server and failed raises the class of its error code, which is then
also a `RequestFailedError`. Every error carries `code` (the stable code, `""` when the server
gave none), `message`, `status` (HTTP status, `None` when there was no answer or the SDK refused
the call itself), `grpc_status` (over gRPC), `details`, `body` (the server's error body, parsed)
and `request_id`.

    >>> from arctic_sdk.errors import error_from_code
    >>> err = error_from_code("shape_mismatch", "field context.advantages: shape [2, 7]")
    >>> type(err).__name__, isinstance(err, InvalidArgumentError), err.retryable
    ('ShapeMismatchError', True, False)
"""

from __future__ import annotations

from typing import Any

from ._error_base import (
    ArcticConnectionError,
    ArcticError,
    ArcticTimeoutError,
    AuthenticationError,
    BadRequestError,
    ChunkGroupError,
    ConflictError,
    InternalServerError,
    InvalidArgumentError,
    NotFoundError,
    OutcomeUnknownError,
    PayloadTooLargeError,
    RateLimitError,
    RequestFailedError,
    ServerError,
    ServerTimeoutError,
    ServiceUnavailableError,
    TransientError,
    UnimplementedError,
    UserError,
    failed_variant,
)
from ._generated import error_classes as _classes
from ._generated.error_classes import *  # noqa: F403  (one class per code)
from ._generated.error_classes import ERROR_CLASSES
from .spec.tables.error_codes import ERRORS

__all__ = [
    "ArcticConnectionError",
    "ArcticError",
    "ArcticTimeoutError",
    "AuthenticationError",
    "BadRequestError",
    "ChunkGroupError",
    "ConflictError",
    "InternalServerError",
    "InvalidArgumentError",
    "NotFoundError",
    "OutcomeUnknownError",
    "PayloadTooLargeError",
    "RateLimitError",
    "RequestFailedError",
    "ServerError",
    "ServerTimeoutError",
    "ServiceUnavailableError",
    "TransientError",
    "UnimplementedError",
    "UserError",
    "error_class",
    "error_from_code",
    "failed_variant",
    "refused_locally",
]
__all__ += _classes.__all__

_BY_STATUS: dict[int, type[ArcticError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: AuthenticationError,
    404: NotFoundError,
    405: NotFoundError,
    406: BadRequestError,
    409: ConflictError,
    413: PayloadTooLargeError,
    415: BadRequestError,
    429: RateLimitError,
    500: InternalServerError,
    501: UnimplementedError,
    503: ServiceUnavailableError,
    504: ServerTimeoutError,
}


def error_class(code: str, status: int | None) -> type[ArcticError]:
    """The exception class of an error `code` (or, for a code outside the spec, of the HTTP
    `status`: its category)."""
    if code in ERROR_CLASSES:
        return ERROR_CLASSES[code]
    if status is None:
        return ArcticError
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    if 400 <= status < 500:
        return UserError
    if status in (502, 507, 508):
        return TransientError
    return ServerError if status >= 500 else ArcticError


def refused_locally(
    code: str, message: str, *, op: str | None = None, details: dict[str, Any] | None = None
) -> ArcticError:
    """The exception of input the SDK refuses before sending anything: the class a server's
    answer with `code` raises, with no status (nothing was sent)."""
    return error_class(code, None)(message, code=code, op=op, details=details)


def error_from_code(
    code: str,
    message: str,
    *,
    status: int | None = None,
    details: dict[str, Any] | None = None,
    body: Any = None,
    request_id: str | None = None,
    retry_after: float | None = None,
    op: str | None = None,
    failed: bool = False,
    grpc_status: str | None = None,
) -> ArcticError:
    """The exception for an error `code` (and/or HTTP `status`); `failed` marks a request that
    ran and failed (the result is then also a `RequestFailedError`); `grpc_status` one that
    came over gRPC."""
    cls = error_class(code, status)
    if failed:
        cls = failed_variant(cls)
    if status is None and code in ERRORS:
        status = ERRORS[code].http_status
    return cls(
        message,
        code=code,
        status=status,
        details=details,
        body=body,
        request_id=request_id,
        retry_after=retry_after,
        op=op,
        grpc_status=grpc_status,
    )
