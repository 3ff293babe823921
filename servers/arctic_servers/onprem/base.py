"""What every part of the on-prem servicer shares: settings, jobs visible to a token, sub-job
targeting, vocabulary sizes, and the call that runs a command on a sub-job's worker."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from typing import TYPE_CHECKING, Any

from arctic_sdk.spec.model import MethodInfo

from ..engines.config import model_vocab_size
from ..protocol.context import CallContext
from ..rules.errors import ProtocolError
from ..serving.job_control import JobControl
from .jobs import Job, JobManager, SubJob
from .lora_pools import TenantHandle
from .settings import ServerSettings

log = logging.getLogger("arctic_servers.onprem")

if TYPE_CHECKING:
    from ..protocol.core import ProtocolCore


def _has_cuda() -> bool:
    return shutil.which("nvidia-smi") is not None and os.path.exists("/dev/nvidia0")


class OnpremBase(JobControl[Job]):
    def __init__(self, settings: ServerSettings | None = None, *, auth: bool = False) -> None:
        self.settings = settings or ServerSettings()
        self.jobs: JobManager = JobManager(self.settings)
        self.auth = auth
        self.cuda = _has_cuda()
        self.core: ProtocolCore | None = None  # attached by the server (cancel-request operation)
        self._vocab: dict[str, int] = {}
        self._exports: dict[tuple[str, str], asyncio.Lock] = {}

    # ------------------------------------------------------------------ protocol hooks

    def _vocab_of(self, sub: SubJob) -> int:
        if sub.worker is not None and sub.worker.info.get("vocab_size"):
            return int(sub.worker.info["vocab_size"])
        if sub.model_dir is None:
            return 0
        key = str(sub.model_dir)
        if key not in self._vocab:
            self._vocab[key] = model_vocab_size(sub.model_dir)
        return self._vocab[key]

    async def cancel_running(self, ctx: CallContext, request_id: str) -> bool:
        """CancelRequest of a running request (PROTOCOL.md §3.3): while a command of it runs on
        a worker that cannot stop one midway (a trainer: DeepSpeed, an HF scorer), it runs to
        its end and the request answers what ran (True: it ends by itself; `cancelled` false
        once it completed), as on the gateway. Otherwise (it waits in the server, or generates
        on a vLLM sampler, whose command a cancelled call aborts) the core cancels its task."""
        job = self.jobs.jobs.get(ctx.job_id or "")
        if job is None:
            return False
        busy = []
        for sub in job.sub_jobs:
            handle = sub.worker.worker if isinstance(sub.worker, TenantHandle) else sub.worker
            if handle is not None and handle.engine != "vllm" and handle.serves(request_id):
                busy.append(sub.sub_job_id)
        if not busy:
            return False
        log.info(
            "request %s (job %s): cancel asked while %s run(s) it; a training command runs to "
            "its end, and the request answers what ran",
            request_id,
            job.job_id,
            ", ".join(busy),
        )
        return True

    # ------------------------------------------------------------------ helpers

    async def _begin(
        self, ctx: CallContext, method: MethodInfo | None = None
    ) -> tuple[Job, SubJob]:
        job = self._job(ctx)
        self._require_running(job, method or ctx.method)
        sub = self.target(job, ctx, method)
        return job, sub

    def engine_link(self, sub: SubJob) -> Any:
        return sub.worker

    @staticmethod
    async def _call(sub: SubJob, cmd: str, **args: Any) -> Any:
        if sub.worker is None:
            raise ProtocolError("unavailable", f"sub-job {sub.sub_job_id} has no worker yet")
        return await sub.worker.call(cmd, **args)
