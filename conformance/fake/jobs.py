"""Jobs of the fake gateway: states, sub-jobs, capacity, leases, and per-job training state.

States advance `pending → placing → initializing → running` on asyncio timers (`JobDelays`); a
zero delay moves on at once, inside the same call, but every state is still entered and recorded
in `Job.history`. Capacity is counted in GPUs (`n_gpus` of each sub-job config, default 1): a job
that does not fit waits in `pending` (FIFO) until another job ends.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from arctic_servers.protocol.errors import ProtocolError

TERMINAL = frozenset({"cancelled", "terminated", "failed"})
ROLES = {
    "training": "training",
    "sampling": "sampling",
    "log_prob": "log_prob",
    "log_probability": "log_prob",
}


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def role_of(value: Any) -> str | None:
    """ "training" / "TRAINING" / "SUB_JOB_TYPE_TRAINING" / "log_probability" -> role name."""
    if not isinstance(value, str):
        return None
    return ROLES.get(value.lower().removeprefix("sub_job_type_"))


@dataclass(frozen=True)
class JobDelays:
    """Seconds spent in each state before the next (zero = move on at once)."""

    placing: float = 0.0  # pending (with capacity) -> placing
    initializing: float = 0.0  # placing -> initializing
    running: float = 0.0  # initializing -> running


@dataclass
class SubJob:
    sub_job_id: str
    role: str
    index: int
    model_name: str
    n_gpus: int
    config: dict[str, Any]
    # NUMERICS.md §2: the step whose weights this sub-job serves (training: its own steps).
    model_step: int = 0

    @property
    def max_seq_len(self) -> int:
        return int(self.config.get("max_seq_len") or 0)


@dataclass
class Checkpoint:
    checkpoint_id: str
    checkpoint_type: str
    global_step: int
    model_step: int
    lr: float
    avg_loss: float
    created_at: float
    model_name: str


@dataclass
class Job:
    job_id: str
    owner: str | None
    sub_jobs: list[SubJob]
    labels: dict[str, str]
    comment: str
    experiment_name: str
    lease_seconds: int
    state: str = "pending"
    reason: str = ""
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    lease_expires: float = 0.0
    placed: bool = False  # capacity found (held until the job ends)
    history: list[dict[str, Any]] = field(default_factory=list)
    # Training state (NUMERICS.md §4).
    global_step: int = 0
    applied_steps: int = 0
    weight_version: int = 0
    lr: float = 1e-5
    grad: dict[int, float] = field(default_factory=dict)
    accum_loss: float = 0.0
    accum_tokens: int = 0
    last_loss: float = 0.0
    checkpoints: dict[str, Checkpoint] = field(default_factory=dict)
    execution_log: list[dict[str, Any]] = field(default_factory=list)

    @property
    def n_gpus(self) -> int:
        return sum(s.n_gpus for s in self.sub_jobs)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    def sub_job(self, role: str) -> SubJob | None:
        return next((s for s in self.sub_jobs if s.role == role), None)

    def find_sub_job(self, sub_job_id: str) -> SubJob | None:
        return next((s for s in self.sub_jobs if s.sub_job_id == sub_job_id), None)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "job_id": self.job_id,
            "state": self.state,
            "reason": self.reason,
            "sub_jobs": [
                {
                    "sub_job_id": s.sub_job_id,
                    "job_type": s.role,
                    "state": self.state,
                    "reason": self.reason,
                    "model_name": s.model_name,
                }
                for s in self.sub_jobs
            ],
            "labels": dict(self.labels),
            "comment": self.comment,
            "experiment_name": self.experiment_name,
            "created_at": rfc3339(self.created_at),
            "updated_at": rfc3339(self.updated_at),
            "lease_expires_at": rfc3339(self.lease_expires) if self.lease_expires else "",
            "global_step": self.global_step,
            "weight_version": self.weight_version,
        }
        return out


class JobManager:
    """All jobs of one fake gateway, with the capacity they hold."""

    def __init__(
        self,
        *,
        max_total_gpus: int = 64,
        delays: JobDelays | None = None,
        lease_default_seconds: int = 0,
        lease_max_seconds: int = 86_400,
    ) -> None:
        self.max_total_gpus = max_total_gpus
        self.delays = delays or JobDelays()
        self.lease_default_seconds = lease_default_seconds
        self.lease_max_seconds = lease_max_seconds
        self.jobs: dict[str, Job] = {}
        self._queue: list[str] = []
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._lease_timers: dict[str, asyncio.TimerHandle] = {}
        self._next = 1

    # ------------------------------------------------------------------ lookup

    def visible(self, job_id: str, token: str | None) -> Job:
        job = self.jobs.get(job_id)
        if job is None or (job.owner is not None and job.owner != token):
            raise ProtocolError(
                "job_not_found", f"no job {job_id!r} is visible to this token", job_id=job_id
            )
        return job

    def in_use(self) -> int:
        return sum(j.n_gpus for j in self.jobs.values() if j.placed and not j.terminal)

    def capacity(self) -> dict[str, Any]:
        used = self.in_use()
        return {
            "has_reservation": True,
            "max_total_gpus": self.max_total_gpus,
            "in_use_gpus": used,
            "available_gpus": max(0, self.max_total_gpus - used),
            "queued_jobs": len(self._queue),
        }

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
        counts: dict[str, int] = {}
        for s in sub_jobs:
            s.index = counts.get(s.role, 0)
            counts[s.role] = s.index + 1
            s.sub_job_id = f"{job_id}:{s.role}:{s.index}"
        job = Job(job_id, owner, sub_jobs, labels, comment, experiment_name, lease_seconds)
        train = job.sub_job("training")
        if train is not None:
            opt = train.config.get("optimizer")
            if isinstance(opt, dict) and isinstance(opt.get("lr"), int | float):
                job.lr = float(opt["lr"])
        self.jobs[job_id] = job
        self._enter(job, "pending", "")
        if lease_seconds:
            self._arm_lease(job, lease_seconds)
        self._queue.append(job_id)
        self._schedule()
        return job

    def _enter(self, job: Job, state: str, reason: str) -> None:
        job.state, job.reason = state, reason
        job.updated_at = time.time()
        job.history.append({"state": state, "reason": reason, "at": rfc3339(job.updated_at)})

    def _schedule(self) -> None:
        """Start queued jobs, FIFO, while they fit."""
        while self._queue:
            job = self.jobs.get(self._queue[0])
            if job is None or job.state != "pending":
                self._queue.pop(0)
                continue
            free = self.max_total_gpus - self.in_use()
            if job.n_gpus > free:
                job.reason = (
                    f"waiting for capacity: needs {job.n_gpus} GPUs, {max(free, 0)} "
                    f"of {self.max_total_gpus} available"
                )
                return
            self._queue.pop(0)
            job.placed, job.reason = True, ""
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
        self._enter(job, state, "")
        nxt = {"placing": "initializing", "initializing": "running"}.get(state)
        if nxt is not None:
            self._advance(job, nxt)

    def end(self, job: Job, state: str, reason: str) -> None:
        """Move a job to a terminal state and free its capacity."""
        for timers in (self._timers, self._lease_timers):
            handle = timers.pop(job.job_id, None)
            if handle is not None:
                handle.cancel()
        if job.job_id in self._queue:
            self._queue.remove(job.job_id)
        self._enter(job, state, reason)
        self._schedule()

    # ------------------------------------------------------------------ leases

    def check_lease(self, seconds: int, field_name: str) -> None:
        if seconds < 0 or seconds > self.lease_max_seconds:
            raise ProtocolError(
                "invalid_argument",
                f"field {field_name}: {seconds} is not in [0, {self.lease_max_seconds}]",
                field=field_name,
                expected=f"0..{self.lease_max_seconds}",
            )

    def _arm_lease(self, job: Job, seconds: int) -> None:
        old = self._lease_timers.pop(job.job_id, None)
        if old is not None:
            old.cancel()
        job.lease_seconds = seconds
        job.lease_expires = time.time() + seconds
        loop = asyncio.get_running_loop()
        self._lease_timers[job.job_id] = loop.call_later(seconds, self._lease_expired, job)

    def _lease_expired(self, job: Job) -> None:
        self._lease_timers.pop(job.job_id, None)
        if not job.terminal:
            self.end(job, "cancelled", "lease expired")

    def expire_lease(self, job: Job) -> None:
        """Admin: expire the lease now."""
        self._lease_expired(job)

    def renew(self, job: Job, seconds: int) -> str:
        if job.terminal:
            raise terminal_error(job)
        seconds = seconds or job.lease_seconds
        if seconds:
            self._arm_lease(job, seconds)
        return rfc3339(job.lease_expires) if job.lease_expires else ""

    # ------------------------------------------------------------------ reset

    def reset(self) -> None:
        for timers in (self._timers, self._lease_timers):
            for handle in timers.values():
                handle.cancel()
            timers.clear()
        self.jobs.clear()
        self._queue.clear()  # job ids keep counting: a stale id never names a new job


def terminal_error(job: Job) -> ProtocolError:
    return ProtocolError(
        "job_terminal",
        f"job {job.job_id} has ended ({job.state}: {job.reason or 'no reason'})",
        job_id=job.job_id,
        state=job.state,
        reason=job.reason,
    )


def not_running_error(job: Job) -> ProtocolError:
    return ProtocolError(
        "job_not_running",
        f"job {job.job_id} is {job.state}, not running",
        job_id=job.job_id,
        state=job.state,
        reason=job.reason,
    )
