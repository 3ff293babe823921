"""Data-plane ops of the gateway: each runs on its target sub-job's worker, keyed by request.

Weight sync is the one op that spans workers: the trainer broadcasts into every target over the
job's weight group (`collective`, the default across hosts: the gateway only coordinates), or
exports a file / blob each target loads, while new generates wait; the weight version it assigns
is stored with the job before any sampler loads, so a sync collected after a restart assigns the
same version.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

from arctic_sdk.spec.tables import methods as M

from ..protocol.context import CallContext
from ..protocol.inproc import cancel_request
from ..rules.errors import ProtocolError
from ..rules.operation_types import (
    OP_CANCEL,
    OP_RESET,
    OP_TAIL_LOGS,
    OP_WEIGHT_SYNC,
    forward_body,
    operation_sub,
    tail_args,
)
from ..rules.sub_jobs import sync_sub_jobs
from ..rules.weight_sync import GROUP_METHODS, file_sync_result
from ..serving import forwarding
from ..serving.collective_sync import (
    CollectiveSync,
    Member,
    Placement,
    member_ranks,
    pick_method,
)
from ..serving.lora_sync import lora_method
from . import lora
from .base import GatewayBase
from .model import Job, SubJob

CPU_LIFECYCLE_REASON = "nothing is colocated on a GPU here, so there is nothing to offload"


def _member(sub: SubJob) -> Member:
    """A sub-job in its job's weight group: its worker (a restarted one is another member)."""
    w = sub.worker or {}
    key = (sub.sub_job_id, w.get("pid"), tuple(w.get("address") or ()))
    return Member(sub, key, member_ranks(w.get("info") or {}))


class DataPlane(forwarding.WorkerForwarding, GatewayBase):
    """Forward-backward, forward, log-probs and step: `forwarding.WorkerForwarding`."""

    # ------------------------------------------------------------------ training

    async def begin_on_worker(self, ctx: CallContext) -> tuple[Job, SubJob]:
        return self.begin(ctx)

    def worker_call(self, ctx: CallContext) -> forwarding.Call:
        return functools.partial(self.call, ctx)

    def job_stepped(self, job: Job) -> None:
        self.jobs.save(job)

    # ------------------------------------------------------------------ sampling

    async def generate(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job, sub = self.begin(ctx)
        await self.gate(job).wait()  # a weight sync in progress pauses new generates
        self.require_running(job, ctx.method)
        version = sub.weight_version
        args = self.profile.generate_args(body, sub)
        if lora.generate_args(job, body, args):  # "base": the base model, version 0
            version = 0
        res = dict(await self.call(ctx, sub, M.GENERATE.python_name, **args))
        # the sampler's own version of the weights that ran it (a sync in between cannot skew it)
        res["weight_version"] = int(res.get("weight_version", version))
        return res

    async def generate_stream(
        self, ctx: CallContext, body: dict[str, Any]
    ) -> AsyncIterator[dict[str, Any]]:
        """One sample of `body["prompts"][0]`, token by token (the OpenAI routes' streams, on
        engines that stream: the vLLM sampler): the same checks, weight-sync gate and
        `weight_version` as `generate`; leaving early aborts it in the engine."""
        job, sub = self.begin(ctx)  # the caller ran check_request (the profile's checks)
        await self.gate(job).wait()  # a weight sync in progress pauses new generates
        self.require_running(job, ctx.method)
        version = sub.weight_version
        args = self.profile.generate_args(body, sub)
        client = await self.jobs.client(sub)
        stream_args = {"prompt": args["prompts"][0], "sampling_params": args["sampling_params"]}
        async for item in client.stream(stream_args, meta={"op": ctx.method.name}):
            yield {"weight_version": version, **item}

    async def sync_weights(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job = self.job(ctx)
        self.require_running(job, ctx.method)
        return await self.sync(ctx, job, body)

    def sync_placement(self, src: SubJob, targets: list[SubJob]) -> Placement:
        """Where a sync's workers are: one host when every one is a local process, or every
        one is on one Ray node (two Ray nodes are two hosts, even on one machine)."""
        workers = [s.worker or {} for s in (src, *targets)]
        local = all(w.get("backend") == "local" for w in workers)
        nodes = {w.get("node_id") or w.get("node") for w in workers}
        same = local or (all(w.get("backend") == "ray" for w in workers) and len(nodes) == 1)
        device = str((src.worker.get("info") or {}).get("device") or "")
        return Placement(
            cuda=device.startswith("cuda"),
            same_host=same,
            shm=Path("/dev/shm").is_dir(),
            collective=self.profile.collective_sync,
            shared_gpu=local,  # Ray gives each actor GPUs of its own
        )

    def sync_method(self, job: Job, body: Mapping[str, Any], path: str = "") -> str:
        """The method a sync of `body` runs with; `unsupported_option` naming why when its
        workers cannot run the one asked for."""
        src, targets = sync_sub_jobs(job, body)
        where = self.sync_placement(src, targets)
        try:
            method = pick_method(body.get("method"), where, cuda_ipc=body.get("cuda_ipc"))
        except ValueError as exc:
            opt = f"{path}method"
            raise ProtocolError("unsupported_option", str(exc), options=[opt], field=opt) from None
        if not lora.adapter_job(job):
            return method
        return lora_method(method, where.shm, pooled=bool(job.pool), same_host=where.same_host)

    def weight_group(self, job: Job) -> CollectiveSync:
        return self._weight_groups.setdefault(job.job_id, CollectiveSync(job.job_id))

    async def sync(self, ctx: CallContext, job: Job, body: Mapping[str, Any]) -> dict[str, Any]:
        src, targets = sync_sub_jobs(job, body)
        method = self.sync_method(job, body)
        rid = ctx.request_id or uuid.uuid4().hex
        call = functools.partial(self.call, ctx)
        async with self.sync_lock(job):
            gate = self.gate(job)
            gate.clear()  # new generates wait; the sampler finishes those sent before it swaps
            try:
                if rid not in job.pending_syncs:
                    job.pending_syncs[rid] = job.weight_version + 1
                    self.jobs.save(job)
                version = job.pending_syncs[rid]
                if method in GROUP_METHODS:  # the trainer's node hosts the rendezvous
                    res = await self.weight_group(job).run(
                        call,
                        _member(src),
                        [_member(t) for t in targets],
                        version=version,
                        host=str((src.worker.get("address") or ["127.0.0.1"])[0]),
                        method=method,
                        settings=self.settings.sync,
                        name=rid,
                    )
                else:
                    res = await self._sync_by_file(call, job, src, targets, method, version, rid)
            finally:
                gate.set()
            job.weight_version = max(job.weight_version, version)
            for t in targets:
                t.weight_version = max(t.weight_version, version)
            job.pending_syncs.pop(rid, None)
            self.jobs.save(job)
        return {"weight_version": version, **res}

    async def _sync_by_file(
        self,
        call: forwarding.Call,
        job: Job,
        src: SubJob,
        targets: list[SubJob],
        method: str,
        version: int,
        rid: str,
    ) -> dict[str, Any]:
        """`shm` (one host) and `safetensors` (the bytes through this gateway) and `cuda_ipc`."""
        t0 = time.perf_counter()
        path = Path("/dev/shm") / f"arctic-{job.job_id}-{rid[:12]}.safetensors"
        try:
            if method == "shm":
                exp = dict(await call(src, "export_weights", path=str(path)))
                load: dict[str, Any] = {"path": str(path)}
            elif method == "safetensors":
                exp = dict(await call(src, "export_weights"))
                load = {"blob": exp.pop("blob")}
            else:  # cuda_ipc
                exp = dict(await call(src, "export_weights", method=method))
                load = {"method": method, "handles": exp.pop("handles")}
            load["weight_version"] = version  # what the targets' results report once loaded
            if "adapter_config" in exp:  # a LoRA job: a new adapter version (gateway/lora.py)
                load["adapter_config"] = exp.pop("adapter_config")
            await asyncio.gather(*(call(t, "load_weights", **load) for t in targets))
        finally:
            if method == "shm":
                with contextlib.suppress(OSError):
                    path.unlink()
        return file_sync_result(method, exp, time.perf_counter() - t0)

    async def reset_prefix_cache(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job, sub = self.begin(ctx)
        call = functools.partial(self.call, ctx)
        return await forwarding.reset_prefix_cache(job.sub_jobs, sub, bool(ctx.sub_job_id), call)

    # ------------------------------------------------------------------ colocation lifecycle

    async def _lifecycle(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        """Sleep / wake: the op's row of `forwarding.LIFECYCLE`."""
        job, sub = self.begin(ctx)
        call, named = functools.partial(self.call, ctx), bool(ctx.sub_job_id)
        return await forwarding.lifecycle(
            ctx.method, body, job.sub_jobs, sub, named, call, CPU_LIFECYCLE_REASON
        )

    sleep_inference = wake_inference = sleep_training = wake_training = _lifecycle

    # ------------------------------------------------------------------ /operation

    async def operation(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job = self.job(ctx)
        otype = str(body["operation_type"])
        payload: Mapping[str, Any] = body.get("payload") or {}
        if otype != OP_TAIL_LOGS:  # the deployed exception: logs while the job is starting
            self.require_running(job, ctx.method)
        if otype == OP_WEIGHT_SYNC:
            args = {k: v for k, v in payload.items() if k != "weight_format"}
            result = await self.sync(ctx, job, args)
        elif otype == OP_RESET:
            sid = body.get("sub_job_id")
            subs = [operation_sub(job, body, "sampling")] if sid else []
            if not subs:
                role = body.get("sub_job_type")
                subs = [
                    s
                    for s in job.sub_jobs
                    if s.role in ("sampling", "log_prob") and (not role or s.role == role)
                ]
            reset = M.RESET_PREFIX_CACHE.python_name
            res = await asyncio.gather(*(self.call(ctx, s, reset) for s in subs))
            result = {"reset": all(bool(r.get("reset")) for r in res)}
        elif otype == OP_TAIL_LOGS:
            result = await self.tail_logs(job, body, payload)
        elif otype == OP_CANCEL:
            result = await cancel_request(self.core, ctx, str(payload["request_id"]))
        else:  # forward
            sub = operation_sub(job, body, "training")
            fwd = forward_body(payload)
            result = dict(await self.call(ctx, sub, M.FORWARD.python_name, body=fwd))
        return {"result": result}

    async def tail_logs(
        self, job: Job, body: Mapping[str, Any], payload: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Page through one sub-job's log (the target, default the training sub-job): entries,
        the cursor of the next page, and whether the page reached the end."""
        cursor, limit = tail_args(payload)  # checked before: check_operation
        sub = operation_sub(job, body, "training")
        log = Path(str((sub.worker or {}).get("log") or ""))
        if log.is_file():
            lines = (await asyncio.to_thread(log.read_text, errors="replace")).splitlines()
            page, total = lines[cursor : cursor + limit], len(lines)
        elif sub.worker:  # a worker on another node (Ray): ask it
            page_doc = await (await self.jobs.client(sub)).logs(cursor, limit)
            page, total = list(page_doc["entries"]), int(page_doc["total"])
        else:
            page, total = [], 0
        end = cursor + len(page)
        return {
            "entries": [f"[{sub.sub_job_id}] {ln}" for ln in page],
            "next_cursor": str(end),
            "eof": end >= total,
        }
