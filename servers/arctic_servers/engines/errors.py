"""The engines' error: a spec code, raised inside an engine, that becomes the call's error body.

Its own module so that an engine (DeepSpeed, vLLM, fake) importing it imports nothing else: the
worker loop and the engine registry (`registry.py`, which imports every engine) sit above it.
"""

from __future__ import annotations

import traceback
from typing import Any


class WorkerError(Exception):
    """An error with a spec code, raised by the engines; becomes the call's error body."""

    def __init__(self, code: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details

    def body(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "details": self.details}


def error_body(exc: BaseException, what: str) -> dict[str, Any]:
    """The error body of an engine's exception. Matched by shape, not class: `LossConfigError`
    (and any other error with a spec `code` and a `message`) carries its code the same way as
    `WorkerError`; anything else is `internal`, with its traceback."""
    from arctic_sdk.spec.tables.error_codes import ERRORS

    code, message = getattr(exc, "code", None), getattr(exc, "message", None)
    if isinstance(code, str) and code in ERRORS and isinstance(message, str):
        details = getattr(exc, "details", None)
        return {"code": code, "message": message, "details": dict(details or {})}
    tb = traceback.format_exc(limit=8)
    return {
        "code": "internal",
        "message": f"{what} failed: {type(exc).__name__}: {exc}",
        "details": {"traceback": tb[-4000:]},
    }
