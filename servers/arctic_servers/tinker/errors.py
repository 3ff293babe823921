"""The error answers of the Tinker surface, in the shapes the 0.38 SDK reads.

A refused submit is an HTTP 4xx with a JSON body `{"detail", "code", ...}`: the SDK raises
`tinker.BadRequestError` (400), `AuthenticationError` (401), `NotFoundError` (404),
`ConflictError` (409), `UnprocessableEntityError` (422) with the body intact. A future that
failed answers `retrieve_future` with `{"error", "category"}`, which the SDK raises as
`tinker.RequestFailedError` (category "user" for a refused request, "server" otherwise).
"""

from __future__ import annotations

from typing import Any

__all__ = ["TinkerError", "failure_body"]


class TinkerError(Exception):
    """A refusal: HTTP `status`, a message naming the field, value and expectation, a stable
    `code` (the protocol's where one fits)."""

    def __init__(self, status: int, message: str, code: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.extra = extra

    def body(self) -> dict[str, Any]:
        return {"detail": self.message, "code": self.code, **self.extra}


def failure_body(exc: BaseException) -> dict[str, Any]:
    """The `retrieve_future` answer of a failed future (`RequestFailedResponse`)."""
    if isinstance(exc, TinkerError):
        category = "user" if exc.status < 500 else "server"
        return {"error": f"{exc.code}: {exc.message}", "category": category}
    status = int(getattr(exc, "http_status", 0) or getattr(exc, "status", 0) or 500)
    code = str(getattr(exc, "code", "") or type(exc).__name__)
    category = "user" if 400 <= status < 500 else "server"
    return {"error": f"{code}: {exc}", "category": category}
