"""Jobs of the on-prem server: sub-jobs as worker processes, states, capacity, leases.

A job moves `pending → placing → initializing → running` as its workers start (all of them at
once), or to `failed` when one does not. Any worker that dies later fails its sub-job and the job
(the reason names the sub-job, its exit status and its last output), and the job's other workers
are stopped. `CancelJob` and lease expiry stop every worker (a lease is re-armed when the job
reaches running, so a slow engine start-up does not eat it). Capacity is counted in slots (a
sub-job's `n_gpus`, 1 by default) against `ServerSettings.max_slots`; a job that does not fit
waits in `pending`, first in, first out. A training sub-job with `n_gpus` = W > 1 is one worker
(rank 0) that starts W - 1 rank processes of its own (`ranks.py`, `dp_training.py`).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..engines.config import SubJobSpec, cpu_count, engine_kind, resolve_model
from ..engines.worker.procs import WorkerHandle
from ..rules import jobs as pj
from ..rules.errors import ProtocolError
from ..rules.jobs import JobRecord, not_running_error, terminal_error
from ..rules.lora_config import adapter_sync, job_lora
from ..rules.states import move_sub_job
from ..serving.collective_sync import CollectiveSync
from ..serving.job_queue import JobQueue
from ..serving.lora_pools import syncs_adapter
from .lora_pools import PoolManager, TenantHandle
from .settings import ServerSettings

log = logging.getLogger("arctic_servers.onprem")


@dataclass
class SubJob:
    sub_job_id: str
    role: str
    index: int
    spec: SubJobSpec
    model_dir: Path | None = None
    state: str = "pending"
    reason: str = ""
    worker: WorkerHandle | TenantHandle | None = None
    weight_version: int = 0
    resumed: dict[str, Any] | None = None  # the checkpoint_path checkpoint it started from

    @property
    def engine(self) -> str:
        return str((self.worker.info if self.worker else {}).get("engine") or "")

    @property
    def model_name(self) -> str:
        return self.spec.model_name or (str(self.model_dir) if self.model_dir else "")


@dataclass
class Job(JobRecord[SubJob]):
    # generate waits while this is clear (a weight sync runs)
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    sync_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    weight_group: CollectiveSync | None = None  # built by its first collective sync
    pool: str = ""  # the LoRA pool its adapter trains and samples in ("": its own engines)

    @property
    def slots(self) -> int:
        return sum(s.spec.n_gpus for s in self.sub_jobs)

    @property
    def lora(self) -> dict[str, Any] | None:
        """The training sub-job's normalised `lora` (PROTOCOL.md §3.6); None: full weights."""
        return job_lora([(s.role, s.spec.config) for s in self.sub_jobs])

    @property
    def syncs_adapter(self) -> bool:
        """Its samplers load its adapter as versions (a pooled job's always do)."""
        return syncs_adapter(self.lora, bool(self.pool))

    def sub_job_json(self, sub: SubJob) -> dict[str, Any]:
        return pj.sub_job_json(sub.sub_job_id, sub.role, sub.state, sub.reason, sub.model_name)


class JobManager(JobQueue[Job]):
    # engines take seconds to minutes to start: the lease counts from running
    lease_from_running = True

    def __init__(self, settings: ServerSettings) -> None:
        super().__init__(settings.lease_max_seconds)
        self.settings = settings
        self._next_cpu = 0
        self._pool: dict[str, list[WorkerHandle]] = {}
        self.pools = PoolManager(self, settings.lora_pools)

    def total(self) -> int:
        return self.settings.max_slots

    def needs(self, job: Job) -> int:
        return self.pools.needs(job) if job.pool else job.slots

    def in_use(self) -> int:
        own = sum(j.slots for j in self.jobs.values() if j.placed and not j.terminal and not j.pool)
        return own + self.pools.slots()

    def waiting(self, job: Job, free: int) -> None:
        job.reason = f"waiting for capacity: needs {job.slots} slots, {max(free, 0)} free"

    # ------------------------------------------------------------------ lifecycle

    def create(
        self,
        owner: str | None,
        specs: list[SubJobSpec],
        *,
        labels: dict[str, str],
        comment: str,
        experiment_name: str,
        lease_seconds: int,
    ) -> Job:
        job_id = "job-" + secrets.token_hex(4)
        ids = pj.sub_job_ids(job_id, [spec.role for spec in specs])
        subs = [
            SubJob(sid, spec.role, idx, spec) for spec, (sid, idx) in zip(specs, ids, strict=True)
        ]
        job = Job(job_id, owner, subs, labels, comment, experiment_name, lease_seconds)
        job.gate.set()
        if sum(s.spec.n_gpus for s in subs) > self.settings.max_slots:
            raise ProtocolError(
                "invalid_argument",
                f"the job needs {job.slots} slots; this server has {self.settings.max_slots}",
                field="sub_job_configs",
                expected=f"<= {self.settings.max_slots} slots",
            )
        job.pool = self.pools.assign(job_id, specs)  # `rate_limited` when its pool is full
        self.jobs[job_id] = job
        self._enter(job, "pending", "")
        if lease_seconds:
            self._arm_lease(job, lease_seconds)
        self._queue.append(job_id)
        self._schedule()
        return job

    def _enter(self, job: Job, state: str, reason: str) -> None:
        job.enter(state, reason)
        log.info("job %s: %s %s", job.job_id, state, reason)

    def place(self, job: Job) -> None:
        self._enter(job, "placing", "")
        if job.pool:
            self.pools.place(job)
        self._spawn(self._start(job))

    def _cpus_for(self, n: int) -> list[int] | None:
        if not self.settings.threads.pin:
            return None
        total = cpu_count()
        cpus = [(self._next_cpu + i) % total for i in range(min(n, total))]
        self._next_cpu = (self._next_cpu + n) % total
        return cpus

    async def _start(self, job: Job) -> None:
        if job.pool:  # its adapter joins its LoRA pool's engines (lora_pools.py)
            await self.pools.start(job)
            return
        try:
            for sub in job.sub_jobs:
                sub.model_dir = await asyncio.to_thread(
                    resolve_model, sub.spec.model_name, self.settings
                )
        except ProtocolError as exc:
            self.end(job, "failed", f"model: {exc.message}")
            return
        except Exception as exc:
            self.end(job, "failed", f"model: {type(exc).__name__}: {exc}")
            return
        if job.terminal:
            return
        self._enter(job, "initializing", "")
        starts = []
        for sub in job.sub_jobs:
            move_sub_job(sub, "initializing")
            kind = engine_kind(sub.role, sub.spec.config)
            threads = self.settings.threads.threads(sub.role, sub.spec.config.get("num_threads"))
            spec = {
                "role": sub.role,
                "model_dir": str(sub.model_dir),
                "dtype": sub.spec.dtype,
                "seed": sub.spec.seed,
                "config": sub.spec.config,
                "engine": kind,
                "sub_job_id": sub.sub_job_id,
            }
            if adapter_sync(job.lora) and sub.role == "sampling":
                spec["lora"] = job.lora  # the sampler loads adapters (lora_sampler.py)
            worker = self._take(sub.role, kind, threads) or self._new_worker(
                sub.role, kind, threads
            )
            worker.on_exit = lambda h, reason, job=job: self._worker_exited(job, h, reason)
            sub.worker = worker
            starts.append(worker.start(sub.sub_job_id, spec, self.settings.worker_start_timeout_s))
        self.refill_pool()
        results = await asyncio.gather(*starts, return_exceptions=True)
        failed = [
            (s, r)
            for s, r in zip(job.sub_jobs, results, strict=True)
            if isinstance(r, BaseException)
        ]
        if job.terminal:  # cancelled while starting
            await self._stop_workers(job, "stopped: the job ended while it started")
            return
        if failed:
            for s, r in failed:
                if s.state == "failed":  # its worker's exit said so first (_worker_exited)
                    continue
                move_sub_job(s, "failed", getattr(r, "message", None) or f"{type(r).__name__}: {r}")
            first, _err = failed[0]
            self.end(job, "failed", f"sub-job {first.sub_job_id} failed to start: {first.reason}")
            return
        if not await self._resume_all(job):
            return
        for s in job.sub_jobs:
            move_sub_job(s, "running", "")
        self._enter(job, "running", "")
        if job.lease_seconds:
            # engines take seconds to minutes to start: the lease counts from running
            self._arm_lease(job, job.lease_seconds)

    async def _resume_all(self, job: Job) -> bool:
        """Training sub-jobs with a `checkpoint_path` resume from it before the job runs."""
        from .checkpoints import resume

        for s in job.sub_jobs:
            cp = s.spec.config.get("checkpoint_path") if s.role == "training" else None
            if not cp:
                continue
            try:
                s.resumed = await resume(s, Path(str(cp)))
            except Exception as exc:
                what = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
                if s.state != "failed":
                    move_sub_job(s, "failed", f"resume from checkpoint_path {cp}: {what}")
                self.end(job, "failed", f"sub-job {s.sub_job_id}: {s.reason}")
                return False
            if s.resumed:
                job.global_step = int(s.resumed.get("global_steps") or 0)
                log.info("job %s: %s resumed from %s", job.job_id, s.sub_job_id, s.resumed)
        return not job.terminal

    # ------------------------------------------------------------------ warm worker pool

    def _new_worker(self, role: str, kind: str, threads: int) -> WorkerHandle:
        return WorkerHandle(
            role,
            kind,
            python=self.settings.worker_python,
            threads=threads,
            cpus=self._cpus_for(threads),
            echo=self.settings.verbose_workers,
        )

    def _take(self, role: str, kind: str, threads: int) -> WorkerHandle | None:
        """A pooled worker of this engine whose libraries are (being) imported, if any."""
        pool = self._pool.get(kind) or []
        for w in list(pool):
            pool.remove(w)
            if w.failure is None and w.threads == threads and w.role_ok(role):
                w.role = role
                return w
            self._spawn(w.stop(reason="dropped from the pool"))
        return None

    def refill_pool(self) -> None:
        """Keep one idle worker per engine in `settings.prewarm` (its imports done ahead)."""
        for kind in self.settings.prewarm:
            pool = self._pool.setdefault(kind, [])
            pool[:] = [w for w in pool if w.failure is None]
            if not pool:
                role = {"deepspeed": "training", "vllm": "sampling"}.get(kind, "log_prob")
                w = self._new_worker(role, kind, self.settings.threads.threads(role))
                w.on_exit = lambda h, reason: None
                w.spawn()
                pool.append(w)

    def _worker_exited(self, job: Job, handle: WorkerHandle, reason: str) -> None:
        sub = job.find_sub_job(handle.sub_job_id)
        if sub is None or handle.stopping or job.terminal:
            return
        if sub.state in ("running", "initializing"):
            move_sub_job(sub, "failed", reason)
        if job.state in ("running", "initializing"):
            # while starting, too: the job fails now, not once its other engines have started
            self.end(job, "failed", f"sub-job {sub.sub_job_id} failed: {reason}")

    async def _stop_workers(self, job: Job, reason: str) -> None:
        await asyncio.gather(
            *(s.worker.stop(reason=reason) for s in job.sub_jobs if s.worker is not None),
            return_exceptions=True,
        )

    def end(self, job: Job, state: str, reason: str) -> None:
        """Move a job to a terminal state, stop its workers, free its slots."""
        if job.terminal:
            return
        self._unqueue(job)
        pj.end_sub_jobs(job.sub_jobs, state, reason)
        self._enter(job, state, reason)
        job.gate.set()
        self._spawn(self._end_workers(job, f"stopped: job {state}"))
        self._schedule()

    async def _end_workers(self, job: Job, reason: str) -> None:
        """Stop the job's workers (a pooled job's: detach its adapter), then free its pool
        place."""
        try:
            await self._stop_workers(job, reason)
        finally:
            if job.pool:
                self.pools.release(job)

    async def shutdown(self) -> None:
        await self.pools.shutdown()
        pooled = [w for ws in self._pool.values() for w in ws]
        self._pool.clear()
        await asyncio.gather(
            *(w.stop(reason="server shut down") for w in pooled), return_exceptions=True
        )
        for job in list(self.jobs.values()):
            if not job.terminal:
                self.end(job, "terminated", "server shut down")
        tasks = list(self._tasks)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        for job in self.jobs.values():
            await self._stop_workers(job, "server shut down")

    async def wait_running(self, job: Job, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while job.state != "running":
            if job.terminal:
                raise terminal_error(job)
            if time.monotonic() > deadline:
                raise not_running_error(job)
            await asyncio.sleep(0.05)
