"""`JobControl`: the servicer side of jobs that every server shares.

The `authorize_job` hook of the protocol core (another token's job is `job_not_found`, a 404;
a data-plane call needs a running job), the sub-job an op runs on (`target`), the control-plane
ops `ListJobs`, `GetCapacity`, `GetJob`, `CancelJob` and `RenewJobLease` over the servicer's
`jobs` (a `JobQueue`), and the admin view of a job. `CreateJob` is each server's own (its
configs differ). The owner of a call is its token with `auth`, else nobody (`_owner`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic

from arctic_sdk.spec.model import GrpcShape, MethodInfo

from .._generated.servicer import ServicerBase
from ..protocol.context import CallContext
from ..rules.errors import ProtocolError
from ..rules.jobs import J, JobRecord, S, cancel_job, list_jobs, require_running, target
from . import forwarding
from .job_queue import JobQueue

if TYPE_CHECKING:
    from ..protocol.core import ProtocolCore


class JobControl(ServicerBase, Generic[J]):
    jobs: JobQueue[J]
    core: ProtocolCore | None
    auth: bool

    # ------------------------------------------------------------------ visibility

    def _owner(self, ctx: CallContext) -> str | None:
        return ctx.token if self.auth else None

    def _job(self, ctx: CallContext) -> J:
        return self.jobs.visible(ctx.job_id or "", self._owner(ctx))

    async def authorize_job(self, ctx: CallContext, *, running: bool) -> None:
        job = self._job(ctx)
        if running and ctx.method.grpc_shape is GrpcShape.FRAMES:
            self._require_running(job, ctx.method)

    def _require_running(self, job: JobRecord[Any], method: MethodInfo) -> None:
        """`require_running`, through the core's `job_refused` hook (`faultpoints.CoreHooks`)."""
        try:
            require_running(job, method)
        except ProtocolError as exc:
            hook = self.core.hooks.job_refused if self.core is not None else None
            if hook is None:
                raise
            hook(job, method, exc)

    def engine_link(self, sub: Any) -> Any:
        """The link to a sub-job's engine worker (an `engines.worker.replies.Replies`, whose
        `busy` meter the metrics read), or None: a server without engine workers."""
        return None

    def target(self, job: JobRecord[S], ctx: CallContext, method: MethodInfo | None = None) -> S:
        """The sub-job an op runs on: `X-Arctic-Sub-Job`, else the op's role (PROTOCOL.md §3.4)."""
        return target(job, method or ctx.method, ctx.sub_job_id)

    def load_source(self, ctx: CallContext, body: dict[str, Any]) -> tuple[J, Any, str, str]:
        """LoadCheckpoint's job (running), target sub-job, checkpoint id and source job
        (`forwarding.load_source`: another job's only when the caller's token sees it)."""
        job = self._job(ctx)
        self._require_running(job, ctx.method)
        sub, ckpt, source = forwarding.load_source(
            job,
            ctx,
            body,
            lambda: self.target(job, ctx),
            lambda s: self.jobs.visible(s, self._owner(ctx)),
        )
        return job, sub, ckpt, source

    # ------------------------------------------------------------------ control plane

    def job_cancelled(self, job: J) -> None:
        """A job was cancelled: its open chunk groups can never complete."""
        if self.core is not None:
            self.core.groups.forget_job(job.job_id)

    async def list_jobs(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        return list_jobs(self.jobs.jobs.values(), self._owner(ctx), body)

    async def get_capacity(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        return self.jobs.capacity()

    async def get_job(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        return {"job": self._job(ctx).to_json()}

    async def cancel_job(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job = self._job(ctx)
        answer = cancel_job(job, self.jobs.end)
        self.job_cancelled(job)
        return answer

    async def renew_job_lease(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job = self._job(ctx)
        seconds = int(body.get("lease_seconds") or 0)
        self.jobs.check_lease(seconds, "lease_seconds")
        return {"lease_expires_at": self.jobs.renew(job, seconds)}

    # ------------------------------------------------------------------ admin

    def job_state(self, job_id: str) -> dict[str, Any]:
        """The admin view of a job, whoever owns it: its answer, history and `workers`."""
        job = self.jobs.jobs.get(job_id)
        if job is None:
            raise ProtocolError("job_not_found", f"no job {job_id!r}", job_id=job_id)
        out = job.to_json()
        out["history"] = list(job.history)
        out["workers"] = self.worker_views(job)
        return out

    def worker_views(self, job: J) -> list[dict[str, Any]]:
        """The admin view of a job's workers."""
        return []
