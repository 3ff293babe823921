"""Data-plane ops of the on-prem server: training and sampling on the target sub-job's worker,
weight sync (export from the trainer, load into every target while new generates wait), the
prefix-cache reset, and the colocation lifecycle (sleep / wake)."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

from arctic_sdk.spec.tables import methods as M

from ..engines import checks
from ..protocol.context import CallContext
from ..rules.errors import ProtocolError
from ..rules.lora_config import check_adapter, check_weight_format
from ..rules.sub_jobs import check_sync_sub_jobs, sync_sub_jobs
from ..rules.weight_sync import GROUP_METHODS, SYNC_METHODS, file_sync_result
from ..serving import forwarding
from ..serving.collective_sync import (
    CollectiveSync,
    Member,
    Placement,
    member_ranks,
    pick_method,
)
from ..serving.lora_sync import check_lora_sync, lora_method
from .base import OnpremBase
from .jobs import Job, SubJob

CPU_LIFECYCLE_REASON = "CPU server: nothing is colocated on a GPU, so there is nothing to offload"


def _member(sub: SubJob) -> Member:
    """A sub-job in its job's weight group: its worker process, and the ranks it joins with."""
    w = sub.worker
    return Member(sub, (sub.sub_job_id, w.pid if w else None), member_ranks(w.info if w else {}))


class DataPlane(forwarding.WorkerForwarding, OnpremBase):
    """Forward-backward, forward, log-probs and step: `forwarding.WorkerForwarding`."""

    # ------------------------------------------------------------------ training

    async def begin_on_worker(self, ctx: CallContext) -> tuple[Job, SubJob]:
        return await self._begin(ctx)

    def worker_call(self, ctx: CallContext) -> forwarding.Call:
        return self._call

    # ------------------------------------------------------------------ sampling

    async def generate(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job, sub = await self._begin(ctx)
        prompts = checks.prompts(body, 0)
        await job.gate.wait()  # a weight sync in progress pauses new generates
        self._require_running(job, ctx.method)
        # a LoRA job: the current adapter version, or "base" (version 0; PROTOCOL.md §3.6)
        adapter = check_adapter(body, job.syncs_adapter)
        version = 0 if adapter else sub.weight_version
        res = dict(
            await self._call(
                sub,
                M.GENERATE.python_name,
                prompts=prompts,
                sampling_params=dict(body.get("sampling_params") or {}),
                strict=bool(body.get("strict")),
                clamp_max_tokens=bool(body.get("clamp_max_tokens")),
                **({"adapter": adapter} if adapter else {}),
            )
        )
        # the sampler's own version of the weights that ran it (a sync in between cannot skew it)
        res["weight_version"] = int(res.get("weight_version", version))
        return res

    async def generate_stream(
        self, ctx: CallContext, body: dict[str, Any]
    ) -> AsyncIterator[dict[str, Any]]:
        """One sample of `body["prompts"][0]`, token by token (the OpenAI routes' streams): the
        same checks, weight-sync gate and `weight_version` as `generate`; each item is the new
        tokens of one engine step, the last has `finished`. Leaving early aborts the request."""
        from ..engines.worker.messages import STREAM_CMD

        self.check_request(ctx, body)
        job, sub = await self._begin(ctx)
        prompts = checks.prompts(body, 0)
        await job.gate.wait()  # a weight sync in progress pauses new generates
        self._require_running(job, ctx.method)
        if sub.worker is None:
            raise ProtocolError("unavailable", f"sub-job {sub.sub_job_id} has no worker yet")
        version = sub.weight_version
        sp = dict(body.get("sampling_params") or {})
        async for item in sub.worker.stream(STREAM_CMD, prompt=prompts[0], sampling_params=sp):
            yield {"weight_version": version, **item}

    def _placement(self) -> Placement:
        """Every worker of this server is on its host."""
        return Placement(cuda=self.cuda, same_host=True, shm=Path("/dev/shm").is_dir())

    def _check_sync(self, job: Job, body: Mapping[str, Any], path: str) -> None:
        checks.one_of(body, "method", SYNC_METHODS, path)
        try:
            pick_method(body.get("method"), self._placement(), cuda_ipc=body.get("cuda_ipc"))
        except ValueError as exc:
            raise ProtocolError(
                "unsupported_option", str(exc), options=[f"{path}method"], field=f"{path}method"
            ) from None
        check_sync_sub_jobs(job, body, path)
        check_weight_format(body, job.syncs_adapter, path)
        if job.syncs_adapter:  # (an lm_head / embedding adapter: merged full weights)
            check_lora_sync(job, body, path, job.pool)

    async def _sync(self, job: Job, body: Mapping[str, Any]) -> dict[str, Any]:
        src, targets = sync_sub_jobs(job, body)
        where = self._placement()
        method = pick_method(body.get("method"), where, cuda_ipc=body.get("cuda_ipc"))
        if job.syncs_adapter:  # the adapter only (lora_sampler.py; a pooled job's: a file)
            method = lora_method(method, where.shm, pooled=bool(job.pool))
        async with job.sync_lock:
            # new generates wait here; the sampler finishes those already sent before it swaps
            job.gate.clear()
            version = job.weight_version + 1  # what the targets' results report once loaded
            try:
                if method in GROUP_METHODS:
                    if job.weight_group is None:
                        job.weight_group = CollectiveSync(job.job_id)
                    res = await job.weight_group.run(
                        self._call,
                        _member(src),
                        [_member(t) for t in targets],
                        version=version,
                        host="127.0.0.1",
                        method=method,
                        settings=self.settings.sync,
                    )
                else:
                    res = await self._sync_by_file(job, src, targets, method, version)
                job.weight_version = version
                for t in targets:
                    t.weight_version = version
            finally:
                job.gate.set()
            return {"weight_version": job.weight_version, **res}

    async def _sync_by_file(
        self, job: Job, src: SubJob, targets: list[SubJob], method: str, version: int
    ) -> dict[str, Any]:
        """`shm`, `safetensors` and `cuda_ipc`: one export, loaded by every target."""
        t0 = time.perf_counter()
        path: Path | None = None
        try:
            if method == "shm":
                path = Path("/dev/shm") / f"arctic-{job.job_id}-{uuid.uuid4().hex[:8]}.safetensors"
                exp = await self._call(src, "export_weights", path=str(path))
                load: dict[str, Any] = {"path": str(path)}
            elif method == "safetensors":
                exp = await self._call(src, "export_weights")
                load = {"blob": exp.pop("blob")}
            else:  # cuda_ipc (weight_sync.py)
                exp = await self._call(src, "export_weights", method=method)
                load = {"method": method, "handles": exp.pop("handles")}
            load["weight_version"] = version
            if "adapter_config" in exp:  # a LoRA job: a new adapter version
                load["adapter_config"] = exp.pop("adapter_config")
            await asyncio.gather(*(self._call(t, "load_weights", **load) for t in targets))
        finally:
            if path is not None:
                with contextlib.suppress(OSError):
                    path.unlink()
        return file_sync_result(method, exp, time.perf_counter() - t0)

    async def sync_weights(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job = self._job(ctx)
        self._require_running(job, ctx.method)
        return await self._sync(job, body)

    async def reset_prefix_cache(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job, sub = await self._begin(ctx)
        return await forwarding.reset_prefix_cache(
            job.sub_jobs, sub, bool(ctx.sub_job_id), self._call
        )

    # ------------------------------------------------------------------ colocation lifecycle

    async def _lifecycle(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        """Sleep / wake: the op's row of `forwarding.LIFECYCLE`."""
        job, sub = await self._begin(ctx)
        named = bool(ctx.sub_job_id)
        return await forwarding.lifecycle(
            ctx.method, body, job.sub_jobs, sub, named, self._call, CPU_LIFECYCLE_REASON
        )

    sleep_inference = wake_inference = sleep_training = wake_training = _lifecycle
