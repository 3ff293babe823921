"""The one server-side error type: a spec code, a message naming what was wrong, and details."""

from __future__ import annotations

from typing import Any

from arctic_sdk.spec.tables.error_codes import ERRORS


class ProtocolError(Exception):
    """Raised by servicers and the protocol layer; rendered as the spec's error body.

    `code` is a stable code of `errors.proto` (JSON form, e.g. "shape_mismatch"); the HTTP and
    gRPC statuses come from the error table, never from the raiser.
    """

    def __init__(self, code: str, message: str, **details: Any) -> None:
        if code not in ERRORS:
            raise ValueError(f"error code {code!r} is not in errors.proto")
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details

    @property
    def http_status(self) -> int:
        return ERRORS[self.code].http_status

    @property
    def grpc_status(self) -> str:
        return ERRORS[self.code].grpc_status

    def body(self) -> dict[str, Any]:
        """The `ErrorBody` JSON object."""
        return {"error": {"code": self.code, "message": self.message, "details": self.details}}

    def __repr__(self) -> str:
        return f"ProtocolError({self.code!r}, {self.message!r})"
