"""What every part of the gateway's servicer shares: jobs visible to a token, sub-job targeting,
and the keyed worker call that makes a request's effect happen at most once."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import TYPE_CHECKING, Any

from ..protocol.config import token_digest
from ..protocol.context import CallContext
from ..rules import jobs as pj
from ..rules.errors import ProtocolError
from ..serving.collective_sync import CollectiveSync
from ..serving.job_control import JobControl
from .jobs import JobManager
from .lora_pools import TenantClient
from .model import Job, SubJob
from .profiles import Profile
from .settings import GatewaySettings
from .workers import WorkerClient

if TYPE_CHECKING:
    from ..protocol.core import ProtocolCore


class GatewayBase(JobControl[Job]):
    # ProtocolCore.restore hands requests that were running to us with ctx.recovered: their
    # worker calls are then collected by key, never sent again.
    recovers_running = True

    def __init__(
        self, jobs: JobManager, profile: Profile, settings: GatewaySettings, *, auth: bool
    ) -> None:
        self.jobs: JobManager = jobs
        self.profile = profile
        self.settings = settings
        self.auth = auth
        self.core: ProtocolCore | None = None  # attached by the server
        self._active: dict[str, list[tuple[WorkerClient | TenantClient, str]]] = {}
        self._gates: dict[str, asyncio.Event] = {}
        self._sync_locks: dict[str, asyncio.Lock] = {}
        self._weight_groups: dict[str, CollectiveSync] = {}  # job id -> its weight group

    # ------------------------------------------------------------------ jobs

    def owner(self, ctx: CallContext) -> str:
        return token_digest(ctx.token) if self.auth and ctx.token else ""

    def job(self, ctx: CallContext) -> Job:
        if ctx.resumed:  # taken up after a restart: its token was checked when it arrived
            job = self.jobs.jobs.get(ctx.job_id or "")
            if job is not None:
                return job
        return self.jobs.visible(ctx.job_id or "", self.owner(ctx))

    # JobControl's hooks (the control-plane ops on jobs)
    _owner = owner
    _job = job

    def job_cancelled(self, job: Job) -> None:
        """Nothing more: `GatewayServicer.job_ended` follows every end of a job."""

    require_running = staticmethod(pj.require_running)

    def begin(self, ctx: CallContext) -> tuple[Job, SubJob]:
        job = self.job(ctx)
        self.require_running(job, ctx.method)
        return job, self.target(job, ctx)

    def gate(self, job: Job) -> asyncio.Event:
        """Clear while a weight sync runs: new generates wait for it."""
        ev = self._gates.get(job.job_id)
        if ev is None:
            ev = self._gates[job.job_id] = asyncio.Event()
            ev.set()
        return ev

    def sync_lock(self, job: Job) -> asyncio.Lock:
        return self._sync_locks.setdefault(job.job_id, asyncio.Lock())

    def engine_link(self, sub: SubJob) -> WorkerClient | None:
        return self.jobs.supervisor.client(sub)

    # ------------------------------------------------------------------ worker calls

    async def call(self, ctx: CallContext, sub: SubJob, cmd: str, **args: Any) -> Any:
        """Run `cmd` on the sub-job's worker, keyed by the request: a key the worker has seen
        answers its first outcome; after a restart (`ctx.recovered`) the outcome is collected
        and the command is never sent again."""
        client = await self.jobs.client(sub)
        key = f"{ctx.request_id}/{sub.sub_job_id}/{cmd}" if ctx.request_id else None
        if ctx.recovered and key is not None:
            return await client.collect(key)
        direct = key is None  # outside the request queue (an OpenAI route): nothing collects it
        if key is None:
            key = f"direct-{uuid.uuid4().hex}/{sub.sub_job_id}/{cmd}"
        meta = {
            "request_id": ctx.request_id,
            "idempotency_key": ctx.idempotency_key,
            "seq": ctx.seq,
            "op": ctx.method.name,
        }
        active = self._active.setdefault(ctx.request_id, []) if ctx.request_id else None
        if active is not None:
            active.append((client, key))
        try:
            return await client.call(cmd, args, key=key, meta=meta)
        except asyncio.CancelledError:
            if direct:  # its HTTP client left: a sampler drops it from the engine's batch (a
                # queued request's task is also cancelled at a hand-off: its call must go on)
                task = asyncio.get_running_loop().create_task(client.cancel(key))
                task.add_done_callback(lambda t: t.cancelled() or t.exception())
            raise
        finally:
            if active is not None:
                active.remove((client, key))
                if not active:
                    self._active.pop(ctx.request_id or "", None)

    async def cancel_running(self, ctx: CallContext, request_id: str) -> bool:
        """CancelRequest of a running request: the worker drops it if it has not started it,
        else stops at its engine's next safe point (the fake engine has one between latency
        slices; a vLLM sampler aborts it in its batch; DeepSpeed calls finish). True = the
        request ends by itself."""
        calls = list(self._active.get(request_id, ()))
        if not calls:
            return False
        for client, key in calls:
            with contextlib.suppress(ProtocolError):
                await client.cancel(key)
        return True
