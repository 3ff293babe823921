"""The SDK's one exception hierarchy, keyed by the spec's stable error codes.

Every failure the SDK raises is an `ArcticError`. The class says who is at fault and what to do:

- `UserError`: fix the call (bad input, auth, not found, conflict); retrying the same call fails
  the same way. Subclasses by HTTP status: `BadRequestError` (400, 406, 415, and input the SDK
  refuses before sending: `InvalidArgumentError`), `AuthenticationError` (401/403),
  `NotFoundError` (404/405), `ConflictError` (409; chunk-group errors are `ChunkGroupError`),
  `PayloadTooLargeError` (413).
- `ServerError`: the server failed (`InternalServerError`, `UnimplementedError`); the transient
  ones (`TransientError`: `RateLimitError`, `ServiceUnavailableError`, `ServerTimeoutError`,
  `ArcticConnectionError`) were already retried by the SDK within its retry budget.
- `OutcomeUnknownError`: a mutating call may or may not have executed (a server without
  idempotency support lost the answer); the SDK did not retry it.
- `ArcticTimeoutError` (also a builtin `TimeoutError`): the call's deadline passed.

A request that ran on the server and failed raises the class of its error code, which is then
also a `RequestFailedError`. Every error carries `code` (the stable code, `""` when the server
gave none), `message`, `status` (HTTP status, `None` when there was no answer), `details`,
`body` (the server's error body, parsed) and `request_id`.

The code -> class mapping is derived from the generated error table
(`arctic_sdk._generated.error_codes.ERRORS`: HTTP status, fault side, retryability); only the
chunk-group codes and `request_cancelled` have classes of their own.

    >>> from arctic_sdk.errors import error_from_code
    >>> err = error_from_code("shape_mismatch", "field context.advantages: shape [2, 7]")
    >>> type(err).__name__, err.user_fault, err.retryable
    ('BadRequestError', True, False)
"""

from __future__ import annotations

import builtins
import json
from typing import Any, ClassVar

from ._generated.error_codes import ERRORS, ErrorCode

__all__ = [
    "ArcticConnectionError",
    "ArcticError",
    "ArcticTimeoutError",
    "AuthenticationError",
    "BadRequestError",
    "ChunkGroupConflictError",
    "ChunkGroupError",
    "ChunkGroupMissingChunksError",
    "ChunkGroupRestartRequiredError",
    "ConflictError",
    "InternalServerError",
    "InvalidArgumentError",
    "NotFoundError",
    "OutcomeUnknownError",
    "PayloadTooLargeError",
    "RateLimitError",
    "RequestCancelledError",
    "RequestFailedError",
    "ServerError",
    "ServerTimeoutError",
    "ServiceUnavailableError",
    "TransientError",
    "UnimplementedError",
    "UserError",
    "error_class",
    "error_from_code",
]

_MAX_DETAILS_CHARS = 2000


class ArcticError(Exception):
    """Base of every error the SDK raises.

    Attributes:
        code: the spec's stable error code (`ErrorCode` value), or "" when unknown.
        message: what went wrong, as the server (or the SDK) said it.
        status: the HTTP status of the answer (gRPC errors carry the table's HTTP status of
            their code); `None` when no answer arrived.
        details: machine-readable detail (`field`, `expected`, `retry_after_s`, ...).
        body: the server's error body as parsed (JSON nested in strings decoded), or None.
        request_id: the request the error belongs to, when there is one.
        retry_after: seconds the server asked to wait (429/503), or None.
    """

    default_code: ClassVar[str] = ""

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        status: int | None = None,
        details: dict[str, Any] | None = None,
        body: Any = None,
        request_id: str | None = None,
        retry_after: float | None = None,
        op: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code if code is not None else self.default_code
        self.status = status
        self.details: dict[str, Any] = dict(details or {})
        self.body = body
        self.request_id = request_id
        self.retry_after = retry_after
        self.op = op

    @property
    def user_fault(self) -> bool:
        """True when the caller must change something (the spec's `user_fault`)."""
        info = ERRORS.get(self.code)
        if info is not None:
            return info.user_fault
        return isinstance(self, UserError)

    @property
    def retryable(self) -> bool:
        """True when the same call may succeed later (the spec's `retryable`)."""
        info = ERRORS.get(self.code)
        if info is not None:
            return info.retryable
        return isinstance(self, TransientError)

    def __str__(self) -> str:
        parts = [f"[{self.code}] {self.message}" if self.code else self.message]
        where = []
        if self.op:
            where.append(f"op {self.op}")
        if self.status is not None:
            where.append(f"HTTP {self.status}")
        if self.request_id:
            where.append(f"request {self.request_id}")
        if where:
            parts.append(f"({', '.join(where)})")
        if self.details:
            text = json.dumps(self.details, default=str, sort_keys=True)
            if len(text) > _MAX_DETAILS_CHARS:
                text = text[:_MAX_DETAILS_CHARS] + "..."
            parts.append(f"details: {text}")
        return " ".join(parts)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        failed = isinstance(self, RequestFailedError)
        base = _BASE_OF.get(type(self), type(self))
        state = {
            "code": self.code,
            "status": self.status,
            "details": self.details,
            "body": self.body,
            "request_id": self.request_id,
            "retry_after": self.retry_after,
            "op": self.op,
        }
        return (_rebuild, (base, failed, self.message, state))


def _rebuild(cls: type[ArcticError], failed: bool, message: str, state: dict[str, Any]) -> Any:
    target = failed_variant(cls) if failed else cls
    return target(message, **state)


# ------------------------------------------------------------------ fault: the caller


class UserError(ArcticError):
    """The caller's fault: bad input, auth, not found, conflict. Retrying will not help."""


class BadRequestError(UserError):
    """400 (and 406, 415): a body, field or option the server refused."""

    default_code = ErrorCode.INVALID_ARGUMENT


class InvalidArgumentError(BadRequestError, ValueError):
    """Input the SDK refused before sending anything (same codes as the server would use)."""


class AuthenticationError(UserError):
    """401/403: no token, or one the server does not accept."""

    default_code = ErrorCode.UNAUTHENTICATED


class NotFoundError(UserError):
    """404/405: no such route, job, request, checkpoint or sub-job."""

    default_code = ErrorCode.NOT_FOUND


class ConflictError(UserError):
    """409: the call conflicts with the job's or request's state."""


class ChunkGroupError(ConflictError):
    """A chunk-group failure (PROTOCOL.md §3.5)."""


class ChunkGroupRestartRequiredError(ChunkGroupError):
    """The server lost the group; the SDK replays it once from chunk 0 before raising this."""

    default_code = ErrorCode.CHUNK_GROUP_RESTART_REQUIRED


class ChunkGroupConflictError(ChunkGroupError):
    """The chunk-group id was used with different content."""

    default_code = ErrorCode.CHUNK_GROUP_CONFLICT


class ChunkGroupMissingChunksError(ChunkGroupError):
    """The group was closed with chunks missing (`details.missing_chunks`)."""

    default_code = ErrorCode.CHUNK_GROUP_MISSING_CHUNKS


class RequestCancelledError(ConflictError):
    """The request was cancelled before it completed."""

    default_code = ErrorCode.REQUEST_CANCELLED


class PayloadTooLargeError(UserError):
    """413: a body, chunk, frame or header exceeds an advertised limit."""

    default_code = ErrorCode.BODY_TOO_LARGE


# ------------------------------------------------------------------ fault: the server


class ServerError(ArcticError):
    """The server's fault."""


class InternalServerError(ServerError):
    """500: a server fault (not retried)."""

    default_code = ErrorCode.INTERNAL


class UnimplementedError(ServerError):
    """501: the server does not implement the op (and the spec has no fallback for it)."""

    default_code = ErrorCode.UNIMPLEMENTED


class TransientError(ServerError):
    """A failure that may pass; the SDK retried it within its budget before raising."""


class RateLimitError(TransientError):
    """429: too many requests in flight; `retry_after` says how long the server asked to wait."""

    default_code = ErrorCode.RATE_LIMITED


class ServiceUnavailableError(TransientError):
    """503: the server is starting, draining or temporarily unable to serve."""

    default_code = ErrorCode.UNAVAILABLE


class ServerTimeoutError(TransientError):
    """504: the server gave up waiting for an engine."""

    default_code = ErrorCode.DEADLINE_EXCEEDED


class ArcticConnectionError(TransientError, builtins.ConnectionError):
    """No answer: the connection failed (refused, reset, or a per-attempt timeout)."""


# ------------------------------------------------------------------ neither


class OutcomeUnknownError(ArcticError):
    """A mutating call may have executed but its answer was lost, and the server does not
    advertise idempotency, so the SDK did not retry it (a retry could, e.g., apply a second
    optimizer step). Check the job's state before resending."""


class ArcticTimeoutError(ArcticError, builtins.TimeoutError):
    """The call's deadline passed. A submitted request keeps running on the server;
    `request_id` names it (poll it with `get_request`, or cancel it with `cancel_request`)."""


class RequestFailedError(ArcticError):
    """A request ran on the server and failed. Raised errors of failed requests are instances of
    both this class and the class of their code (e.g. `BadRequestError`)."""


# ------------------------------------------------------------------ code -> class

_SPECIFIC: dict[str, type[ArcticError]] = {
    ErrorCode.CHUNK_GROUP_RESTART_REQUIRED: ChunkGroupRestartRequiredError,
    ErrorCode.CHUNK_GROUP_CONFLICT: ChunkGroupConflictError,
    ErrorCode.CHUNK_GROUP_MISSING_CHUNKS: ChunkGroupMissingChunksError,
    ErrorCode.REQUEST_CANCELLED: RequestCancelledError,
}

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
    """The exception class of an error `code` (or, for unknown codes, of the HTTP `status`)."""
    if code in _SPECIFIC:
        return _SPECIFIC[code]
    info = ERRORS.get(code)
    st = info.http_status if info is not None else status
    if st is None:
        return ArcticError
    if st in _BY_STATUS:
        cls = _BY_STATUS[st]
        if cls is InternalServerError and info is not None and info.retryable:
            return TransientError
        return cls
    if 400 <= st < 500:
        return UserError
    if st in (502, 507, 508) or (info is not None and info.retryable):
        return TransientError
    return ServerError if st >= 500 else ArcticError


_FAILED: dict[type[ArcticError], type[ArcticError]] = {}
_BASE_OF: dict[type[ArcticError], type[ArcticError]] = {}


def failed_variant(cls: type[ArcticError]) -> type[ArcticError]:
    """`cls` combined with `RequestFailedError` (created once per class)."""
    if issubclass(cls, RequestFailedError):
        return cls
    variant = _FAILED.get(cls)
    if variant is None:
        variant = type(cls.__name__, (cls, RequestFailedError), {"__module__": cls.__module__})
        variant.__qualname__ = cls.__qualname__
        variant.__doc__ = cls.__doc__
        _FAILED[cls] = variant
        _BASE_OF[variant] = cls
    return variant


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
) -> ArcticError:
    """The exception for an error `code` (and/or HTTP `status`); `failed` marks a request that
    ran and failed (the result is then also a `RequestFailedError`)."""
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
    )
