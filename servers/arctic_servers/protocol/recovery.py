"""What a server on a durable request store adds: restart recovery and the retention sweep (the
hand-off at shutdown is the request queue's, `execution.py`)."""

from __future__ import annotations

import time

from arctic_sdk.spec.tables import methods as M

from ..rules.errors import ProtocolError
from ..rules.states import move_request
from .context import CallContext
from .core_state import CoreState
from .execution import Execution


class Recovery:
    """Restart recovery and the retention sweep over one core's state and request queue."""

    def __init__(self, state: CoreState, execution: Execution) -> None:
        self.state = state
        self.execution = execution

    async def restore(self) -> dict[str, int]:
        """After a restart on a durable request store, take up the requests that had not ended.

        Sequence numbers that executed are marked done. A request that was pending runs from its
        stored body, in its sequence order. A request that was running is handed to the
        servicer with `ctx.recovered` set, when the servicer declares `recovers_running = True`
        (it then collects the outcome from its engine and never runs the request again);
        otherwise it fails with a reason. Call it once, before serving.
        """
        seq = self.state.sequencer()
        for job_id, seqs in self.state.requests.executed_seqs().items():
            seq.restore(job_id, seqs)
        counts = {"pending": 0, "running": 0, "failed": 0}
        recovers = self.state.servicer.recovers_running
        for rec in self.state.requests.unfinished():
            method = M.BY_NAME.get(rec.op)
            running = rec.status != "pending"
            reason = ""
            if method is None:
                reason = f"op {rec.op!r} is unknown to the restarted server"
            elif running and not recovers:
                reason = "the server restarted while the request was running; it is not run again"
            elif rec.body_frame is None:
                reason = "the server restarted and the request's body was not kept"
            if reason:
                move_request(rec, "failed")
                rec.error = ProtocolError("internal", reason, request_id=rec.request_id).body()[
                    "error"
                ]
                rec.body_frame = None
                self.state.requests.update(rec)
                if rec.seq is not None:
                    await seq.mark_done(rec.job_id, rec.seq)
                counts["failed"] += 1
                continue
            assert method is not None and rec.body_frame is not None
            body = self.state.decode(rec.body_frame)
            key_id = rec.identity if rec.identity_kind == "key" else None
            ctx = CallContext(
                method=method,
                job_id=rec.job_id,
                sub_job_id=rec.sub_job_id or None,
                request_id=rec.request_id,
                idempotency_key=key_id,
                seq=rec.seq,
                resumed=True,
                recovered=running,
            )
            self.execution.start(rec, method, ctx, body)
            counts["running" if running else "pending"] += 1
        return counts

    def sweep(self, now: float | None = None) -> int:
        """Drop results fetched more than `retention_seconds` ago (their records stay)."""
        now = time.time() if now is None else now
        n = self.state.requests.expire(now - self.state.config.limits.retention_seconds)
        if n:
            self.execution.forget_result_events()
        return n
