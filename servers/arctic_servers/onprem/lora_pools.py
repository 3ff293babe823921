"""LoRA pools of the on-prem server (PROTOCOL.md §3.6; the rules both servers share are
`serving/lora_pools.py`).

A pool is two worker processes — a `LoraPoolTrainer` (DeepSpeed worker) and a `LoraPoolSampler`
(vLLM worker) holding the base model once each — started with its first job and shared by every
job whose pool key matches, up to the policy's adapter limit. A pooled job's sub-jobs have no
worker of their own: each gets a `TenantHandle`, its pool engine's worker with the job named in
every command (`tenant`), so the servicer calls it as any other worker. A job joins its pool with
`attach` (its adapter, optimizer, sampler slot) and leaves it with `detach` when it ends, which
frees its adapter only. Capacity: a pool holds its two slots while it runs, its jobs none.

An empty pool stays warm for `idle_seconds` (the next job joins in a second instead of starting
engines), then stops. A pool engine that dies fails every job in the pool (they shared it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..engines.config import SubJobSpec, canonical_model_name, resolve_model
from ..engines.worker.messages import ATTACH_CMD, DETACH_CMD, POOL_STATS_CMD
from ..engines.worker.procs import WorkerHandle
from ..rules.errors import ProtocolError
from ..rules.states import move_sub_job
from ..serving.lora_pools import (
    PoolBook,
    PoolPolicy,
    PoolRecord,
    pool_key,
)

if TYPE_CHECKING:
    from .jobs import Job, JobManager

log = logging.getLogger("arctic_servers.onprem")
ENGINES = (("training", "deepspeed"), ("sampling", "vllm"))
SLOTS = len(ENGINES)  # a pool holds a slot per engine


@dataclass
class Pool(PoolRecord):
    engines: dict[str, WorkerHandle] = field(default_factory=dict)
    model_dir: Path | None = None
    placed: bool = False  # holds its slots (from its first job's placement until it stops)
    starting: asyncio.Task[None] | None = None
    idle_timer: asyncio.TimerHandle | None = None
    failure: str = ""


class TenantHandle:
    """A pooled sub-job's worker: its pool engine's, with the job named in every command."""

    def __init__(self, worker: WorkerHandle, tenant: str, sub_job_id: str, info: Any) -> None:
        self.worker = worker
        self.tenant = tenant
        self.sub_job_id = sub_job_id
        self.info: dict[str, Any] = dict(info or {})
        self.detached = False

    @property
    def pid(self) -> int | None:
        return self.worker.pid

    @property
    def alive(self) -> bool:
        return self.worker.alive and not self.detached

    @property
    def threads(self) -> int:
        return self.worker.threads

    @property
    def logs(self) -> Any:
        return self.worker.logs  # the pool engine's output (it prints nothing of its tenants)

    async def call(self, cmd: str, **args: Any) -> Any:
        return await self.worker.call(cmd, tenant=self.tenant, **args)

    async def stream(self, cmd: str, **args: Any) -> AsyncIterator[dict[str, Any]]:
        async for item in self.worker.stream(cmd, tenant=self.tenant, **args):
            yield item

    async def stop(self, *, reason: str = "stopped", grace: float = 5.0) -> None:
        """The job ended: its adapter leaves the pool (the engine goes on for the others)."""
        if self.detached:
            return
        self.detached = True
        if self.worker.alive:
            with contextlib.suppress(ProtocolError, TimeoutError):
                await asyncio.wait_for(self.worker.call(DETACH_CMD, tenant=self.tenant), 60.0)


class PoolManager:
    def __init__(self, jobs: JobManager, policy: PoolPolicy) -> None:
        self.jobs = jobs
        self.policy = policy
        self.book: PoolBook[Pool] = PoolBook(policy, self._record, canonical_model_name)

    def _record(self, pool_id: str, key: dict[str, Any], max_adapters: int) -> Pool:
        return Pool(pool_id, key, max_adapters, self.policy.max_rank)

    # -- assignment and capacity --------------------------------------------------------------

    def assign(self, job_id: str, specs: Sequence[SubJobSpec]) -> str:
        """The pool the new job joins (its id), "" for a job with its own engines; raises
        `rate_limited` when its pool is full."""
        if not self.policy.enabled:
            return ""
        key, why = pool_key(specs, self.policy, canonical_model_name)
        if key is None:
            if specs and any(s.config.get("lora") for s in specs):
                log.info("job %s: own engines (%s)", job_id, why)
            return ""
        return self.book.reserve(job_id, key).pool_id

    def slots(self) -> int:
        return SLOTS * sum(1 for p in self.book.pools.values() if p.placed)

    def needs(self, job: Job) -> int:
        pool = self.book.of(job.job_id)
        return 0 if pool is not None and pool.placed else SLOTS

    def pool_of(self, job: Job) -> Pool | None:
        return self.book.of(job.job_id)

    # -- a job joins ----------------------------------------------------------------------------

    def place(self, job: Job) -> None:
        """The job was placed: its pool holds its slots from now (its engines start or run)."""
        pool = self.book.of(job.job_id)
        if pool is not None:
            pool.placed = True
            if pool.idle_timer is not None:
                pool.idle_timer.cancel()
                pool.idle_timer = None

    async def start(self, job: Job) -> None:
        """The pooled job's start: its pool's engines (started once, by its first job), then
        its adapter in each; running, or failed with the reason."""
        pool = self.book.of(job.job_id)
        if pool is None:
            self.jobs.end(job, "failed", "its LoRA pool is gone")
            return
        self.jobs._enter(job, "initializing", f"joining LoRA pool {pool.pool_id}")
        for sub in job.sub_jobs:
            move_sub_job(sub, "initializing")
        if pool.starting is None:
            pool.starting = asyncio.get_running_loop().create_task(self._boot(pool))
        try:
            await asyncio.shield(pool.starting)
            if job.terminal:  # cancelled while its pool started
                return
            await self._attach(job, pool)
        except Exception as exc:
            what = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
            for s in job.sub_jobs:
                if s.state not in ("failed",) and not job.terminal:
                    move_sub_job(s, "failed", what)
            self.jobs.end(job, "failed", f"LoRA pool {pool.pool_id}: {what}")
            return
        if job.terminal:  # cancelled while it joined
            await self.jobs._stop_workers(job, "stopped: the job ended while it started")
            return
        for s in job.sub_jobs:
            move_sub_job(s, "running", "")
        self.jobs._enter(job, "running", "")
        if job.lease_seconds:
            self.jobs._arm_lease(job, job.lease_seconds)

    async def _attach(self, job: Job, pool: Pool) -> None:
        for sub in job.sub_jobs:
            worker = pool.engines[sub.role]
            spec: dict[str, Any] = {"seed": sub.spec.seed}
            if sub.role == "training":
                spec["config"] = sub.spec.config
            else:
                spec["lora"] = job.lora
            info = await worker.call(ATTACH_CMD, tenant=job.job_id, spec=spec)
            sub.worker = TenantHandle(worker, job.job_id, sub.sub_job_id, info)
            sub.model_dir = pool.model_dir

    async def _boot(self, pool: Pool) -> None:
        """Start the pool's trainer and sampler (a failure fails every job waiting on it)."""
        pool.state = "starting"
        settings = self.jobs.settings
        key = pool.key
        try:
            pool.model_dir = await asyncio.to_thread(resolve_model, key["model"], settings)
            starts = []
            for role, kind in ENGINES:
                part = dict(key[role])
                threads = settings.threads.threads(role, part.pop("num_threads", 0) or None)
                w = self.jobs._take(role, kind, threads) or self.jobs._new_worker(
                    role, kind, threads
                )
                w.on_exit = lambda h, reason, role=role: self._engine_exited(pool, role, reason)
                pool.engines[role] = w
                spec = {
                    "role": role,
                    "engine": kind,
                    "model_dir": str(pool.model_dir),
                    "dtype": key["dtype"],
                    "seed": int(part.pop("seed", 0) or 0),
                    "config": {k: v for k, v in part.items() if v},
                    "sub_job_id": f"{pool.pool_id}:{role}:0",
                    "pool": {
                        "max_adapters": pool.max_adapters,
                        "max_rank": pool.max_rank,
                        "embeddings": self.policy.embeddings,
                    },
                }
                timeout = settings.worker_start_timeout_s
                starts.append(w.start(f"{pool.pool_id}:{role}:0", spec, timeout))
            self.jobs.refill_pool()
            await asyncio.gather(*starts)
        except BaseException as exc:
            pool.failure = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
            self._stop(pool, "failed")
            raise
        pool.state = "ready"
        log.info("LoRA pool %s ready (%s)", pool.pool_id, pool.base_model or "tiny")

    # -- a job leaves; a pool ends -------------------------------------------------------------

    def release(self, job: Job) -> None:
        """The job ended (its handles detach it): its place in the pool is free."""
        pool = self.book.release(job.job_id)
        if pool is None or pool.tenants or pool.state != "ready":
            if pool is not None and not pool.tenants and pool.state != "ready":
                self._stop(pool, "stopped")  # never started: nothing to keep warm
            return
        loop = asyncio.get_running_loop()
        pool.idle_timer = loop.call_later(self.policy.idle_seconds, self._idle, pool)

    def _idle(self, pool: Pool) -> None:
        pool.idle_timer = None
        if not pool.tenants and pool.live:
            idle = self.policy.idle_seconds
            log.info("LoRA pool %s: idle for %.0f s, stopped", pool.pool_id, idle)
            self._stop(pool, "stopped")

    def _engine_exited(self, pool: Pool, role: str, reason: str) -> None:
        if not pool.live:
            return  # stopped on purpose
        why = f"its LoRA pool's {role} engine failed: {reason}"
        pool.failure = why
        tenants = list(pool.tenants)
        self._stop(pool, "failed")
        for jid in tenants:
            job = self.jobs.jobs.get(jid)
            if job is not None and not job.terminal:
                for s in job.sub_jobs:
                    if s.role == role and s.state in ("running", "initializing"):
                        move_sub_job(s, "failed", why)
                self.jobs.end(job, "failed", why)

    def _stop(self, pool: Pool, state: str) -> None:
        pool.state = state
        if pool.idle_timer is not None:
            pool.idle_timer.cancel()
            pool.idle_timer = None
        engines = list(pool.engines.values())
        pool.placed = False
        if engines:
            self.jobs._spawn(self._stop_engines(engines, f"LoRA pool {pool.pool_id} {state}"))
        self.jobs._schedule()

    @staticmethod
    async def _stop_engines(engines: list[WorkerHandle], reason: str) -> None:
        await asyncio.gather(*(w.stop(reason=reason) for w in engines), return_exceptions=True)

    async def shutdown(self) -> None:
        for pool in list(self.book.pools.values()):
            if pool.live or pool.engines:
                pool.state = "stopped"
                await self._stop_engines(list(pool.engines.values()), "server shut down")

    async def views(self) -> list[dict[str, Any]]:
        """The admin view of the pools: state, jobs, and each engine's process and counters."""
        out = []
        for p in self.book.pools.values():
            engines = {}
            for role, w in p.engines.items():
                stats: Any = None
                if w.alive and p.state == "ready":
                    with contextlib.suppress(ProtocolError, TimeoutError):
                        stats = await asyncio.wait_for(w.call(POOL_STATS_CMD), 30.0)
                engines[role] = {"pid": w.pid, "alive": w.alive, "info": w.info, "stats": stats}
            out.append(
                {
                    "pool_id": p.pool_id,
                    "base_model": p.base_model,
                    "state": p.state,
                    "adapters": len(p.tenants),
                    "max_adapters": p.max_adapters,
                    "jobs": list(p.tenants),
                    "failure": p.failure,
                    "engines": engines,
                }
            )
        return out
