"""The gateway's jobs: states, capacity, queue, leases, worker start and stop, restart recovery.

A job moves `pending → placing → initializing → running`: it waits in `pending` (FIFO, with a
reason) until its GPUs fit, holds them from `placing` (its workers are launched) until its
workers have stopped, enters `initializing` once every worker listens and `running` once every
engine is ready. It ends `cancelled` (CancelJob, or its lease expired), `terminated` or `failed`
(a worker that did not start or died; the reason names the sub-job, the exit and its last
output); ending stops its workers and frees its GPUs for the next queued job. Every change is in
the jobs table before anyone is told. After a restart, running jobs re-attach to their workers,
starting jobs go on starting, queued jobs queue again, and leases run on from where they were.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..protocol import faultpoints
from ..rules import jobs as pj
from ..rules.errors import ProtocolError
from ..rules.jobs import terminal_error
from ..rules.states import move_sub_job
from ..serving.job_queue import JobQueue
from .lora import engine_spec as lora_spec
from .lora_pools import PoolManager, TenantClient
from .model import Job, JobStore, SubJob
from .profiles import Profile
from .settings import GatewaySettings
from .supervisor import Supervisor
from .workers import WorkerClient

log = logging.getLogger("arctic_servers.gateway")
WATCH_INTERVAL_S = 0.5


class JobManager(JobQueue[Job]):
    def __init__(
        self,
        settings: GatewaySettings,
        store: JobStore,
        supervisor: Supervisor,
        profile: Profile,
    ) -> None:
        super().__init__(settings.lease_max_seconds)
        self.settings = settings
        self.store = store
        self.supervisor = supervisor
        self.profile = profile
        self.on_end: list[Callable[[Job], None]] = []
        self._watch: asyncio.Task[None] | None = None
        self.pools = PoolManager(self, settings.lora_pools)

    # ------------------------------------------------------------------ lookup and capacity

    def total(self) -> int:
        return self.settings.max_total_gpus

    def needs(self, job: Job) -> int:
        return self.pools.needs(job) if job.pool else job.n_gpus

    def in_use(self) -> int:
        # a job holds its GPUs from placing until its workers have stopped, ended or not; a
        # LoRA pool holds its workers' while it runs, its jobs none
        own = sum(j.n_gpus for j in self.jobs.values() if j.placed and not j.pool)
        return own + self.pools.gpus()

    def save(self, job: Job) -> None:
        self.store.put(job)

    # ------------------------------------------------------------------ create and schedule

    def find_created(self, owner: str, key: str) -> Job | None:
        return next(
            (j for j in self.jobs.values() if key and j.owner == owner and j.create_key == key),
            None,
        )

    def create(self, owner: str, body: Mapping[str, Any], subs: list[SubJob], key: str = "") -> Job:
        total = sum(s.n_gpus for s in subs)
        if total > self.settings.max_total_gpus:
            raise ProtocolError(
                "invalid_argument",
                f"field sub_job_configs: the job needs {total} GPUs in all; this gateway has "
                f"{self.settings.max_total_gpus}, so it could never run",
                field="sub_job_configs",
                expected=f"<= {self.settings.max_total_gpus} GPUs in all",
            )
        job_id = "job-" + secrets.token_hex(6)
        ids = pj.sub_job_ids(job_id, [s.role for s in subs])
        for s, (sid, index) in zip(subs, ids, strict=True):
            s.sub_job_id, s.index = sid, index
        lease = int(body.get("lease_seconds") or 0) or self.settings.lease_default_seconds
        job = Job(
            job_id=job_id,
            owner=owner,
            sub_jobs=subs,
            labels={str(k): str(v) for k, v in (body.get("labels") or {}).items()},
            comment=str(body.get("comment") or ""),
            experiment_name=str(body.get("experiment_name") or ""),
            lease_seconds=lease,
            create_key=key,
        )
        job.pool = self.pools.assign(job_id, subs)  # `rate_limited` when its pool is full
        job.enter("pending")
        if lease:
            job.lease_expires = time.time() + lease
        self.jobs[job_id] = job
        self._queue.append(job_id)
        self.save(job)  # on disk before CreateJob answers
        faultpoints.hit("job_recorded")
        if lease:
            self._arm_lease(job)
        self._schedule()
        return job

    def waiting(self, job: Job, free: int) -> None:
        total = self.settings.max_total_gpus
        job.reason = (
            f"waiting for capacity: needs {job.n_gpus} GPUs, {max(free, 0)} of {total} "
            f"free; first in the queue of {len(self._queue)}"
        )
        for i, jid in enumerate(self._queue[1:], start=2):
            other = self.jobs.get(jid)
            if other is not None:
                other.reason = (
                    f"waiting for capacity: needs {other.n_gpus} GPUs; position {i} of "
                    f"{len(self._queue)} in the queue"
                )

    def place(self, job: Job) -> None:
        job.enter("placing")
        for s in job.sub_jobs:
            move_sub_job(s, "placing")
        if job.pool:
            self.pools.place(job)
        self.save(job)
        self._spawn(self._start(job))

    async def _start(self, job: Job) -> None:
        if job.pool:  # its adapter joins its LoRA pool's workers (lora_pools.py)
            await self.pools.start(job)
            return
        try:
            missing = [s for s in job.sub_jobs if not s.worker]
            for s in missing:
                await self.supervisor.discard_unrecorded(job, s)
            launched = await asyncio.gather(
                *(
                    self.supervisor.launch(job, s, lora_spec(job, s, self.profile.engine_spec(s)))
                    for s in missing
                ),
                return_exceptions=True,
            )
            for sub, rec in zip(missing, launched, strict=True):
                if isinstance(rec, dict):
                    sub.worker = rec
            self.save(job)  # the workers' records, before anything else can fail
            errors = [r for r in launched if isinstance(r, BaseException)]
            if job.terminal:  # ended while its workers launched: stop the ones that did
                if missing:
                    await self._release(job)
                return
            if errors:
                raise errors[0]
            if job.state == "placing":
                job.enter("initializing")
                for s in job.sub_jobs:
                    move_sub_job(s, "initializing")
                self.save(job)
            timeout = self.settings.worker_start_timeout_s
            infos = await asyncio.gather(
                *(self.supervisor.wait_ready(s, timeout) for s in job.sub_jobs)
            )
        except ProtocolError as exc:
            self.end(job, "failed", exc.message)
            return
        except Exception as exc:
            log.exception("job %s failed to start", job.job_id)
            self.end(job, "failed", f"start failed: {type(exc).__name__}: {exc}")
            return
        if job.terminal:
            return
        for s, info in zip(job.sub_jobs, infos, strict=True):
            s.worker["info"] = info
            move_sub_job(s, "running", "")
        job.enter("running")
        self.save(job)

    # ------------------------------------------------------------------ workers

    async def client(self, sub: SubJob) -> WorkerClient | TenantClient:
        if sub.worker.get("pool"):
            return await self.pools.client(sub)
        client = self.supervisor.client(sub)
        if client is not None and client.failure is None and client.stopping is None:
            return client
        if not sub.worker:
            raise ProtocolError("unavailable", f"sub-job {sub.sub_job_id} has no worker yet")
        return await self.supervisor.attach(sub)

    def _check_workers(self) -> None:
        for job in list(self.jobs.values()):
            if job.state not in ("initializing", "running"):
                continue
            if job.pool:
                continue  # its pool's workers are watched as the pool's (`pools.check`)
            for sub in job.sub_jobs:
                why = self.supervisor.gone(sub) if sub.worker else None
                if why is not None:
                    self.supervisor.events["lost"] += 1
                    move_sub_job(sub, "failed", why)
                    self.end(job, "failed", f"sub-job {sub.sub_job_id} failed: {why}")
                    break

    async def _watch_loop(self) -> None:
        while True:
            await asyncio.sleep(WATCH_INTERVAL_S)
            try:
                self._check_workers()
                self.pools.check()
            except Exception:
                log.exception("worker watch failed")

    # ------------------------------------------------------------------ end

    def end(self, job: Job, state: str, reason: str) -> None:
        """Move a job to a terminal state, stop its workers, then free its GPUs."""
        if job.terminal:
            return
        self._unqueue(job)
        pj.end_sub_jobs(job.sub_jobs, state, reason)
        job.enter(state, reason)
        self.save(job)
        log.info("job %s: %s (%s)", job.job_id, state, reason)
        for fn in self.on_end:
            fn(job)
        self._spawn(self._release(job))
        self._schedule()

    async def _release(self, job: Job) -> None:
        if job.pool:  # its adapter leaves the pool; the pool's workers go on
            with contextlib.suppress(Exception):
                await self.pools.release(job)
        else:
            error = terminal_error(job)
            await asyncio.gather(
                *(self.supervisor.stop(s, error) for s in job.sub_jobs if s.worker),
                return_exceptions=True,
            )
        job.placed = False
        self.save(job)
        self._schedule()

    # ------------------------------------------------------------------ leases

    def renewed(self, job: Job) -> None:
        job.updated_at = time.time()
        self.save(job)

    # ------------------------------------------------------------------ start and stop

    async def restore(self) -> dict[str, int]:
        """Load every job; re-attach running ones to their workers (fail those whose worker is
        gone), go on starting the ones that were starting, queue the pending ones again."""
        counts = {"running": 0, "starting": 0, "pending": 0, "failed": 0}
        for job in self.store.all():
            self.jobs[job.job_id] = job
        await self.pools.restore()  # before the jobs: a pooled job finds its pool
        grace = self.settings.lease_restart_grace_s
        for job in self.jobs.values():
            if job.terminal:
                if job.placed:  # the previous gateway stopped while it stopped the workers
                    self._spawn(self._release(job))
                continue
            if job.lease_expires:
                job.lease_expires = max(job.lease_expires, time.time() + grace)
                self._arm_lease(job)
            if job.state == "pending":
                self._queue.append(job.job_id)
                counts["pending"] += 1
            elif job.state == "running":
                try:
                    for sub in job.sub_jobs:
                        await self.client(sub)  # its worker (or its pool's), connected
                        self.supervisor.events["reattached"] += 1
                    counts["running"] += 1
                except ProtocolError as exc:
                    self.supervisor.events["lost"] += 1
                    self.end(job, "failed", f"after a gateway restart: {exc.message}")
                    counts["failed"] += 1
            else:
                self._spawn(self._start(job))
                counts["starting"] += 1
        self._schedule()
        self._watch = asyncio.get_running_loop().create_task(self._watch_loop())
        return counts

    async def shutdown(self) -> None:
        """The gateway stops: timers stop; workers keep running for the next gateway."""
        if self._watch is not None:
            self._watch.cancel()
        self.pools.shutdown()
        for handle in self._leases.values():
            handle.cancel()
        self._leases.clear()
        for task in list(self._tasks):
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.supervisor.close()
