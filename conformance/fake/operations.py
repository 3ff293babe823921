"""The `/operation` envelope, weight sync, and the checks of the small JSON-bodied ops."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from arctic_sdk.spec.model import MethodInfo
from arctic_sdk.spec.tables import methods as M
from arctic_servers.protocol import checkpoint_ids
from arctic_servers.protocol.context import CallContext
from arctic_servers.protocol.errors import ProtocolError
from arctic_servers.protocol.jobs import sub_job_by_id
from arctic_servers.protocol.lora_config import check_weight_format, job_lora
from arctic_servers.protocol.operation_types import (
    OP_CANCEL,
    OP_FORWARD,
    OP_RESET,
    OP_TAIL_LOGS,
    OP_WEIGHT_SYNC,
    cancel_request,
    check_operation,
    forward_body,
    operation_target,
    tail_args,
)
from arctic_servers.protocol.sub_jobs import check_sync_sub_jobs, field_error, sync_sub_jobs

from . import checkpoints as ck
from .jobs import Job

if TYPE_CHECKING:
    from .servicer import FakeServicer

SYNC_METHODS = ("auto", "nccl", "cuda_ipc", "shm", "safetensors")
WAKE_TAGS = ("weights", "kv_cache")
SLEEP_MODES = ("all", "optimizer", "weights")


def _one_of(body: Mapping[str, Any], name: str, allowed: tuple[str, ...], path: str = "") -> None:
    v = body.get(name)
    if v not in (None, "") and v not in allowed:
        raise field_error(
            path + name, f"{v!r} is not one of {list(allowed)}", expected=list(allowed)
        )


def check_simple(job: Job, m: MethodInfo, body: Mapping[str, Any]) -> None:
    """Checks of the JSON-bodied and body-less data-plane ops."""
    if m is M.SYNC_WEIGHTS:
        check_sync(job, body, "")
    elif m is M.RESET_PREFIX_CACHE:
        if float(body.get("timeout_s") or 0) < 0:
            raise field_error("timeout_s", "is negative", expected=">= 0")
    elif m is M.SLEEP_INFERENCE:
        level = int(body.get("level") or 0)
        if level not in (0, 1, 2):
            raise field_error("level", f"{level} is not 1 or 2", expected=[1, 2])
    elif m is M.WAKE_INFERENCE:
        for i, tag in enumerate(body.get("tags") or []):
            if tag not in WAKE_TAGS:
                raise field_error(
                    f"tags[{i}]",
                    f"{tag!r} is not one of {list(WAKE_TAGS)}",
                    expected=list(WAKE_TAGS),
                )
    elif m is M.SLEEP_TRAINING:
        _one_of(body, "mode", SLEEP_MODES)
    elif m in (M.EXPORT_CHECKPOINT, M.DELETE_CHECKPOINT, M.DOWNLOAD_CHECKPOINT_FILE):
        ck.check_id(body.get("checkpoint_id"))  # the spec's rule: a name, never a path
        if m is M.DOWNLOAD_CHECKPOINT_FILE:
            checkpoint_ids.check_filename(body.get("filename"))
    elif m is M.LOAD_CHECKPOINT:
        ck.check_id(body.get("checkpoint_id"))
        target = body.get("target_sub_job_id")
        if target:
            sub_job_by_id(job, target)


def check_sync(job: Job, body: Mapping[str, Any], path: str) -> None:
    _one_of(body, "method", SYNC_METHODS, path)
    check_sync_sub_jobs(job, body, path)
    lora = job_lora([(s.role, s.config) for s in job.sub_jobs]) is not None
    check_weight_format(body, lora, path)


def sync(job: Job, body: Mapping[str, Any]) -> dict[str, Any]:
    """Copy the trainer's model step into the targets; bump weight_version (NUMERICS.md §6)."""
    src, targets = sync_sub_jobs(job, body)
    for target in targets:
        target.model_step = src.model_step
    job.weight_version += 1
    method = body.get("method") or "auto"
    lora = job_lora([(s.role, s.config) for s in job.sub_jobs])
    # a LoRA job moves its adapter only: A (rank x 259) and B (259 x rank), fp32 (NUMERICS §6)
    n_tensors, n_bytes = (1, 4 * 259) if lora is None else (2, 2 * 4 * 259 * int(lora["rank"]))
    return {
        "weight_version": job.weight_version,
        "method": "shm" if method == "auto" else method,
        "num_tensors": n_tensors,
        "num_bytes": n_bytes,
        "seconds": 0.0,
    }


# ---------------------------------------------------------------------------- /operation


def check(svc: FakeServicer, job: Job, ctx: CallContext, body: Mapping[str, Any]) -> None:
    """The `/operation` envelope (PROTOCOL.md §3.4, jobs.proto OperationRequest)."""
    otype, payload = check_operation(job, body, svc.operation_types)
    if otype == OP_WEIGHT_SYNC:
        check_sync(job, payload, "payload.")
    elif otype == OP_FORWARD:
        from . import training

        training.parse_train(forward_body(payload), svc.vocab_size)


def tail_logs(job: Job, payload: Mapping[str, Any]) -> dict[str, Any]:
    cursor, limit = tail_args(payload)
    log = job.execution_log
    page = log[cursor : cursor + limit]
    lines = [
        f"#{e['index']} {e['op']} request_id={e['request_id']} seq={e['seq']} "
        f"transport={e['transport']}"
        for e in page
    ]
    end = cursor + len(page)
    return {"entries": lines, "next_cursor": str(end), "eof": end >= len(log)}


async def run(
    svc: FakeServicer, job: Job, ctx: CallContext, body: Mapping[str, Any]
) -> dict[str, Any]:
    otype = str(body["operation_type"])
    payload: Mapping[str, Any] = body.get("payload") or {}
    svc._log(job, ctx, operation_type=otype)
    if otype == OP_WEIGHT_SYNC:
        result = sync(job, {k: v for k, v in payload.items() if k != "weight_format"})
    elif otype == OP_RESET:
        result = {"reset": True}
    elif otype == OP_TAIL_LOGS:
        result = tail_logs(job, payload)
    elif otype == OP_CANCEL:
        result = await cancel_request(svc.core, ctx, str(payload["request_id"]))
    else:  # forward
        from .servicer import forward_result

        sid = operation_target(job, body)
        sub = job.find_sub_job(sid) or job.sub_job(sid or "training") or job.sub_job("training")
        if sub is None:
            raise ProtocolError(
                "sub_job_not_found", f"job {job.job_id} has no training sub-job", job_id=job.job_id
            )
        result = forward_result(svc, job, sub, forward_body(payload))
    return {"result": result}
