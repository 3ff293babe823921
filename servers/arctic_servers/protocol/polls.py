"""`GetRequest` and `CancelRequest`: a request's status and result events, and its cancellation."""

from __future__ import annotations

import re
import time

from arctic_sdk.spec.tables import methods as M

from ..rules.errors import ProtocolError
from .calls import IncomingCall, Outcome
from .context import CallContext
from .core_state import CoreState
from .execution import Execution

_CURSOR = re.compile(r"[0-9]{1,18}")  # cursors this server issues: event offsets


class Polls:
    """GetRequest and CancelRequest over one core's state and request queue."""

    def __init__(self, state: CoreState, execution: Execution) -> None:
        self.state = state
        self.execution = execution

    def poll(self, call: IncomingCall, ctx: CallContext) -> Outcome:
        body = self.state.params_body(call, dict(self.state.json_body(call)))
        self.state.validate(call.method, body)
        rec = self.state.record(ctx.job_id or "", str(body.get("request_id", "")))
        lim = self.state.config.limits
        cursor_raw = str(body.get("cursor") or "0")
        cursor = int(cursor_raw) if _CURSOR.fullmatch(cursor_raw) else -1
        if cursor < 0:
            raise ProtocolError(
                "invalid_argument",
                f"cursor {cursor_raw!r} is not a cursor this server issued",
                field="cursor",
            )
        max_events = int(body.get("max_events") or lim.default_max_events)
        max_events = max(1, min(max_events, lim.max_events))
        method = M.BY_NAME.get(rec.op, call.method)
        if rec.terminal and rec.fetched_at is None:
            self.state.requests.mark_fetched(rec.job_id, rec.request_id, time.time())
        return Outcome(200, method, record=rec, cursor=cursor, max_events=max_events)

    async def cancel(self, call: IncomingCall, ctx: CallContext) -> Outcome:
        body = self.state.params_body(call, dict(self.state.json_body(call)))
        self.state.validate(call.method, body)
        rec = self.state.record(ctx.job_id or "", str(body.get("request_id", "")))
        rec = await self.execution.cancel_record(rec, ctx)
        cancelled = rec.status == "cancelled"
        return Outcome(
            200,
            call.method,
            value={"request_id": rec.request_id, "cancelled": cancelled, "status": rec.status},
        )
