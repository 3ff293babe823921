"""`GetRequest` and `CancelRequest`: a request's status and result events, and its cancellation."""

from __future__ import annotations

import re
import time

from arctic_sdk.spec.tables import methods as M

from ..rules.errors import ProtocolError
from .calls import IncomingCall, Outcome
from .context import CallContext
from .execution import Execution

_CURSOR = re.compile(r"[0-9]{1,18}")  # cursors this server issues: event offsets


class Polls(Execution):
    def _poll(self, call: IncomingCall, ctx: CallContext) -> Outcome:
        body = self._params_body(call, dict(self._json_body(call)))
        self._validate(call.method, body)
        rec = self._record(ctx.job_id or "", str(body.get("request_id", "")))
        lim = self.config.limits
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
            self.requests.mark_fetched(rec.job_id, rec.request_id, time.time())
        return Outcome(200, method, record=rec, cursor=cursor, max_events=max_events)

    async def _cancel_request(self, call: IncomingCall, ctx: CallContext) -> Outcome:
        body = self._params_body(call, dict(self._json_body(call)))
        self._validate(call.method, body)
        rec = self._record(ctx.job_id or "", str(body.get("request_id", "")))
        rec = await self._cancel_record(rec, ctx)
        cancelled = rec.status == "cancelled"
        return Outcome(
            200,
            call.method,
            value={"request_id": rec.request_id, "cancelled": cancelled, "status": rec.status},
        )
