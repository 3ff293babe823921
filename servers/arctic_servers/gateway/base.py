"""What every part of the gateway's servicer shares: jobs visible to a token, sub-job targeting,
and the keyed worker call that makes a request's effect happen at most once."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

from arctic_sdk._generated import methods as M
from arctic_sdk._spec import MethodInfo, Role

from .._generated.servicer import ServicerBase
from ..protocol.config import token_digest
from ..protocol.context import CallContext
from ..protocol.errors import ProtocolError
from .jobs import JobManager
from .model import Job, SubJob, not_running_error, terminal_error
from .profiles import Profile
from .settings import GatewaySettings
from .workers import WorkerClient

if TYPE_CHECKING:
    from ..protocol.core import ProtocolCore

# Data-plane ops a job that is not running may still serve (checkpoint files outlive compute).
ANY_STATE = frozenset(
    {M.LIST_CHECKPOINTS, M.EXPORT_CHECKPOINT, M.DOWNLOAD_CHECKPOINT_FILE, M.DELETE_CHECKPOINT}
)
# Roles an op may be pointed at with X-Arctic-Sub-Job (default: its own role only).
TARGETS: dict[MethodInfo, frozenset[str]] = {
    M.FORWARD: frozenset({"training", "log_prob", "sampling"}),
    M.LOG_PROBS: frozenset({"training", "log_prob", "sampling"}),
    M.GENERATE: frozenset({"sampling"}),
    M.RESET_PREFIX_CACHE: frozenset({"sampling", "log_prob"}),
    M.SLEEP_INFERENCE: frozenset({"sampling", "log_prob"}),
    M.WAKE_INFERENCE: frozenset({"sampling", "log_prob"}),
}


class GatewayBase(ServicerBase):
    # ProtocolCore.restore hands requests that were running to us with ctx.recovered: their
    # worker calls are then collected by key, never sent again.
    recovers_running = True

    def __init__(
        self, jobs: JobManager, profile: Profile, settings: GatewaySettings, *, auth: bool
    ) -> None:
        self.jobs = jobs
        self.profile = profile
        self.settings = settings
        self.auth = auth
        self.core: ProtocolCore | None = None  # attached by the server
        self._active: dict[str, list[tuple[WorkerClient, str]]] = {}
        self._gates: dict[str, asyncio.Event] = {}
        self._sync_locks: dict[str, asyncio.Lock] = {}

    # ------------------------------------------------------------------ jobs

    def owner(self, ctx: CallContext) -> str:
        return token_digest(ctx.token) if self.auth and ctx.token else ""

    def job(self, ctx: CallContext) -> Job:
        if ctx.resumed:  # taken up after a restart: its token was checked when it arrived
            job = self.jobs.jobs.get(ctx.job_id or "")
            if job is not None:
                return job
        return self.jobs.visible(ctx.job_id or "", self.owner(ctx))

    @staticmethod
    def require_running(job: Job, method: MethodInfo) -> None:
        if method in ANY_STATE:
            return
        if job.terminal:
            raise terminal_error(job)
        if job.state != "running":
            raise not_running_error(job)

    def target(self, job: Job, ctx: CallContext, method: MethodInfo | None = None) -> SubJob:
        """The sub-job an op runs on: `X-Arctic-Sub-Job`, else the op's role (PROTOCOL.md §3.4)."""
        m = method or ctx.method
        role = "training" if m.role is Role.GATEWAY else m.role.value
        allowed = TARGETS.get(m, frozenset({role}))
        if ctx.sub_job_id:
            sub = job.find_sub_job(ctx.sub_job_id)
            if sub is None:
                raise ProtocolError(
                    "sub_job_not_found",
                    f"no sub-job {ctx.sub_job_id!r} in job {job.job_id}",
                    sub_job_id=ctx.sub_job_id,
                    job_id=job.job_id,
                )
            if sub.role not in allowed:
                raise ProtocolError(
                    "invalid_argument",
                    f"header X-Arctic-Sub-Job: {m.name} cannot run on {sub.role} sub-job "
                    f"{sub.sub_job_id}",
                    field="X-Arctic-Sub-Job",
                    expected=sorted(allowed),
                )
            return sub
        sub = job.sub_job(role)
        if sub is None and role == "log_prob":
            sub = job.sub_job("training")
        if sub is None:
            raise ProtocolError(
                "sub_job_not_found",
                f"job {job.job_id} has no {role} sub-job for {m.name}",
                job_id=job.job_id,
                role=role,
            )
        return sub

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

    # ------------------------------------------------------------------ worker calls

    async def call(self, ctx: CallContext, sub: SubJob, cmd: str, **args: Any) -> Any:
        """Run `cmd` on the sub-job's worker, keyed by the request: a key the worker has seen
        answers its first outcome; after a restart (`ctx.recovered`) the outcome is collected
        and the command is never sent again."""
        client = await self.jobs.client(sub)
        key = f"{ctx.request_id}/{sub.sub_job_id}/{cmd}" if ctx.request_id else None
        if ctx.recovered and key is not None:
            return await client.collect(key)
        meta = {
            "request_id": ctx.request_id,
            "idempotency_key": ctx.idempotency_key,
            "seq": ctx.seq,
            "op": ctx.method.name,
        }
        active = self._active.setdefault(ctx.request_id or "", []) if key else None
        if active is not None and key is not None:
            active.append((client, key))
        try:
            return await client.call(cmd, args, key=key, meta=meta)
        finally:
            if active is not None and key is not None:
                active.remove((client, key))
                if not active:
                    self._active.pop(ctx.request_id or "", None)

    async def cancel_running(self, ctx: CallContext, request_id: str) -> bool:
        """CancelRequest of a running request: the worker drops it if it has not started it,
        else stops at its engine's next safe point (the fake engine has one between latency
        slices; DeepSpeed and vLLM calls finish). True = the request ends by itself."""
        calls = list(self._active.get(request_id, ()))
        if not calls:
            return False
        for client, key in calls:
            with contextlib.suppress(ProtocolError):
                await client.cancel(key)
        return True
