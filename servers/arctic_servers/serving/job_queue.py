"""`JobQueue`: the part of a server's job manager every server shares (PROTOCOL.md §10).

Jobs by id; the owner check; capacity counted in units (GPUs or slots) with a first-in-first-out
queue of `pending` jobs that wait until theirs fit; and leases: a job with `lease_seconds` ends
`cancelled` (`lease expired`) unless `RenewJobLease` comes first. A server's manager extends it
with what a job's start and end mean there (timers, worker processes, a jobs table), through
the hooks `total`, `needs`, `waiting` and `place`, and calls `_unqueue` when a job ends.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any, Generic

from ..rules.jobs import (
    LEASE_EXPIRED,
    J,
    capacity,
    check_lease,
    rfc3339,
    terminal_error,
    visible_job,
)


class JobQueue(Generic[J]):
    # a lease that expires while the job starts waits for it to run (it is re-armed then)
    lease_from_running = False

    def __init__(self, lease_max_seconds: int) -> None:
        self.lease_max_seconds = lease_max_seconds
        self.jobs: dict[str, J] = {}
        self._queue: list[str] = []
        self._leases: dict[str, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task[Any]] = set()

    # ------------------------------------------------------------------ hooks

    def total(self) -> int:
        """Capacity units this server has."""
        raise NotImplementedError

    def needs(self, job: J) -> int:
        """Capacity units the job holds once placed."""
        raise NotImplementedError

    def place(self, job: J) -> None:
        """The job's capacity was found (`job.placed` is set): start it."""
        raise NotImplementedError

    def waiting(self, job: J, free: int) -> None:
        """The first queued job does not fit in `free` units: say why in its reason."""
        job.reason = (
            f"waiting for capacity: needs {self.needs(job)} GPUs, {max(free, 0)} "
            f"of {self.total()} available"
        )

    # ------------------------------------------------------------------ lookup and capacity

    def visible(self, job_id: str, owner: str | None) -> J:
        return visible_job(self.jobs, job_id, owner)

    def in_use(self) -> int:
        return sum(self.needs(j) for j in self.jobs.values() if j.placed and not j.terminal)

    def capacity(self) -> dict[str, Any]:
        return capacity(self.total(), self.in_use(), len(self._queue))

    # ------------------------------------------------------------------ queue

    def _schedule(self) -> None:
        """Start queued jobs, first in first out, while they fit."""
        while self._queue:
            job = self.jobs.get(self._queue[0])
            if job is None or job.state != "pending":
                self._queue.pop(0)
                continue
            free = self.total() - self.in_use()
            if self.needs(job) > free:
                self.waiting(job, free)
                return
            self._queue.pop(0)
            job.placed = True
            self.place(job)

    def _unqueue(self, job: J) -> None:
        """The job ends: its lease stops and it leaves the queue."""
        handle = self._leases.pop(job.job_id, None)
        if handle is not None:
            handle.cancel()
        if job.job_id in self._queue:
            self._queue.remove(job.job_id)

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def end(self, job: J, state: str, reason: str) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ leases

    def check_lease(self, seconds: int, field_name: str) -> None:
        check_lease(seconds, field_name, self.lease_max_seconds)

    def _arm_lease(self, job: J, seconds: int | None = None) -> None:
        """(Re)start the job's lease timer: `seconds` from now, or until `job.lease_expires`."""
        old = self._leases.pop(job.job_id, None)
        if old is not None:
            old.cancel()
        if seconds is not None:
            job.lease_seconds = seconds
            job.lease_expires = time.time() + seconds
        delay = max(0.0, job.lease_expires - time.time())
        loop = asyncio.get_running_loop()
        self._leases[job.job_id] = loop.call_later(delay, self._lease_expired, job)

    def _lease_expired(self, job: J) -> None:
        self._leases.pop(job.job_id, None)
        if self.lease_from_running and job.state in ("placing", "initializing"):
            return  # re-armed when the job is running
        if not job.terminal:
            self.end(job, "cancelled", LEASE_EXPIRED)

    def renewed(self, job: J) -> None:
        """Hook: the job's lease was renewed."""

    def renew(self, job: J, seconds: int) -> str:
        """`RenewJobLease`: the lease runs `seconds` (else its own length) from now."""
        if job.terminal:
            raise terminal_error(job)
        seconds = seconds or job.lease_seconds
        if seconds:
            self._arm_lease(job, seconds)
            self.renewed(job)
        return rfc3339(job.lease_expires) if job.lease_expires else ""
