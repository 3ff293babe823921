"""Per-op forwarding that the on-prem server and the gateway share: which sub-jobs an op reaches,
the engine command and arguments it sends them, and how their answers combine.

Each server hands in its own worker call (`call(sub, command, **args)`: a local worker process
on-prem, a keyed call that survives a restart at the gateway); the rest is written once here:
reset-prefix-cache, the colocation lifecycle (sleep / wake, one table row per op), and loading a
checkpoint into a sub-job (a trainer resumes it; a sampler or scorer takes its exported weights or
its LoRA adapter, as a new weight version).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from arctic_sdk.spec.model import MethodInfo
from arctic_sdk.spec.tables import methods as M

from .._generated.servicer import ServicerBase
from ..protocol.context import CallContext
from ..rules import checkpoint_ids
from ..rules.fields import step_args
from ..rules.jobs import JobRecord, sub_job_by_id
from . import checkpoint_files as cf
from .lora_sync import adapter_load_args

INFERENCE_ROLES = ("sampling", "log_prob")


class SubJobLike(Protocol):
    """What forwarding reads of a sub-job."""

    role: str
    weight_version: int


class JobLike(Protocol):
    """What forwarding reads and moves on a job."""

    global_step: int
    weight_version: int


class TrainingJobLike(Protocol):
    """What a step moves on a job."""

    global_step: int
    last_loss: float


S = TypeVar("S", bound=SubJobLike)
Call = Callable[..., Awaitable[Any]]  # call(sub, command, **args) -> the worker's answer
Args = Callable[[Mapping[str, Any]], dict[str, Any]]


async def run_on_engine(
    job: JobLike, sub: Any, method: MethodInfo, body: Mapping[str, Any], call: Call
) -> dict[str, Any]:
    """An `engine` op (the method table's `engine`): the sub-job's engine command named by the
    op runs the body; the result's metrics carry the job's global step (`Metrics.global_step`:
    a reference model or a sampler does not know it)."""
    res = dict(await call(sub, method.python_name, body=body))
    res.setdefault("metrics", {})["global_step"] = job.global_step
    return res


async def step(
    job: TrainingJobLike, sub: Any, body: Mapping[str, Any], call: Call
) -> dict[str, Any]:
    """Step on the trainer (`learning_rate`: None = the schedule's); the job's global step and
    last loss follow the trainer's answer."""
    res = dict(await call(sub, M.STEP.python_name, **step_args(body)))
    metrics = res.get("metrics") or {}
    job.global_step = int(metrics.get("global_step", job.global_step))
    job.last_loss = float(metrics.get("loss") or 0.0)
    return res


#: op name -> (engine command, roles it reaches when the call names no sub-job, its arguments)
LIFECYCLE: Mapping[str, tuple[str, tuple[str, ...], Args]] = {
    M.SLEEP_INFERENCE.name: (
        "sleep",
        INFERENCE_ROLES,
        lambda b: {"level": int(b.get("level") or 1)},
    ),
    M.WAKE_INFERENCE.name: ("wake", INFERENCE_ROLES, lambda b: {"tags": list(b.get("tags") or [])}),
    M.SLEEP_TRAINING.name: (
        "sleep",
        ("training",),
        lambda b: {"mode": str(b.get("mode") or "all")},
    ),
    M.WAKE_TRAINING.name: ("wake", ("training",), lambda b: {}),
}


async def reset_prefix_cache(
    subs: Sequence[S], target: S, named: bool, call: Call
) -> dict[str, Any]:
    """The named sub-job, else every sampler and scorer (else the target): all must reset."""
    reached = [target] if named else [s for s in subs if s.role in INFERENCE_ROLES] or [target]
    cmd = M.RESET_PREFIX_CACHE.python_name
    res = await asyncio.gather(*(call(s, cmd) for s in reached))
    return {"reset": all(bool(r.get("reset")) for r in res)}


async def lifecycle(
    method: MethodInfo,
    body: Mapping[str, Any],
    subs: Sequence[S],
    target: S,
    named: bool,
    call: Call,
    idle_reason: str,
) -> dict[str, Any]:
    """Sleep or wake the named sub-job, else every sub-job of the op's roles (`LIFECYCLE`):
    applied when any was, with their reasons (`idle_reason` when none gives one)."""
    cmd, roles, args = LIFECYCLE[method.name]
    reached = [target] if named else [s for s in subs if s.role in roles]
    res = await asyncio.gather(*(call(s, cmd, **args(body)) for s in reached))
    applied = any(bool(r.get("applied")) for r in res)
    reasons = sorted({str(r.get("reason") or "") for r in res} - {""})
    return {"applied": applied, "reason": "; ".join(reasons) or idle_reason}


def load_source(
    job: JobRecord[Any],
    ctx: CallContext,
    body: Mapping[str, Any],
    target: Callable[[], S],
    visible: Callable[[str], object],
) -> tuple[S, str, str]:
    """A load-checkpoint's (sub-job, checkpoint id, source job): `target_sub_job_id` (any
    sub-job: a sampler loads the exported weights) else `target()`; the source job, another one
    only when the caller's token sees it (`visible`; checked when the call was accepted too, so a
    request resumed after a restart is not checked again without its token)."""
    tid = body.get("target_sub_job_id")
    sub: S = sub_job_by_id(job, tid) if tid else target()
    source = str(body.get("source_job_id") or job.job_id)
    if not ctx.resumed:
        checkpoint_ids.check_source_job(body, job.job_id, visible)
    return sub, str(body["checkpoint_id"]), source


async def load_checkpoint(
    job: JobLike,
    sub: S,
    root: Path,
    meta: Mapping[str, Any],
    call: Call,
    *,
    ckpt: str,
    adapter_job: bool,
    export: Callable[[], Awaitable[Path]],
    any_role: bool = False,
) -> None:
    """Load checkpoint `ckpt` (at `root`) into `sub`: a trainer (or any role, `any_role`: the
    fake engine's workers) runs the engine's `load`; the sampler of an adapter job
    (`adapter_job`, PROTOCOL.md §3.6) loads the checkpoint's adapter as a new adapter version;
    another sampler or scorer the exported HF weights (`export()`, made on first use), as the
    job's next weight version. Moves `job.global_step` (a trainer) or the weight versions."""
    if sub.role == "training" or any_role:
        # the engine command (op_load, DeepSpeed's load_checkpoint), not the op's name
        res = await call(sub, "load", **cf.load_args(root, meta))  # not-an-op
    else:
        if adapter_job and sub.role == "sampling":
            load = adapter_load_args(root / cf.ENGINE_TAG, ckpt)
        else:
            load = {"path": str((await export()) / cf.EXPORT_WEIGHTS)}
        # the version its results report from now on (the sampler reports what it was given)
        res = await call(sub, "load_weights", **load, weight_version=job.weight_version + 1)
    if sub.role == "training":
        job.global_step = int(res.get("global_steps", job.global_step))
    else:
        job.weight_version += 1
        sub.weight_version = job.weight_version


class WorkerForwarding(ServicerBase):
    """The ops a server with engine workers forwards as they come (the on-prem server and the
    gateway): every `engine` op and step, written once here. A server says how a call finds its
    job and target sub-job (`begin_on_worker`: running, or refused) and how it reaches that
    sub-job's worker (`worker_call`); `job_stepped` lets it persist the moved step."""

    async def begin_on_worker(self, ctx: CallContext) -> tuple[Any, Any]:
        raise NotImplementedError

    def worker_call(self, ctx: CallContext) -> Call:
        raise NotImplementedError

    def job_stepped(self, job: Any) -> None:
        """After a step moved the job's global step and last loss (default: nothing)."""

    async def run_on_engine(
        self, ctx: CallContext, method: MethodInfo, body: dict[str, Any]
    ) -> dict[str, Any]:
        job, sub = await self.begin_on_worker(ctx)
        return await run_on_engine(job, sub, method, body, self.worker_call(ctx))

    async def step(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job, sub = await self.begin_on_worker(ctx)
        res = await step(job, sub, body, self.worker_call(ctx))
        self.job_stepped(job)
        return res
