"""The fake engine's `/operation` envelope, weight sync, and the checks of the small JSON ops.

The gateway runs the same checks on its requests (`gateway/servicer.py`), so both servers refuse
the same bodies with the same codes."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from arctic_sdk.spec.model import MethodInfo
from arctic_sdk.spec.tables import methods as M

from ...protocol import checkpoint_ids
from ...protocol.collective_sync import SYNC_METHODS, file_sync_result
from ...protocol.context import CallContext
from ...protocol.jobs import sub_job_by_id
from ...protocol.lora_config import adapter_sync, check_weight_format, job_lora
from ...protocol.operation_types import (
    OP_FORWARD,
    OP_WEIGHT_SYNC,
    check_operation,
    forward_body,
    tail_args,
)
from ...protocol.sub_jobs import check_sync_sub_jobs, field_error, sync_sub_jobs
from . import checkpoints as ck
from .state import Job


def _one_of(body: Mapping[str, Any], name: str, allowed: tuple[str, ...], path: str = "") -> None:
    v = body.get(name)
    if v not in (None, "") and v not in allowed:
        raise field_error(
            path + name, f"{v!r} is not one of {list(allowed)}", expected=list(allowed)
        )


def check_simple(
    job: Job, m: MethodInfo, body: Mapping[str, Any], visible: Callable[[str], object]
) -> None:
    """Checks of the JSON-bodied and body-less data-plane ops (the fields' values and bounds
    are the spec's, checked on arrival by the protocol layer); `visible(job_id)` answers a job
    the caller may load a checkpoint from, or raises."""
    if m is M.SAVE_CHECKPOINT:
        ck.check_save(body)
    elif m is M.SYNC_WEIGHTS:
        check_sync(job, body, "")
    elif m in (M.EXPORT_CHECKPOINT, M.DELETE_CHECKPOINT, M.DOWNLOAD_CHECKPOINT_FILE):
        ck.check_id(body.get("checkpoint_id"))  # the spec's rule: a name, never a path
        if m is M.DOWNLOAD_CHECKPOINT_FILE:
            checkpoint_ids.check_filename(body.get("filename"))
    elif m is M.LOAD_CHECKPOINT:
        ck.check_id(body.get("checkpoint_id"))
        target = body.get("target_sub_job_id")
        if target:
            sub_job_by_id(job, target)
        checkpoint_ids.check_source_job(body, job.job_id, visible)


def check_sync(job: Job, body: Mapping[str, Any], path: str) -> None:
    _one_of(body, "method", SYNC_METHODS, path)
    check_sync_sub_jobs(job, body, path)
    lora = adapter_sync(job_lora([(s.role, s.config) for s in job.sub_jobs]))
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
    # (an embedding / lm_head adapter: merged full weights, PROTOCOL.md §3.6)
    n_tensors, n_bytes = (1, 4 * 259)
    if lora is not None and adapter_sync(lora):
        n_tensors, n_bytes = (2, 2 * 4 * 259 * int(lora["rank"]))
    ran = "shm" if method == "auto" else "collective" if method == "nccl" else method
    moved = {"num_tensors": n_tensors, "num_bytes": n_bytes}
    return {"weight_version": job.weight_version, **file_sync_result(ran, moved, 0.0)}


# ---------------------------------------------------------------------------- /operation


class OperationChecks(Protocol):
    """What `check` needs of its server: the operation types it serves, the model's vocabulary."""

    @property
    def operation_types(self) -> Iterable[str]: ...

    @property
    def vocab_size(self) -> int: ...


def check(svc: OperationChecks, job: Job, ctx: CallContext, body: Mapping[str, Any]) -> None:
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
