"""The in-process binding: a surface served by this server (Tinker's routes) calls the protocol
core as the HTTP and gRPC bindings do, without a socket, an HTTP hop or a DSSST1 frame.

A call is an `IncomingCall` of transport "inproc" whose body is a value (tensors as the
surface's arrays), carrying the caller's token and idempotency key as headers; the core runs it
as any call — auth, input limits, the field rules (`validate.py`), the servicer's checks,
idempotency, the request record (and its durable copy), per-token limits — and this binding
waits for the request to end (no poll interval) and answers its result as the servicer
returned it, or raises its error as the `ProtocolError` a remote client would have read. A
caller whose wait is cancelled (a Tinker future cancelled, a session that ended) has abandoned
the call: its request is cancelled as CancelRequest would (PROTOCOL.md §3.3, "Abandoned calls").

A surface that runs part of a call itself (the OpenAI routes' streamed samples: arctic.v1 has no
streaming op) has it admitted by the core first (`checked`: the same checks, nothing recorded),
and authenticates its own routes with the core's rule (`authenticate`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import dssst1
from arctic_sdk.spec.model import MethodInfo
from arctic_sdk.spec.tables import methods as M

from ..rules.errors import ProtocolError
from .calls import IncomingCall
from .context import CallContext
from .core import ProtocolCore

__all__ = ["CoreCalls", "cancel_request"]


class CoreCalls:
    """Calls of one core on behalf of callers identified by their tokens."""

    def __init__(self, core: ProtocolCore) -> None:
        self.core = core

    def authenticate(self, authorization: str) -> str | None:
        """The caller's token of an `Authorization` header value, by the core's rule; None on a
        server without tokens (it tells no callers apart)."""
        token = self.core.authenticate(authorization)
        return token if self.core.auth_on else None

    @staticmethod
    def _incoming(
        method: MethodInfo,
        token: str | None,
        body: Mapping[str, Any] | None,
        job_id: str | None,
        sub_job_id: str | None,
        key: str | None,
        box: dict[str, Any],
    ) -> IncomingCall:
        headers = {}
        if token:
            headers["authorization"] = f"Bearer {token}"
        if key:
            headers["idempotency-key"] = key
        if sub_job_id:
            headers["x-arctic-sub-job"] = sub_job_id
        return IncomingCall(
            method=method,
            transport="inproc",
            headers=headers,
            path_params={"job_id": job_id} if job_id else {},
            value=dict(body or {}),
            result_box=box,
        )

    async def checked(
        self,
        method: MethodInfo,
        token: str | None,
        body: Mapping[str, Any],
        *,
        job_id: str | None = None,
        sub_job_id: str | None = None,
    ) -> tuple[CallContext, dict[str, Any]]:
        """Admit a call the caller runs itself (`ProtocolCore.checked`): its context and body
        as the servicer reads them."""
        return await self.core.checked(
            self._incoming(method, token, body, job_id, sub_job_id, None, {})
        )

    async def call(
        self,
        method: MethodInfo,
        token: str | None,
        body: Mapping[str, Any] | None = None,
        *,
        job_id: str | None = None,
        sub_job_id: str | None = None,
        key: str | None = None,
    ) -> Any:
        """Run `method` with `body` as the caller `token` (on `job_id`, its sub-job
        `sub_job_id`; `key` its Idempotency-Key) and answer its result value."""
        box: dict[str, Any] = {}
        call = self._incoming(method, token, body, job_id, sub_job_id, key, box)
        outcome = await self.core.handle(call)
        if outcome.record is None:  # the control plane, or a cached answer
            return outcome.value
        try:
            rec = await self.core.wait_terminal(outcome.record)
        except asyncio.CancelledError:  # the caller gave up: its request is cancelled too
            held = outcome.record
            ctx = CallContext(method=method, job_id=held.job_id, token=token,
                              request_id=held.request_id, transport="inproc")  # fmt: skip
            self.core.abandon(held, ctx)
            raise
        if rec.status == "completed":
            if "value" in box:  # ran for this call: the servicer's own value
                return box["value"]
            assert rec.result_frame is not None  # an earlier run's (a keyed replay)
            return dssst1.loads(rec.result_frame)
        err = rec.error or {}
        code = str(err.get("code") or "internal")
        details = {
            k: v for k, v in (err.get("details") or {}).items() if k not in ("code", "message")
        }
        raise ProtocolError(code, str(err.get("message") or rec.status), **details)


async def cancel_request(
    core: ProtocolCore | None, ctx: CallContext, request_id: str
) -> dict[str, Any]:
    """The `cancel-request` operation: `CancelRequest` of `request_id` in the caller's job, run
    through the protocol core (which holds the request queue)."""
    if core is None:
        raise ProtocolError("unimplemented", "cancel-request needs the protocol core attached")
    call = IncomingCall(
        method=M.CANCEL_REQUEST,
        transport=ctx.transport,
        headers=ctx.headers,
        path_params={"job_id": ctx.job_id or "", "request_id": request_id},
    )
    outcome = await core.handle(call)
    return dict(outcome.value)
