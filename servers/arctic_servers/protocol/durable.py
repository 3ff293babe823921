"""What a server on a durable request store adds: restart recovery, hand-off at shutdown and the
retention sweep."""

from __future__ import annotations

import asyncio
import time

from arctic_sdk.spec.tables import methods as M

from ..rules.errors import ProtocolError
from ..rules.states import move_request
from .context import CallContext
from .execution import Execution


class Durable(Execution):
    async def restore(self) -> dict[str, int]:
        """After a restart on a durable request store, take up the requests that had not ended.

        Sequence numbers that executed are marked done. A request that was pending runs from its
        stored body, in its sequence order. A request that was running is handed to the
        servicer with `ctx.recovered` set, when the servicer declares `recovers_running = True`
        (it then collects the outcome from its engine and never runs the request again);
        otherwise it fails with a reason. Call it once, before serving.
        """
        seq = self._sequencer()
        for job_id, seqs in self.requests.executed_seqs().items():
            seq.restore(job_id, seqs)
        counts = {"pending": 0, "running": 0, "failed": 0}
        recovers = self.servicer.recovers_running
        for rec in self.requests.unfinished():
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
                self.requests.update(rec)
                if rec.seq is not None:
                    await seq.mark_done(rec.job_id, rec.seq)
                counts["failed"] += 1
                continue
            assert method is not None and rec.body_frame is not None
            body = self._decode(rec.body_frame)
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
            self._start(rec, method, ctx, body)
            counts["running" if running else "pending"] += 1
        return counts

    async def hand_off(self, timeout: float) -> int:
        """Graceful shutdown of a durable server: stop accepting, let running requests finish
        for up to `timeout` seconds, then stop waiting. What has not ended stays pending or
        running in the store for the next start (`restore`). Returns how many were handed off."""
        self.start_draining()
        pending = [t for k, t in self._tasks.items() if k not in self._started]
        self._handing_off = True
        for task in pending:
            task.cancel()
        running = [t for k, t in self._tasks.items() if k in self._started]
        if running:
            await asyncio.wait(running, timeout=timeout)
        left = [t for t in running if not t.done()]
        for task in left:
            task.cancel()
        if left or pending:
            await asyncio.gather(*left, *pending, return_exceptions=True)
        for event in self._done.values():  # callers waiting inline answer 202: poll after
            event.set()
        return len(left) + len(pending)

    def sweep(self, now: float | None = None) -> int:
        """Drop results fetched more than `retention_seconds` ago (their records stay)."""
        now = time.time() if now is None else now
        n = self.requests.expire(now - self.config.limits.retention_seconds)
        if n:
            self._events.clear()  # a cache of result chunks; rebuilt on demand
        return n
