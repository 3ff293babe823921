"""Per-job execution order by `X-Arctic-Seq` (PROTOCOL.md §7.2)."""

from __future__ import annotations

import asyncio
import contextlib

from ..rules.errors import ProtocolError


class Sequencer:
    """Request `n` of a job runs once `n - 1` has executed (completed, failed or cancelled).

    Sequence 1 starts a job's order. Unsequenced requests never wait. Requests of ops the method
    table marks `concurrent` (they read the weights and change nothing: generate, log-probs,
    forward) run together when their numbers are consecutive: such a request starts as soon as
    `n - 1` has executed *or* is a concurrent request that has started, and the next request of
    any other op waits until every earlier concurrent one has executed. A generate after a step
    or a weight sync still sees its effect; the generates between two steps share the batch.
    """

    def __init__(self, gap_timeout: float) -> None:
        self._gap_timeout = gap_timeout
        self._done: dict[str, set[int]] = {}
        self._arrived: dict[str, set[int]] = {}  # waiting or running, not yet executed
        self._running: dict[str, set[int]] = {}  # concurrent requests started, not executed
        self._cond = asyncio.Condition()

    def executed(self, job_id: str, seq: int) -> bool:
        return seq in self._done.get(job_id, set())

    def restore(self, job_id: str, seqs: set[int]) -> None:
        """Mark sequence numbers executed (after a restart, from the request store: the numbers
        of requests that ended and the ones refused for good, `RequestStore.refuse_seq`)."""
        self._done.setdefault(job_id, set()).update(seqs)

    def _ready(self, job_id: str, seq: int, concurrent: bool) -> bool:
        done = self._done.get(job_id, set())
        running = self._running.get(job_id, set())
        if concurrent:
            return (seq - 1) in done or (seq - 1) in running
        return (seq - 1) in done and not any(s < seq for s in running)

    def _here(self, job_id: str, seq: int) -> bool:
        return seq in self._done.get(job_id, set()) or seq in self._arrived.get(job_id, set())

    async def wait_turn(self, job_id: str, seq: int, concurrent: bool = False) -> None:
        """Wait until request `seq` may run. The gap timeout runs only while `seq - 1` has not
        arrived: once it is here, waiting for it (and a run of concurrent requests) to execute
        takes as long as they take."""
        async with self._cond:
            self._arrived.setdefault(job_id, set()).add(seq)
            self._cond.notify_all()  # a request waiting for this number stops its timer
            if seq > 1:
                await self._wait(job_id, seq, concurrent)
            if concurrent:
                self._running.setdefault(job_id, set()).add(seq)
                self._cond.notify_all()  # the next concurrent number may start now

    async def _wait(self, job_id: str, seq: int, concurrent: bool) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._gap_timeout
        while not self._ready(job_id, seq, concurrent):
            if self._here(job_id, seq - 1):
                await self._cond.wait()
                continue
            left = deadline - loop.time()
            if left <= 0:
                raise ProtocolError(
                    "sequence_gap_timeout",
                    f"request with X-Arctic-Seq {seq} waited {self._gap_timeout:g} s for "
                    f"sequence {seq - 1}, which did not arrive",
                    seq=seq,
                    waiting_for=seq - 1,
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._cond.wait(), left)

    async def mark_started(self, job_id: str, seq: int, concurrent: bool) -> None:
        """A request that runs without waiting its turn (recovered after a restart) started."""
        async with self._cond:
            self._arrived.setdefault(job_id, set()).add(seq)
            if concurrent:
                self._running.setdefault(job_id, set()).add(seq)
            self._cond.notify_all()

    async def mark_done(self, job_id: str, seq: int) -> None:
        async with self._cond:
            self._done.setdefault(job_id, set()).add(seq)
            self._arrived.get(job_id, set()).discard(seq)
            self._running.get(job_id, set()).discard(seq)
            self._cond.notify_all()

    def forget_job(self, job_id: str) -> None:
        for table in (self._done, self._arrived, self._running):
            table.pop(job_id, None)
