"""LoRA pools of the Cortex gateway (PROTOCOL.md §3.6; the rules both servers share are
`serving/lora_pools.py`, the pool engines `engines/deepspeed/lora_pool_trainer.py` and
`engines/vllm/lora_pool_sampler.py`).

A pool is two worker hosts — a trainer and a sampler over one copy of the base model — launched
by the supervisor like a sub-job's (they outlive the gateway), started with the pool's first job
and shared by every job of its key up to the adapter limit. Each pooled sub-job's worker record
names its pool and tenant (`{"pool", "tenant", "backend", "pid", "log", "info"}`, and where
the pool's worker runs: `address`, Ray's `node` / `node_id`); its calls go to the
pool engine's worker through a `TenantClient`, which names the tenant in every command, with
the gateway's usual keyed calls (the journal of a pool's worker host holds every tenant's calls,
collected by key after a restart, never run twice).

Durability: every pool is a row of the gateway's state file (`lora_pools`: key, state, its
engines' worker records, when it went idle) written before it is acted on, and a tenant's
`attach` / `detach` are keyed calls, so a gateway that restarts at any point re-attaches to the
same pool workers, finishes a start or a detach it had begun, and rebuilds who is in which pool
from its jobs. A pool engine that dies fails the pool's jobs (they shared it); an empty pool
stays warm `idle_seconds`, then its workers stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ..engines.worker.messages import ATTACH_CMD, DETACH_CMD, TENANT_ARG
from ..rules.errors import ProtocolError
from ..rules.states import move_sub_job
from ..serving.lora_pools import (
    PoolBook,
    PoolPolicy,
    PoolRecord,
    pool_key,
)
from .model import Job, SubJob
from .workers import WorkerClient

if TYPE_CHECKING:
    from .jobs import JobManager

log = logging.getLogger("arctic_servers.gateway")
ROLES = ("training", "sampling")


@dataclass
class Pool(PoolRecord):
    engines: dict[str, SubJob] = field(default_factory=dict)  # role -> its worker's record
    placed: bool = False  # holds its GPUs (from its first job's placement until it stops)
    failure: str = ""

    @property
    def job_id(self) -> str:
        """Where the supervisor keeps its workers' files (a job's run directory)."""
        return self.pool_id

    def to_doc(self) -> dict[str, Any]:
        doc = {k: v for k, v in self.doc().items() if k != "engines"}
        doc["engines"] = {r: asdict(s) for r, s in self.engines.items()}
        return doc

    @staticmethod
    def from_doc(doc: Mapping[str, Any]) -> Pool:
        d = dict(doc)
        engines = {r: SubJob(**s) for r, s in dict(d.pop("engines") or {}).items()}
        return Pool(**d, engines=engines)


class TenantClient:
    """A pooled sub-job's worker client: its pool engine's, with the job named in every
    command (the gateway's keyed calls, streams, collection and cancellation as they are)."""

    def __init__(self, client: WorkerClient, tenant: str) -> None:
        self.client = client
        self.tenant = tenant

    @property
    def failure(self) -> str | None:
        return self.client.failure

    @property
    def stopping(self) -> ProtocolError | None:
        return self.client.stopping

    async def call(
        self, cmd: str, args: dict[str, Any], *, key: str | None = None, meta: Any = None
    ) -> Any:
        return await self.client.call(cmd, {**args, TENANT_ARG: self.tenant}, key=key, meta=meta)

    async def stream(
        self, args: dict[str, Any], *, meta: Any = None
    ) -> AsyncIterator[dict[str, Any]]:
        async for item in self.client.stream({**args, TENANT_ARG: self.tenant}, meta=meta):
            yield item

    async def collect(self, key: str) -> Any:
        return await self.client.collect(key)

    async def cancel(self, key: str) -> dict[str, Any]:
        return await self.client.cancel(key)

    async def stats(self) -> dict[str, Any]:
        """This tenant's counters of the pool engine (never another tenant's)."""
        stats = await self.client.stats()
        return dict((stats.get("tenants") or {}).get(self.tenant) or {})

    async def logs(self, cursor: int, limit: int) -> dict[str, Any]:
        return await self.client.logs(cursor, limit)


class PoolManager:
    def __init__(self, jobs: JobManager, policy: PoolPolicy) -> None:
        self.jobs = jobs
        self.policy = policy
        from ..engines.config import canonical_model_name  # torch-free

        self.book: PoolBook[Pool] = PoolBook(policy, self._record, canonical_model_name)
        self._starting: dict[str, asyncio.Task[None]] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def _record(self, pool_id: str, key: dict[str, Any], max_adapters: int) -> Pool:
        return Pool(pool_id, key, max_adapters, self.policy.max_rank)

    def save(self, pool: Pool) -> None:
        self.jobs.store.put_pool(pool.pool_id, pool.to_doc())

    # -- assignment and capacity --------------------------------------------------------------

    def key_of(self, subs: Sequence[SubJob]) -> dict[str, Any] | None:
        if not self.policy.enabled or self.jobs.profile.name != "onprem":
            return None
        from ..engines.config import canonical_model_name

        key, why = pool_key(subs, self.policy, canonical_model_name)
        if key is None and any(s.config.get("lora") for s in subs):
            log.info("LoRA job with its own workers: %s", why)
        return key

    def assign(self, job_id: str, subs: Sequence[SubJob]) -> str:
        """The pool the new job joins ("": its own workers); `rate_limited` when it is full."""
        key = self.key_of(subs)
        if key is None:
            return ""
        pool = self.book.reserve(job_id, key)
        self.save(pool)  # before the job is recorded: a restart finds its pool
        return pool.pool_id

    def gpus(self) -> int:
        return sum(len(ROLES) for p in self.book.pools.values() if p.placed)

    def needs(self, job: Job) -> int:
        pool = self.book.of(job.job_id)
        return 0 if pool is not None and pool.placed else len(ROLES)

    def place(self, job: Job) -> None:
        pool = self.book.of(job.job_id)
        if pool is not None:
            pool.placed = True
            pool.idle_since = 0.0
            timer = self._timers.pop(pool.pool_id, None)
            if timer is not None:
                timer.cancel()
            self.save(pool)

    # -- a job joins ----------------------------------------------------------------------------

    async def start(self, job: Job) -> None:
        """A pooled job's start (again after a restart): its pool's workers, then its adapter
        in each (keyed: an attach the previous gateway sent is collected, not run twice)."""
        pool = self.book.of(job.job_id)
        if pool is None:
            self.jobs.end(job, "failed", "its LoRA pool is gone")
            return
        try:
            if job.state == "placing":
                job.enter("initializing", f"joining LoRA pool {pool.pool_id}")
                for s in job.sub_jobs:
                    move_sub_job(s, "initializing")
                self.jobs.save(job)
            await self._started(pool)
            if job.terminal:
                return
            for sub in job.sub_jobs:
                await self._attach(job, sub, pool)
            self.jobs.save(job)
        except ProtocolError as exc:
            self.jobs.end(job, "failed", f"LoRA pool {pool.pool_id}: {exc.message}")
            return
        except Exception as exc:
            log.exception("job %s failed to join its pool", job.job_id)
            self.jobs.end(job, "failed", f"LoRA pool {pool.pool_id}: {type(exc).__name__}: {exc}")
            return
        if job.terminal:
            return
        for s in job.sub_jobs:
            move_sub_job(s, "running", "")
        job.enter("running")
        self.jobs.save(job)

    async def _attach(self, job: Job, sub: SubJob, pool: Pool) -> None:
        engine = pool.engines[sub.role]
        client = await self._client(engine)
        spec: dict[str, Any] = {"seed": sub.seed}
        if sub.role == "training":
            spec["config"] = sub.config
        else:
            from .lora import lora_of

            spec["lora"] = lora_of(job)
        args = {"spec": spec, TENANT_ARG: job.job_id}
        info = await client.call(ATTACH_CMD, args, key=f"attach/{sub.sub_job_id}", meta={})
        w = engine.worker
        sub.worker = {
            "pool": pool.pool_id,
            "tenant": job.job_id,
            "backend": w.get("backend", "local"),
            "pid": w.get("pid"),  # the pool worker's (the admin view; never signalled for a job)
            # where it runs (its host, its Ray node): the sync's placement reads them
            **{k: w[k] for k in ("address", "node", "node_id") if k in w},
            "log": w.get("log", ""),
            "info": {**dict(w.get("info") or {}), **dict(info or {})},
        }

    async def _started(self, pool: Pool) -> None:
        if pool.state == "ready":
            return
        if pool.state not in ("new", "starting"):
            raise ProtocolError("sub_job_failed", f"the pool {pool.state}: {pool.failure}")
        task = self._starting.get(pool.pool_id)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._boot(pool))
            self._starting[pool.pool_id] = task
        await asyncio.shield(task)

    async def _boot(self, pool: Pool) -> None:
        """Launch (or, after a restart, find) the pool's two workers; wait for their engines."""
        sup, profile = self.jobs.supervisor, self.jobs.profile
        try:
            pool.state = "starting"
            for role in ROLES:
                if role not in pool.engines:
                    pool.engines[role] = self._engine_sub(pool, role)
            self.save(pool)
            missing = [s for s in pool.engines.values() if not s.worker]
            for s in missing:
                await sup.discard_unrecorded(pool, s)
            for s in missing:
                spec = {**profile.engine_spec(s), "pool": self._pool_spec(pool)}
                s.worker = await sup.launch(pool, s, spec)
                self.save(pool)
            timeout = self.jobs.settings.worker_start_timeout_s
            infos = await asyncio.gather(
                *(sup.wait_ready(s, timeout) for s in pool.engines.values())
            )
            for s, info in zip(pool.engines.values(), infos, strict=True):
                s.worker["info"] = info
            pool.state = "ready"
            self.save(pool)
            log.info("LoRA pool %s ready (%s)", pool.pool_id, pool.base_model or "tiny")
        except BaseException as exc:
            msg = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
            self._fail(pool, f"its LoRA pool's workers did not start: {msg}")
            raise
        finally:
            self._starting.pop(pool.pool_id, None)

    def _engine_sub(self, pool: Pool, role: str) -> SubJob:
        key = pool.key
        part = dict(key[role])
        config = {k: v for k, v in part.items() if k not in ("seed",) and v}
        return SubJob(
            sub_job_id=f"{pool.pool_id}:{role}:0",
            role=role,
            index=0,
            model_name=str(key["model"]),
            config=config,
            dtype=str(key["dtype"]),
            seed=int(part.get("seed") or 0),
        )

    def _pool_spec(self, pool: Pool) -> dict[str, Any]:
        return {
            "max_adapters": pool.max_adapters,
            "max_rank": pool.max_rank,
            "embeddings": self.policy.embeddings,
        }

    async def _client(self, engine: SubJob) -> WorkerClient:
        client = self.jobs.supervisor.client(engine)
        if client is not None and client.failure is None and client.stopping is None:
            return client
        return await self.jobs.supervisor.attach(engine)

    async def client(self, sub: SubJob) -> TenantClient:
        """The pooled sub-job's client (its pool engine's worker, naming its tenant)."""
        pool = self.book.pools.get(str(sub.worker.get("pool") or ""))
        if pool is None or pool.state != "ready" or sub.role not in pool.engines:
            why = pool.failure if pool is not None else "it is gone"
            raise ProtocolError(
                "sub_job_failed",
                f"sub-job {sub.sub_job_id}: its LoRA pool is not running ({why})",
                sub_job_id=sub.sub_job_id,
            )
        return TenantClient(await self._client(pool.engines[sub.role]), str(sub.worker["tenant"]))

    # -- a job leaves; a pool ends -------------------------------------------------------------

    async def release(self, job: Job) -> None:
        """The job ended: its adapter leaves its pool (keyed detach), its place frees."""
        pool = self.book.pools.get(job.pool)
        if pool is None or not pool.live:
            return  # the pool failed or stopped: nothing of the job is left in it
        if pool.state == "ready":
            for sub in job.sub_jobs:
                if sub.worker.get("pool") != pool.pool_id or sub.role not in pool.engines:
                    continue
                with contextlib.suppress(ProtocolError):
                    client = await self._client(pool.engines[sub.role])
                    args = {TENANT_ARG: job.job_id}
                    await client.call(DETACH_CMD, args, key=f"detach/{sub.sub_job_id}", meta={})
        released = self.book.release(job.job_id)
        if released is not None:
            if not released.tenants and released.state != "ready":
                await self._stop(released, "stopped")  # it never started: nothing to keep warm
            else:
                self.save(released)
                self._arm_idle(released)

    def _arm_idle(self, pool: Pool) -> None:
        if pool.tenants or not pool.idle_since or pool.pool_id in self._timers:
            return
        delay = max(0.0, pool.idle_since + self.policy.idle_seconds - time.time())
        loop = asyncio.get_running_loop()
        self._timers[pool.pool_id] = loop.call_later(delay, self._idle, pool)

    def _idle(self, pool: Pool) -> None:
        self._timers.pop(pool.pool_id, None)
        if not pool.tenants and pool.live:
            self.jobs._spawn(self._stop(pool, "stopped"))

    def _fail(self, pool: Pool, why: str) -> None:
        """A pool engine is gone (or never started): every job in the pool fails."""
        if not pool.live:
            return
        pool.failure = why
        pool.state = "failed"  # no job joins it from now
        tenants = list(pool.tenants)
        self.jobs._spawn(self._stop(pool, "failed"))
        for jid in tenants:
            job = self.jobs.jobs.get(jid)
            if job is not None and not job.terminal:
                self.jobs.end(job, "failed", why)

    async def _stop(self, pool: Pool, state: str) -> None:
        pool.state = state
        timer = self._timers.pop(pool.pool_id, None)
        if timer is not None:
            timer.cancel()
        self.save(pool)
        error = ProtocolError("sub_job_failed", f"LoRA pool {pool.pool_id} {state}")
        await asyncio.gather(
            *(self.jobs.supervisor.stop(s, error) for s in pool.engines.values() if s.worker),
            return_exceptions=True,
        )
        pool.placed = False
        log.info("LoRA pool %s %s %s", pool.pool_id, state, pool.failure)
        self.jobs.store.delete_pool(pool.pool_id)
        if self.book.pools.get(pool.pool_id) is pool:
            del self.book.pools[pool.pool_id]
        self.jobs._schedule()

    def check(self) -> None:
        """The watch loop: a live pool whose worker is gone fails its jobs."""
        for pool in list(self.book.pools.values()):
            if pool.state != "ready":
                continue
            for role, s in pool.engines.items():
                why = self.jobs.supervisor.gone(s) if s.worker else None
                if why is not None:
                    self._fail(pool, f"its LoRA pool's {role} worker failed: {why}")
                    break

    # -- restart ---------------------------------------------------------------------------------

    async def restore(self) -> int:
        """Load the pools; who is in each comes from the jobs (the book's truth after a crash).
        Pools that were starting go on starting (their jobs' starts wait for them)."""
        for doc in self.jobs.store.pools():
            pool = Pool.from_doc(doc)
            pool.tenants = []
            self.book.pools[pool.pool_id] = pool
        for job in self.jobs.jobs.values():
            if job.pool and not job.terminal:
                found = self.book.pools.get(job.pool)
                if found is None or not found.live:
                    key = self.key_of(job.sub_jobs)  # its pool record was never written
                    if key is None:
                        continue
                    job.pool = self.book.reserve(job.job_id, key).pool_id
                elif job.job_id not in found.tenants:
                    found.tenants.append(job.job_id)
        for pool in list(self.book.pools.values()):
            if pool.state == "ready":
                try:
                    for s in pool.engines.values():
                        await self.jobs.supervisor.attach(s)
                except ProtocolError as exc:
                    self._fail(pool, f"after a gateway restart: {exc.message}")
                    continue
            if pool.tenants:
                pool.idle_since = 0.0
            elif pool.live and not pool.idle_since:
                pool.idle_since = time.time()
            if pool.live:
                self.save(pool)
                self._arm_idle(pool)
        return len(self.book.pools)

    def shutdown(self) -> None:
        """The gateway stops: timers stop; the pool workers keep running for the next one."""
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for task in self._starting.values():
            task.cancel()

    def views(self) -> list[dict[str, Any]]:
        return [
            {
                "pool_id": p.pool_id,
                "base_model": p.base_model,
                "state": p.state,
                "jobs": list(p.tenants),
                "adapters": len(p.tenants),
                "max_adapters": p.max_adapters,
                "failure": p.failure,
                "engines": {
                    r: {"pid": s.worker.get("pid"), "sub_job_id": s.sub_job_id}
                    for r, s in p.engines.items()
                },
            }
            for p in self.book.pools.values()
        ]
