"""Jobs of the fake gateway: states, capacity and leases (the per-job state: `engines/fake/state`).

States advance `pending → placing → initializing → running` on asyncio timers (`JobDelays`); a
zero delay moves on at once, inside the same call, but every state is still entered and recorded
in `Job.history`. Capacity is counted in GPUs (`n_gpus` of each sub-job config, default 1): a job
that does not fit waits in `pending` (FIFO) until another job ends.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from arctic_servers.engines.fake.state import Job, SubJob
from arctic_servers.rules import jobs as pj
from arctic_servers.serving.job_queue import JobQueue


@dataclass(frozen=True)
class JobDelays:
    """Seconds spent in each state before the next (zero = move on at once)."""

    placing: float = 0.0  # pending (with capacity) -> placing
    initializing: float = 0.0  # placing -> initializing
    running: float = 0.0  # initializing -> running


class JobManager(JobQueue[Job]):
    """All jobs of one fake gateway, with the capacity they hold."""

    def __init__(
        self,
        *,
        max_total_gpus: int = 64,
        delays: JobDelays | None = None,
        lease_default_seconds: int = 0,
        lease_max_seconds: int = 86_400,
    ) -> None:
        super().__init__(lease_max_seconds)
        self.max_total_gpus = max_total_gpus
        self.delays = delays or JobDelays()
        self.lease_default_seconds = lease_default_seconds
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._next = 1

    def total(self) -> int:
        return self.max_total_gpus

    def needs(self, job: Job) -> int:
        return job.n_gpus

    # ------------------------------------------------------------------ lifecycle

    def create(
        self,
        owner: str | None,
        sub_jobs: list[SubJob],
        *,
        labels: dict[str, str],
        comment: str,
        experiment_name: str,
        lease_seconds: int,
    ) -> Job:
        job_id = f"job-{self._next}"
        self._next += 1
        ids = pj.sub_job_ids(job_id, [s.role for s in sub_jobs])
        for s, (sid, index) in zip(sub_jobs, ids, strict=True):
            s.sub_job_id, s.index = sid, index
        job = Job(job_id, owner, sub_jobs, labels, comment, experiment_name, lease_seconds)
        self.jobs[job_id] = job
        job.enter("pending")
        if lease_seconds:
            self._arm_lease(job, lease_seconds)
        self._queue.append(job_id)
        self._schedule()
        return job

    def place(self, job: Job) -> None:
        job.reason = ""
        self._advance(job, "placing")

    def _advance(self, job: Job, state: str) -> None:
        """Enter `state` after its delay; chains through to running."""
        delay = getattr(self.delays, state)
        if delay > 0:
            loop = asyncio.get_running_loop()
            self._timers[job.job_id] = loop.call_later(delay, self._timer_fired, job, state)
        else:
            self._step_into(job, state)

    def _timer_fired(self, job: Job, state: str) -> None:
        self._timers.pop(job.job_id, None)
        if not job.terminal:
            self._step_into(job, state)

    def _step_into(self, job: Job, state: str) -> None:
        job.enter(state)
        nxt = {"placing": "initializing", "initializing": "running"}.get(state)
        if nxt is not None:
            self._advance(job, nxt)

    def end(self, job: Job, state: str, reason: str) -> None:
        """Move a job to a terminal state and free its capacity."""
        handle = self._timers.pop(job.job_id, None)
        if handle is not None:
            handle.cancel()
        self._unqueue(job)
        job.enter(state, reason)
        self._schedule()

    def expire_lease(self, job: Job) -> None:
        """Admin: expire the lease now."""
        self._lease_expired(job)

    # ------------------------------------------------------------------ reset

    def reset(self) -> None:
        for timers in (self._timers, self._leases):
            for handle in timers.values():
                handle.cancel()
            timers.clear()
        self.jobs.clear()
        self._queue.clear()  # job ids keep counting: a stale id never names a new job
