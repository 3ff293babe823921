"""The fake engine's weight sync and `/operation` tail-logs, and the weight-sync checks the fake
gateway and the gateway share (their `CallFacts.check_sync`; every other check is the servers'
one per-op table, `engines/op_checks.py`), so both refuse the same bodies with the same codes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...rules.jobs import JobRecord
from ...rules.lora_config import adapter_sync, check_weight_format, job_lora
from ...rules.operation_types import tail_args
from ...rules.sub_jobs import check_sync_sub_jobs, field_error, sync_sub_jobs
from ...rules.weight_sync import SYNC_METHODS, file_sync_result
from .state import Job


def _one_of(body: Mapping[str, Any], name: str, allowed: tuple[str, ...], path: str = "") -> None:
    v = body.get(name)
    if v not in (None, "") and v not in allowed:
        raise field_error(
            path + name, f"{v!r} is not one of {list(allowed)}", expected=list(allowed)
        )


def check_sync(job: JobRecord[Any], body: Mapping[str, Any], path: str) -> None:
    """A weight sync's method, targets and weight format (any server's job: the gateway's too)."""
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
