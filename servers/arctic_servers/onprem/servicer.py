"""`OnpremServicer`: every op of arctic.v1 over local DeepSpeed and vLLM worker processes.

The protocol layer does routing, auth, chunk groups, idempotency, sequencing, polling and the
generic body checks; `check_request` adds the semantic ones (a 4xx before anything runs); each op
then runs on the worker of its target sub-job (`X-Arctic-Sub-Job`, else the op's role). A worker
that dies fails its calls with `sub_job_failed` and the job with a reason (jobs.py).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from google.protobuf import descriptor_pool

import dssst1
from arctic_sdk._generated import methods as M
from arctic_sdk._spec import GrpcShape, MethodInfo, Role

from .._generated.servicer import ServicerBase
from ..protocol.context import CallContext
from ..protocol.core import IncomingCall
from ..protocol.errors import ProtocolError
from ..protocol.validate import validate_body
from . import checks
from .jobs import Job, JobManager, SubJob, not_running_error, rfc3339, terminal_error
from .settings import (
    DEFAULT_MODEL_NAMES,
    ServerSettings,
    model_vocab_size,
    servers_dir,
    sub_job_specs,
    thread_env,
)
from .weight_sync import METHODS as SYNC_METHODS
from .weight_sync import pick_method

if TYPE_CHECKING:
    from ..protocol.core import ProtocolCore

# Ops a job that is not running may still serve (checkpoint files outlive compute).
_ANY_STATE = frozenset(
    {M.LIST_CHECKPOINTS, M.EXPORT_CHECKPOINT, M.DOWNLOAD_CHECKPOINT_FILE, M.DELETE_CHECKPOINT}
)
# Roles an op may be pointed at with X-Arctic-Sub-Job (default: its own role only).
_TARGETS: dict[MethodInfo, frozenset[str]] = {
    M.FORWARD: frozenset({"training", "log_prob", "sampling"}),
    M.LOG_PROBS: frozenset({"training", "log_prob", "sampling"}),
    M.GENERATE: frozenset({"sampling"}),
    M.RESET_PREFIX_CACHE: frozenset({"sampling", "log_prob"}),
    M.SLEEP_INFERENCE: frozenset({"sampling", "log_prob"}),
    M.WAKE_INFERENCE: frozenset({"sampling", "log_prob"}),
}
_PAYLOAD_KEYS = {
    "weight-sync": {
        "source_sub_job_id",
        "target_sub_job_ids",
        "method",
        "cuda_ipc",
        "low_memory",
        "weight_format",
    },
    "reset-prefix-cache": {"drain", "timeout_s", "retry_interval_s"},
    "cancel-request": {"request_id"},
    "tail-logs": {"cursor", "limit"},
}
TAIL_MAX = 1000
CPU_LIFECYCLE_REASON = "CPU server: nothing is colocated on a GPU, so there is nothing to offload"


def _has_cuda() -> bool:
    return shutil.which("nvidia-smi") is not None and os.path.exists("/dev/nvidia0")


class OnpremServicer(ServicerBase):
    operation_types = (
        "weight-sync",
        "reset-prefix-cache",
        "cancel-request",
        "tail-logs",
        "forward",
    )

    def __init__(self, settings: ServerSettings | None = None, *, auth: bool = False) -> None:
        self.settings = settings or ServerSettings()
        self.jobs = JobManager(self.settings)
        self.auth = auth
        self.cuda = _has_cuda()
        self.core: ProtocolCore | None = None  # attached by the server (cancel-request operation)
        self._vocab: dict[str, int] = {}
        self._exports: dict[tuple[str, str], asyncio.Lock] = {}

    # ------------------------------------------------------------------ protocol hooks

    def _owner(self, ctx: CallContext) -> str | None:
        return ctx.token if self.auth else None

    def _job(self, ctx: CallContext) -> Job:
        return self.jobs.visible(ctx.job_id or "", self._owner(ctx))

    async def authorize_job(self, ctx: CallContext, *, running: bool) -> None:
        job = self._job(ctx)
        if running and ctx.method.grpc_shape is GrpcShape.FRAMES:
            self._require_running(job, ctx.method)

    @staticmethod
    def _require_running(job: Job, method: MethodInfo) -> None:
        if method in _ANY_STATE:
            return
        if job.terminal:
            raise terminal_error(job)
        if job.state != "running":
            raise not_running_error(job)

    def target(self, job: Job, ctx: CallContext, method: MethodInfo | None = None) -> SubJob:
        """The sub-job an op runs on: `X-Arctic-Sub-Job`, else the op's role (PROTOCOL.md §3.4)."""
        m = method or ctx.method
        role = "training" if m.role is Role.GATEWAY else m.role.value
        allowed = _TARGETS.get(m, frozenset({role}))
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

    def _vocab_of(self, sub: SubJob) -> int:
        if sub.worker is not None and sub.worker.info.get("vocab_size"):
            return int(sub.worker.info["vocab_size"])
        if sub.model_dir is None:
            return 0
        key = str(sub.model_dir)
        if key not in self._vocab:
            self._vocab[key] = model_vocab_size(sub.model_dir)
        return self._vocab[key]

    def check_request(self, ctx: CallContext, body: dict[str, Any]) -> None:
        """Semantic checks before a data-plane call is accepted (4xx on failure)."""
        job = self._job(ctx)
        m = ctx.method
        sub = self.target(job, ctx) if m is not M.OPERATION else None
        if m is M.FORWARD_BACKWARD or m is M.FORWARD:
            assert sub is not None
            checks.train_body(body, self._vocab_of(sub), need_loss=m is M.FORWARD_BACKWARD)
        elif m is M.LOG_PROBS:
            assert sub is not None
            checks.log_probs_body(body, self._vocab_of(sub))
        elif m is M.GENERATE:
            assert sub is not None
            checks.sampling_params(body)
            checks.prompts(body, self._vocab_of(sub))
        elif m is M.STEP:
            checks.learning_rate(body)
        elif m is M.SAVE_CHECKPOINT:
            checks.save_body(body)
        elif m is M.LOAD_CHECKPOINT:
            if not body.get("checkpoint_id"):
                raise checks.bad("checkpoint_id", "is required", "missing_field")
            checks.checkpoint_id(body["checkpoint_id"])
            tid = body.get("target_sub_job_id")
            if tid:
                t = job.find_sub_job(str(tid))
                if t is None:
                    raise ProtocolError(
                        "sub_job_not_found",
                        f"no sub-job {tid!r} in job {job.job_id}",
                        sub_job_id=tid,
                        job_id=job.job_id,
                    )
                if t.role != "training":
                    raise checks.bad(
                        "target_sub_job_id",
                        f"{tid} is a {t.role} sub-job",
                        expected="a training sub-job",
                    )
        elif m is M.SYNC_WEIGHTS:
            self._check_sync(job, body, "")
        elif m is M.RESET_PREFIX_CACHE:
            if float(body.get("timeout_s") or 0) < 0:
                raise checks.bad("timeout_s", "is negative", expected=">= 0")
        elif m in (M.SLEEP_INFERENCE, M.WAKE_INFERENCE, M.SLEEP_TRAINING):
            checks.lifecycle(m.name, body)
        elif m in (M.EXPORT_CHECKPOINT, M.DELETE_CHECKPOINT, M.DOWNLOAD_CHECKPOINT_FILE):
            checks.checkpoint_id(body.get("checkpoint_id"))
            if m is M.DOWNLOAD_CHECKPOINT_FILE:
                checks.filename(body.get("filename"))
        elif m is M.OPERATION:
            self._check_operation(job, ctx, body)

    # ------------------------------------------------------------------ helpers

    async def _begin(
        self, ctx: CallContext, method: MethodInfo | None = None
    ) -> tuple[Job, SubJob]:
        job = self._job(ctx)
        self._require_running(job, method or ctx.method)
        sub = self.target(job, ctx, method)
        return job, sub

    @staticmethod
    async def _call(sub: SubJob, cmd: str, **args: Any) -> Any:
        if sub.worker is None:
            raise ProtocolError("unavailable", f"sub-job {sub.sub_job_id} has no worker yet")
        return await sub.worker.call(cmd, **args)

    # ------------------------------------------------------------------ control plane

    async def create_job(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        specs = sub_job_specs(body, cuda=self.cuda)
        labels = dict(body.get("labels") or {})
        if any(not k for k in labels):
            raise checks.bad("labels", "a label key is empty", expected="non-empty keys")
        lease = int(body.get("lease_seconds") or 0)
        self.jobs.check_lease(lease, "lease_seconds")
        for i, spec in enumerate(specs):  # fail fast on a model directory that does not exist
            name = spec.model_name.strip()
            known = name in DEFAULT_MODEL_NAMES
            if not known and not (Path(name).expanduser() / "config.json").is_file():
                raise checks.bad(
                    f"sub_job_configs[{i}].model_name",
                    f"{name!r} is not a local Hugging Face directory (no config.json) and not "
                    "a model this server knows ('' or 'tiny' = the embedded tiny model)",
                    expected="a local HF directory, or empty",
                )
        job = self.jobs.create(
            self._owner(ctx),
            specs,
            labels=labels,
            comment=str(body.get("comment") or ""),
            experiment_name=str(body.get("experiment_name") or ""),
            lease_seconds=lease or self.settings.lease_default_seconds,
        )
        return {"job_id": job.job_id}

    async def list_jobs(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        state = ""
        if body.get("state"):
            state = str(body["state"]).lower().removeprefix("job_state_")
            state = {"canceled": "cancelled"}.get(state, state)
        wanted = []
        for item in body.get("label") or []:
            k, sep, v = str(item).partition("=")
            if not sep or not k:
                raise checks.bad("label", f"{item!r} is not key=value", expected="key=value")
            wanted.append((k, v))
        owner = self._owner(ctx)
        out = [
            j.to_json()
            for j in self.jobs.jobs.values()
            if (j.owner is None or j.owner == owner)
            and (not state or j.state == state)
            and all(j.labels.get(k) == v for k, v in wanted)
        ]
        return {"jobs": out}

    async def get_capacity(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        return self.jobs.capacity()

    async def get_job(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        return {"job": self._job(ctx).to_json()}

    async def cancel_job(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job = self._job(ctx)
        if job.terminal:
            raise terminal_error(job)
        self.jobs.end(job, "cancelled", "cancelled by CancelJob")
        if self.core is not None:
            self.core.groups.forget_job(job.job_id)
        return {"job": job.to_json()}

    async def renew_job_lease(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job = self._job(ctx)
        seconds = int(body.get("lease_seconds") or 0)
        self.jobs.check_lease(seconds, "lease_seconds")
        return {"lease_expires_at": self.jobs.renew(job, seconds)}

    # ------------------------------------------------------------------ training

    async def forward_backward(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        _, sub = await self._begin(ctx)
        return dict(await self._call(sub, "forward_backward", body=body))

    async def forward(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job, sub = await self._begin(ctx)
        res = dict(await self._call(sub, "forward", body=body))
        res.setdefault("metrics", {})["global_step"] = job.global_step
        return res

    async def log_probs(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job, sub = await self._begin(ctx)
        res = dict(await self._call(sub, "log_probs", body=body))
        res.setdefault("metrics", {})["global_step"] = job.global_step
        return res

    async def step(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job, sub = await self._begin(ctx)
        res = dict(await self._call(sub, "step", learning_rate=checks.learning_rate(body)))
        metrics = res.get("metrics") or {}
        job.global_step = int(metrics.get("global_step", job.global_step))
        job.last_loss = float(metrics.get("loss") or 0.0)
        return res

    # ------------------------------------------------------------------ sampling

    async def generate(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job, sub = await self._begin(ctx)
        prompts = checks.prompts(body, 0)
        await job.gate.wait()  # a weight sync in progress pauses new generates
        self._require_running(job, ctx.method)
        version = sub.weight_version
        res = dict(
            await self._call(
                sub,
                "generate",
                prompts=prompts,
                sampling_params=dict(body.get("sampling_params") or {}),
                strict=bool(body.get("strict")),
            )
        )
        res["weight_version"] = version
        return res

    def _check_sync(self, job: Job, body: Mapping[str, Any], path: str) -> None:
        checks.one_of(body, "method", SYNC_METHODS, path)
        try:
            pick_method(
                body.get("method"),
                cuda=self.cuda,
                shm_ok=Path("/dev/shm").is_dir(),
                cuda_ipc=body.get("cuda_ipc"),
            )
        except ValueError as exc:
            raise ProtocolError(
                "unsupported_option", str(exc), options=[f"{path}method"], field=f"{path}method"
            ) from None
        src = body.get("source_sub_job_id")
        if src:
            s = job.find_sub_job(str(src))
            if s is None:
                raise ProtocolError(
                    "sub_job_not_found",
                    f"no sub-job {src!r} in job {job.job_id}",
                    sub_job_id=src,
                    job_id=job.job_id,
                )
            if s.role != "training":
                raise checks.bad(
                    path + "source_sub_job_id",
                    f"{src} is a {s.role} sub-job",
                    expected="a training sub-job",
                )
        for i, tid in enumerate(body.get("target_sub_job_ids") or []):
            t = job.find_sub_job(str(tid))
            if t is None:
                raise ProtocolError(
                    "sub_job_not_found",
                    f"no sub-job {tid!r} in job {job.job_id}",
                    sub_job_id=tid,
                    job_id=job.job_id,
                )
            if t.role == "training":
                raise checks.bad(
                    f"{path}target_sub_job_ids[{i}]",
                    f"{tid} is a training sub-job",
                    expected="sampling or log_prob sub-jobs",
                )

    async def _sync(self, job: Job, body: Mapping[str, Any]) -> dict[str, Any]:
        src_id = body.get("source_sub_job_id")
        src = job.find_sub_job(str(src_id)) if src_id else job.sub_job("training")
        if src is None:
            raise ProtocolError(
                "sub_job_not_found",
                f"job {job.job_id} has no training sub-job",
                job_id=job.job_id,
                role="training",
            )
        ids = body.get("target_sub_job_ids") or [
            s.sub_job_id for s in job.sub_jobs if s.role in ("sampling", "log_prob")
        ]
        targets = [t for t in (job.find_sub_job(str(i)) for i in ids) if t is not None]
        shm_dir = Path("/dev/shm")
        method = pick_method(
            body.get("method"),
            cuda=self.cuda,
            shm_ok=shm_dir.is_dir(),
            cuda_ipc=body.get("cuda_ipc"),
        )
        async with job.sync_lock:
            job.gate.clear()  # new generates wait; those already sent finish first (FIFO workers)
            t0 = time.perf_counter()
            path: Path | None = None
            try:
                if method == "shm":
                    path = shm_dir / f"arctic-{job.job_id}-{uuid.uuid4().hex[:8]}.safetensors"
                    exp = await self._call(src, "export_weights", path=str(path))
                    load = {"path": str(path)}
                elif method == "safetensors":
                    exp = await self._call(src, "export_weights")
                    load = {"blob": exp.pop("blob")}
                else:  # GPU paths (weight_sync.py)
                    exp = await self._call(src, "export_weights", method=method)
                    load = {"method": method, "handles": exp.pop("handles")}
                    if method == "nccl":
                        return await self._sync_nccl(job, src, targets, exp, load, t0)
                await asyncio.gather(*(self._call(t, "load_weights", **load) for t in targets))
            finally:
                if path is not None:
                    with contextlib.suppress(OSError):
                        path.unlink()
                job.gate.set()
            job.weight_version += 1
            for t in targets:
                t.weight_version = job.weight_version
            return {
                "weight_version": job.weight_version,
                "method": method,
                "num_tensors": int(exp.get("num_tensors", 0)),
                "num_bytes": int(exp.get("num_bytes", 0)),
                "seconds": time.perf_counter() - t0,
            }

    async def _sync_nccl(
        self,
        job: Job,
        src: SubJob,
        targets: list[SubJob],
        exp: dict[str, Any],
        load: dict[str, Any],
        t0: float,
    ) -> dict[str, Any]:  # pragma: no cover - GPU only
        from ..protocol.serve import free_port

        for t in targets:
            port = free_port()
            await asyncio.gather(
                self._call(src, "nccl_broadcast", host="127.0.0.1", port=port),
                self._call(
                    t, "load_weights", method="nccl", handles=load["handles"], nccl_port=port
                ),
            )
            t.weight_version = job.weight_version + 1
        job.weight_version += 1
        return {
            "weight_version": job.weight_version,
            "method": "nccl",
            "num_tensors": exp["num_tensors"],
            "num_bytes": exp["num_bytes"],
            "seconds": time.perf_counter() - t0,
        }

    async def sync_weights(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job = self._job(ctx)
        self._require_running(job, ctx.method)
        return await self._sync(job, body)

    async def reset_prefix_cache(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job, sub = await self._begin(ctx)
        targets = (
            [sub]
            if ctx.sub_job_id
            else [s for s in job.sub_jobs if s.role in ("sampling", "log_prob")] or [sub]
        )
        res = await asyncio.gather(*(self._call(t, "reset_prefix_cache") for t in targets))
        return {"reset": all(bool(r.get("reset")) for r in res)}

    # ------------------------------------------------------------------ /operation

    def _check_operation(self, job: Job, ctx: CallContext, body: Mapping[str, Any]) -> None:
        otype = body.get("operation_type") or ""
        if not otype:
            raise checks.bad("operation_type", "is required", "missing_field")
        if otype not in self.operation_types:
            raise ProtocolError(
                "unknown_operation_type",
                f"operation_type {otype!r} is not one of {list(self.operation_types)}",
                field="operation_type",
                operation_type=otype,
                expected=list(self.operation_types),
            )
        self._op_target(job, body)
        payload: Mapping[str, Any] = body.get("payload") or {}
        keys = _PAYLOAD_KEYS.get(otype)
        if keys is not None:
            unknown = sorted(set(payload) - keys)
            if unknown:
                raise checks.bad(
                    f"payload.{unknown[0]}",
                    f"unknown payload field(s) {unknown} for {otype}; expected {sorted(keys)}",
                    unknown_fields=unknown,
                )
        if otype == "weight-sync":
            self._check_sync(job, payload, "payload.")
        elif otype == "cancel-request" and not payload.get("request_id"):
            raise checks.bad("payload.request_id", "is required", "missing_field")
        elif otype == "tail-logs":
            _tail_args(payload)
        elif otype == "forward":
            fwd = _forward_body(payload)
            sub = self._op_sub(job, body, "training")
            checks.train_body(fwd, self._vocab_of(sub), need_loss=False)

    def _op_target(self, job: Job, body: Mapping[str, Any]) -> str:
        from .settings import role_of

        sid, stype = body.get("sub_job_id"), body.get("sub_job_type")
        role = None
        if stype:
            role = role_of(stype)
            if role is None:
                raise checks.bad(
                    "sub_job_type",
                    f"{stype!r} is not training, sampling or log_prob",
                    expected=["training", "sampling", "log_prob"],
                )
        if sid:
            sub = job.find_sub_job(str(sid))
            if sub is None:
                raise ProtocolError(
                    "sub_job_not_found",
                    f"no sub-job {sid!r} in job {job.job_id}",
                    sub_job_id=sid,
                    job_id=job.job_id,
                )
            if role is not None and sub.role != role:
                raise checks.bad(
                    "sub_job_type", f"{stype!r} disagrees with sub_job_id {sid}", expected=sub.role
                )
            return str(sid)
        return role or ""

    def _op_sub(self, job: Job, body: Mapping[str, Any], default_role: str) -> SubJob:
        t = self._op_target(job, body)
        sub = job.find_sub_job(t) or job.sub_job(t or default_role) or job.sub_job(default_role)
        if sub is None:
            raise ProtocolError(
                "sub_job_not_found",
                f"job {job.job_id} has no {t or default_role} sub-job",
                job_id=job.job_id,
            )
        return sub

    async def operation(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job = self._job(ctx)
        self._require_running(job, ctx.method)
        otype = str(body["operation_type"])
        payload: Mapping[str, Any] = body.get("payload") or {}
        if otype == "weight-sync":
            result = await self._sync(
                job, {k: v for k, v in payload.items() if k != "weight_format"}
            )
        elif otype == "reset-prefix-cache":
            t = self._op_target(job, body)
            subs = (
                [job.find_sub_job(t)]
                if job.find_sub_job(t)
                else [
                    s
                    for s in job.sub_jobs
                    if s.role in ("sampling", "log_prob") and (not t or s.role == t)
                ]
            )
            res = await asyncio.gather(
                *(self._call(s, "reset_prefix_cache") for s in subs if s is not None)
            )
            result = {"reset": all(bool(r.get("reset")) for r in res)}
        elif otype == "tail-logs":
            result = self._tail_logs(job, body, payload)
        elif otype == "cancel-request":
            result = await self._cancel(ctx, str(payload["request_id"]))
        else:  # forward
            sub = self._op_sub(job, body, "training")
            result = dict(await self._call(sub, "forward", body=_forward_body(payload)))
        return {"result": result}

    def _tail_logs(
        self, job: Job, body: Mapping[str, Any], payload: Mapping[str, Any]
    ) -> dict[str, Any]:
        cursor, limit = _tail_args(payload)
        t = self._op_target(job, body)
        subs = [s for s in job.sub_jobs if not t or s.sub_job_id == t or s.role == t]
        lines: list[str] = []
        for s in subs:
            if s.worker is not None:
                lines += [f"[{s.sub_job_id}] {ln}" for ln in list(s.worker.logs)]
        page = lines[cursor : cursor + limit]
        end = cursor + len(page)
        return {"entries": page, "next_cursor": str(end), "eof": end >= len(lines)}

    async def _cancel(self, ctx: CallContext, request_id: str) -> dict[str, Any]:
        if self.core is None:
            raise ProtocolError("unimplemented", "cancel-request needs the protocol core attached")
        call = IncomingCall(
            method=M.CANCEL_REQUEST,
            transport=ctx.transport,
            headers=ctx.headers,
            path_params={"job_id": ctx.job_id or "", "request_id": request_id},
        )
        outcome = await self.core.handle(call)
        return dict(outcome.value)

    # ------------------------------------------------------------------ checkpoints

    def _ckpt_root(self, job_id: str) -> Path:
        return self.settings.data_dir / "jobs" / job_id / "checkpoints"

    def _ckpt_meta(self, job_id: str, ckpt: str) -> dict[str, Any]:
        f = self._ckpt_root(job_id) / ckpt / "meta.json"
        try:
            return dict(json.loads(f.read_text()))
        except (OSError, ValueError):
            raise ProtocolError(
                "checkpoint_not_found",
                f"no checkpoint {ckpt!r} in job {job_id}",
                checkpoint_id=ckpt,
                job_id=job_id,
            ) from None

    @staticmethod
    def _public(meta: Mapping[str, Any]) -> dict[str, Any]:
        keys = (
            "checkpoint_id",
            "checkpoint_type",
            "global_steps",
            "avg_loss",
            "created_at",
            "size_bytes",
        )
        return {k: meta[k] for k in keys if k in meta}

    async def save_checkpoint(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job, sub = await self._begin(ctx)
        ckpt = str(body.get("checkpoint_id") or f"step-{job.global_step}")
        ctype = str(body.get("checkpoint_type") or "resumable")
        root = self._ckpt_root(job.job_id) / ckpt
        if root.exists():
            await asyncio.to_thread(shutil.rmtree, root, True)
        now = time.time()
        res = await self._call(
            sub,
            "save",
            directory=str(root),
            tag="ds",
            checkpoint_type=ctype,
            client_state={"job_id": job.job_id, "checkpoint_id": ckpt, "created_at": rfc3339(now)},
        )
        meta = {
            "checkpoint_id": ckpt,
            "checkpoint_type": ctype,
            "global_steps": int(res.get("global_steps", job.global_step)),
            "avg_loss": job.last_loss,
            "created_at": rfc3339(now),
            "size_bytes": int(res.get("size_bytes", 0)),
            "model_dir": str(sub.model_dir or ""),
            "dtype": sub.spec.dtype,
            "zero_stage": (sub.worker.info if sub.worker else {}).get("zero_stage"),
        }
        (root / "meta.json").write_text(json.dumps(meta))
        return {"checkpoint": self._public(meta)}

    async def load_checkpoint(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job = self._job(ctx)
        self._require_running(job, ctx.method)
        tid = body.get("target_sub_job_id")
        sub = job.find_sub_job(str(tid)) if tid else self.target(job, ctx)
        if sub is None:
            raise ProtocolError(
                "sub_job_not_found", f"no sub-job {tid!r} in job {job.job_id}", sub_job_id=tid
            )
        ckpt = str(body["checkpoint_id"])
        source = str(body.get("source_job_id") or job.job_id)
        if source != job.job_id:
            self.jobs.visible(source, self._owner(ctx))  # same token only
        meta = self._ckpt_meta(source, ckpt)
        res = await self._call(
            sub,
            "load",
            directory=str(self._ckpt_root(source) / ckpt),
            tag="ds",
            checkpoint_type=str(meta.get("checkpoint_type") or "resumable"),
        )
        job.global_step = int(res.get("global_steps", job.global_step))
        return {"checkpoint": self._public(meta)}

    async def list_checkpoints(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job = self._job(ctx)
        root = self._ckpt_root(job.job_id)
        out = []
        if root.is_dir():
            for d in sorted(root.iterdir()):
                with contextlib.suppress(ProtocolError):
                    out.append(self._public(self._ckpt_meta(job.job_id, d.name)))
        out.sort(key=lambda c: (c.get("created_at", ""), c.get("checkpoint_id", "")))
        return {"checkpoints": out}

    async def export_checkpoint(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job = self._job(ctx)
        ckpt = str(body["checkpoint_id"])
        meta = self._ckpt_meta(job.job_id, ckpt)
        root = self._ckpt_root(job.job_id) / ckpt
        out = root / "export"
        lock = self._exports.setdefault((job.job_id, ckpt), asyncio.Lock())
        async with lock:
            if not (out / "model.safetensors").is_file():
                await self._run_export(root, meta, out)
        files = []
        for f in sorted(out.iterdir()):
            if f.is_file() and not f.name.startswith("."):
                digest = await asyncio.to_thread(_sha256, f)
                files.append(
                    {
                        "filename": f.name,
                        "url": f"{job.job_id}/checkpoints/{ckpt}/files/{f.name}",
                        "size_bytes": f.stat().st_size,
                        "sha256": digest,
                    }
                )
        return {"checkpoint_id": ckpt, "files": files, "expires_at": ""}

    async def _run_export(self, root: Path, meta: Mapping[str, Any], out: Path) -> None:
        tmp = out.with_name(".export-tmp")
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        env = dict(os.environ)
        env.update(thread_env(self.settings.threads.threads("training")))
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(servers_dir()), env.get("PYTHONPATH", "")) if p
        )
        env.pop("PYTHONWARNINGS", None)
        proc = await asyncio.create_subprocess_exec(
            self.settings.worker_python,
            "-m",
            "arctic_servers.onprem.export",
            "--checkpoint",
            str(root / "ds"),
            "--type",
            str(meta.get("checkpoint_type") or "resumable"),
            "--model-dir",
            str(meta.get("model_dir") or ""),
            "--dtype",
            str(meta.get("dtype") or "float32"),
            "--out",
            str(tmp),
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        output, _ = await proc.communicate()
        if proc.returncode != 0:
            tail = output.decode("utf-8", "replace").strip().splitlines()[-5:]
            raise ProtocolError(
                "internal",
                f"export of {root.name} failed (exit {proc.returncode}): {' | '.join(tail)}",
            )
        if out.exists():
            shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)

    async def download_checkpoint_file(self, ctx: CallContext, body: dict[str, Any]) -> bytes:
        job = self._job(ctx)
        ckpt = str(body["checkpoint_id"])
        self._ckpt_meta(job.job_id, ckpt)
        name = checks.filename(body.get("filename"))
        f = self._ckpt_root(job.job_id) / ckpt / "export" / name
        if not f.is_file():
            raise ProtocolError(
                "not_found",
                f"checkpoint {ckpt} has no exported file {name!r} (export it first)",
                checkpoint_id=ckpt,
                filename=name,
            )
        return await asyncio.to_thread(f.read_bytes)

    async def delete_checkpoint(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job = self._job(ctx)
        ckpt = str(body["checkpoint_id"])
        self._ckpt_meta(job.job_id, ckpt)
        await asyncio.to_thread(shutil.rmtree, self._ckpt_root(job.job_id) / ckpt, True)
        return {"deleted": True}

    # ------------------------------------------------------------------ colocation lifecycle

    async def _lifecycle(
        self, ctx: CallContext, cmd: str, roles: tuple[str, ...], **args: Any
    ) -> dict[str, Any]:
        job, sub = await self._begin(ctx)
        subs = [sub] if ctx.sub_job_id else [s for s in job.sub_jobs if s.role in roles]
        res = await asyncio.gather(*(self._call(s, cmd, **args) for s in subs))
        applied = any(bool(r.get("applied")) for r in res)
        reasons = sorted({str(r.get("reason") or "") for r in res} - {""})
        return {"applied": applied, "reason": "; ".join(reasons) or CPU_LIFECYCLE_REASON}

    async def sleep_inference(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        return await self._lifecycle(
            ctx, "sleep", ("sampling", "log_prob"), level=int(body.get("level") or 1)
        )

    async def wake_inference(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        return await self._lifecycle(
            ctx, "wake", ("sampling", "log_prob"), tags=list(body.get("tags") or [])
        )

    async def sleep_training(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        return await self._lifecycle(
            ctx, "sleep", ("training",), mode=str(body.get("mode") or "all")
        )

    async def wake_training(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        return await self._lifecycle(ctx, "wake", ("training",))

    # ------------------------------------------------------------------ admin

    def job_state(self, job_id: str) -> dict[str, Any]:
        """The admin view of a job: sub-jobs with pids, engine info and recent output."""
        job = self.jobs.jobs.get(job_id)
        if job is None:
            raise ProtocolError("job_not_found", f"no job {job_id!r}", job_id=job_id)
        out = job.to_json()
        out["history"] = list(job.history)
        out["workers"] = [
            {
                "sub_job_id": s.sub_job_id,
                "role": s.role,
                "state": s.state,
                "reason": s.reason,
                "model_dir": str(s.model_dir or ""),
                "pid": s.worker.pid if s.worker else None,
                "alive": bool(s.worker and s.worker.alive),
                "threads": s.worker.threads if s.worker else None,
                "info": dict(s.worker.info) if s.worker else {},
                "weight_version": s.weight_version,
                "log_tail": list(s.worker.logs)[-20:] if s.worker else [],
            }
            for s in job.sub_jobs
        ]
        return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _tail_args(payload: Mapping[str, Any]) -> tuple[int, int]:
    try:
        cursor = int(payload.get("cursor") or 0)
        limit = int(payload["limit"]) if payload.get("limit") is not None else 100
    except (TypeError, ValueError):
        raise checks.bad("payload.cursor", "cursor and limit must be integers") from None
    if cursor < 0 or not 1 <= limit <= TAIL_MAX:
        raise checks.bad(
            "payload.limit",
            f"cursor must be >= 0 and limit in [1, {TAIL_MAX}]",
            expected=f"cursor >= 0, 1 <= limit <= {TAIL_MAX}",
        )
    return cursor, limit


def _forward_body(payload: Mapping[str, Any]) -> dict[str, Any]:
    """A forward body from an operation payload: a DSSST1 envelope, or JSON with nested lists."""
    if "payload_b64" in payload:
        try:
            frame = base64.b64decode(str(payload["payload_b64"]), validate=True)
        except (binascii.Error, ValueError):
            raise checks.bad("payload.payload_b64", "is not base64", "base64_invalid") from None
        try:
            body = dssst1.loads(frame)
        except dssst1.DSSError as exc:
            raise ProtocolError(exc.code, str(exc), field="payload.payload_b64") from None
    else:
        body = dict(payload)
    if not isinstance(body, dict):
        raise checks.bad("payload", "the forward body must be an object")
    desc = descriptor_pool.Default().FindMessageTypeByName(M.FORWARD.request_type)
    try:
        validate_body(desc, body)
    except ProtocolError as exc:
        f = exc.details.get("field")
        if isinstance(f, str):
            exc.details["field"] = "payload." + f
        raise
    import numpy as np

    kw = dict(body.get("kwargs") or {})
    for k, v in list(kw.items()):
        if isinstance(v, list):
            kw[k] = np.asarray(v, dtype=np.int64)
    body["kwargs"] = kw
    ctxd = dict(body.get("context") or {})
    for k, v in list(ctxd.items()):
        if isinstance(v, list):
            ctxd[k] = np.asarray(v)
    if ctxd:
        body["context"] = ctxd
    return body
