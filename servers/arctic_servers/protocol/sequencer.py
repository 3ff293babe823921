"""Per-job execution order by `X-Arctic-Seq` (PROTOCOL.md §7.2)."""

from __future__ import annotations

import asyncio

from .errors import ProtocolError


class Sequencer:
    """Request `n` of a job runs once `n - 1` has executed (completed, failed or cancelled).

    Sequence 1 starts a job's order. Unsequenced requests never wait.
    """

    def __init__(self, gap_timeout: float) -> None:
        self._gap_timeout = gap_timeout
        self._done: dict[str, set[int]] = {}
        self._cond = asyncio.Condition()

    def executed(self, job_id: str, seq: int) -> bool:
        return seq in self._done.get(job_id, set())

    def restore(self, job_id: str, seqs: set[int]) -> None:
        """Mark sequence numbers executed (after a restart, from the request store: the numbers
        of requests that ended and the ones refused for good, `RequestStore.refuse_seq`)."""
        self._done.setdefault(job_id, set()).update(seqs)

    async def wait_turn(self, job_id: str, seq: int) -> None:
        if seq <= 1:
            return

        def ready() -> bool:
            return (seq - 1) in self._done.get(job_id, set())

        async with self._cond:
            try:
                await asyncio.wait_for(self._cond.wait_for(ready), self._gap_timeout)
            except TimeoutError:
                raise ProtocolError(
                    "sequence_gap_timeout",
                    f"request with X-Arctic-Seq {seq} waited {self._gap_timeout:g} s for "
                    f"sequence {seq - 1}, which did not arrive",
                    seq=seq,
                    waiting_for=seq - 1,
                ) from None

    async def mark_done(self, job_id: str, seq: int) -> None:
        async with self._cond:
            self._done.setdefault(job_id, set()).add(seq)
            self._cond.notify_all()

    def forget_job(self, job_id: str) -> None:
        self._done.pop(job_id, None)
