"""The hand-written part of the SDK's exception hierarchy: `ArcticError` and the categories.

`arctic_sdk._generated.error_classes` adds one class per stable code of `errors.proto` under
these (its parent chosen from the code's gRPC and HTTP status); `arctic_sdk.errors` is the public
module that puts both together. See `arctic_sdk.errors` for the whole picture.
"""

from __future__ import annotations

import builtins
import json
from typing import Any, ClassVar

from .spec.tables.error_codes import ERRORS, ErrorCode

_MAX_DETAILS_CHARS = 2000


class ArcticError(Exception):
    """Base of every error the SDK raises.

    Attributes:
        code: the spec's stable error code (`ErrorCode` value), or "" when unknown.
        message: what went wrong, as the server (or the SDK) said it.
        status: the HTTP status of the answer (gRPC errors carry the table's HTTP status of
            their code); `None` when no answer arrived (or the SDK refused the call itself).
        grpc_status: the gRPC status name of an error that came over gRPC, else None.
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
        grpc_status: str | None = None,
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
        self.grpc_status = grpc_status

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
        if isinstance(self, RequestFailedError):
            pass  # it ran and failed: no transport status belongs to it
        elif self.grpc_status is not None:  # came over gRPC: its status, never an HTTP one
            where.append(f"gRPC {self.grpc_status}")
        elif self.status is not None:
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
            "grpc_status": self.grpc_status,
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
    """`invalid_argument`, and the parent of every code whose gRPC status is INVALID_ARGUMENT
    (`missing_field`, `shape_mismatch`, `unsupported_option`, the codec's checks, ...): the same
    class whether the SDK refused the input before sending or a server refused it."""


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
