"""The `/operation` envelope, weight sync, and the checks of the small JSON-bodied ops."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from google.protobuf import descriptor_pool

import dssst1
from arctic_sdk._generated import methods as M
from arctic_sdk._spec import MethodInfo
from arctic_servers.protocol.context import CallContext
from arctic_servers.protocol.core import IncomingCall
from arctic_servers.protocol.errors import ProtocolError
from arctic_servers.protocol.jobs import role_of
from arctic_servers.protocol.operation_types import (
    OP_CANCEL,
    OP_FORWARD,
    OP_RESET,
    OP_TAIL_LOGS,
    OP_WEIGHT_SYNC,
)
from arctic_servers.protocol.validate import validate_body

from . import checkpoints as ck
from .jobs import Job

if TYPE_CHECKING:
    from .servicer import FakeServicer

SYNC_METHODS = ("auto", "nccl", "cuda_ipc", "shm", "safetensors")
WAKE_TAGS = ("weights", "kv_cache")
SLEEP_MODES = ("all", "optimizer", "weights")
TAIL_MAX = 1000
_PAYLOAD_KEYS = {
    OP_WEIGHT_SYNC: {
        "source_sub_job_id",
        "target_sub_job_ids",
        "method",
        "cuda_ipc",
        "low_memory",
        "weight_format",
    },
    OP_RESET: {"drain", "timeout_s", "retry_interval_s"},
    OP_CANCEL: {"request_id"},
    OP_TAIL_LOGS: {"cursor", "limit"},
}


def _bad(path: str, message: str, code: str = "invalid_argument", **details: Any) -> ProtocolError:
    return ProtocolError(code, f"field {path}: {message}", field=path, **details)


def _one_of(body: Mapping[str, Any], name: str, allowed: tuple[str, ...], path: str = "") -> None:
    v = body.get(name)
    if v not in (None, "") and v not in allowed:
        raise _bad(path + name, f"{v!r} is not one of {list(allowed)}", expected=list(allowed))


def check_simple(job: Job, m: MethodInfo, body: Mapping[str, Any]) -> None:
    """Checks of the JSON-bodied and body-less data-plane ops."""
    if m is M.SYNC_WEIGHTS:
        check_sync(job, body, "")
    elif m is M.RESET_PREFIX_CACHE:
        if float(body.get("timeout_s") or 0) < 0:
            raise _bad("timeout_s", "is negative", expected=">= 0")
    elif m is M.SLEEP_INFERENCE:
        level = int(body.get("level") or 0)
        if level not in (0, 1, 2):
            raise _bad("level", f"{level} is not 1 or 2", expected=[1, 2])
    elif m is M.WAKE_INFERENCE:
        for i, tag in enumerate(body.get("tags") or []):
            if tag not in WAKE_TAGS:
                raise _bad(
                    f"tags[{i}]",
                    f"{tag!r} is not one of {list(WAKE_TAGS)}",
                    expected=list(WAKE_TAGS),
                )
    elif m is M.SLEEP_TRAINING:
        _one_of(body, "mode", SLEEP_MODES)
    elif m in (M.EXPORT_CHECKPOINT, M.DELETE_CHECKPOINT, M.DOWNLOAD_CHECKPOINT_FILE):
        for name in (
            ("checkpoint_id", "filename") if m is M.DOWNLOAD_CHECKPOINT_FILE else ("checkpoint_id",)
        ):
            if not body.get(name):
                raise _bad(name, "is required", code="missing_field")
    elif m is M.LOAD_CHECKPOINT:
        if not body.get("checkpoint_id"):
            raise _bad("checkpoint_id", "is required", code="missing_field")
        ck.check_id(str(body["checkpoint_id"]))
        target = body.get("target_sub_job_id")
        if target and job.find_sub_job(str(target)) is None:
            raise ProtocolError(
                "sub_job_not_found",
                f"no sub-job {target!r} in job {job.job_id}",
                sub_job_id=target,
                job_id=job.job_id,
            )


def check_sync(job: Job, body: Mapping[str, Any], path: str) -> None:
    _one_of(body, "method", SYNC_METHODS, path)
    src = body.get("source_sub_job_id")
    if src:
        sub = job.find_sub_job(str(src))
        if sub is None:
            raise ProtocolError(
                "sub_job_not_found",
                f"no sub-job {src!r} in job {job.job_id}",
                sub_job_id=src,
                job_id=job.job_id,
            )
        if sub.role != "training":
            raise _bad(
                path + "source_sub_job_id",
                f"{src} is a {sub.role} sub-job",
                expected="a training sub-job",
            )
    for i, tid in enumerate(body.get("target_sub_job_ids") or []):
        sub = job.find_sub_job(str(tid))
        if sub is None:
            raise ProtocolError(
                "sub_job_not_found",
                f"no sub-job {tid!r} in job {job.job_id}",
                sub_job_id=tid,
                job_id=job.job_id,
            )
        if sub.role == "training":
            raise _bad(
                f"{path}target_sub_job_ids[{i}]",
                f"{tid} is a training sub-job",
                expected="sampling or log_prob sub-jobs",
            )


def sync(job: Job, body: Mapping[str, Any]) -> dict[str, Any]:
    """Copy the trainer's model step into the targets; bump weight_version (NUMERICS.md §6)."""
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
    for tid in ids:
        target = job.find_sub_job(str(tid))
        if target is not None:
            target.model_step = src.model_step
    job.weight_version += 1
    method = body.get("method") or "auto"
    return {
        "weight_version": job.weight_version,
        "method": "shm" if method == "auto" else method,
        "num_tensors": 1,
        "num_bytes": 4 * 259,
        "seconds": 0.0,
    }


# ---------------------------------------------------------------------------- /operation


def _forward_body(payload: Mapping[str, Any]) -> dict[str, Any]:
    """A forward body from an operation payload: a DSSST1 envelope, or JSON with nested lists."""
    if "payload_b64" in payload:
        try:
            frame = base64.b64decode(str(payload["payload_b64"]), validate=True)
        except (binascii.Error, ValueError):
            raise _bad("payload.payload_b64", "is not base64", code="base64_invalid") from None
        try:
            body = dssst1.loads(frame)
        except dssst1.DSSError as exc:
            raise ProtocolError(exc.code, str(exc), field="payload.payload_b64") from None
    else:
        body = dict(payload)
    if not isinstance(body, dict):
        raise _bad("payload", "the forward body must be an object")
    desc = descriptor_pool.Default().FindMessageTypeByName(M.FORWARD.request_type)
    try:
        validate_body(desc, body)
    except ProtocolError as exc:
        field = exc.details.get("field")
        if isinstance(field, str):
            exc.details["field"] = "payload." + field
        raise
    return body


def check(svc: FakeServicer, job: Job, ctx: CallContext, body: Mapping[str, Any]) -> None:
    """The `/operation` envelope (PROTOCOL.md §3.4, jobs.proto OperationRequest)."""
    otype = body.get("operation_type") or ""
    if not otype:
        raise _bad("operation_type", "is required", code="missing_field")
    if otype not in svc.operation_types:
        raise ProtocolError(
            "unknown_operation_type",
            f"operation_type {otype!r} is not one of {list(svc.operation_types)}",
            field="operation_type",
            operation_type=otype,
            expected=list(svc.operation_types),
        )
    target(job, body)
    payload: Mapping[str, Any] = body.get("payload") or {}
    keys = _PAYLOAD_KEYS.get(otype)
    if keys is not None:
        unknown = sorted(set(payload) - keys)
        if unknown:
            raise _bad(
                f"payload.{unknown[0]}",
                f"unknown payload field(s) {unknown} for {otype}; expected {sorted(keys)}",
                unknown_fields=unknown,
            )
    if otype == OP_WEIGHT_SYNC:
        check_sync(job, payload, "payload.")
    elif otype == OP_CANCEL and not payload.get("request_id"):
        raise _bad("payload.request_id", "is required", code="missing_field")
    elif otype == OP_TAIL_LOGS:
        _tail_args(payload)
    elif otype == OP_FORWARD:
        from . import training

        training.parse_train(_forward_body(payload), svc.vocab_size, need_loss=False)


def target(job: Job, body: Mapping[str, Any]) -> str:
    """The envelope's target role; `sub_job_id` and `sub_job_type` must agree when both given."""
    sid, stype = body.get("sub_job_id"), body.get("sub_job_type")
    role = None
    if stype:
        role = role_of(stype)
        if role is None:
            raise _bad(
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
            raise _bad(
                "sub_job_type", f"{stype!r} disagrees with sub_job_id {sid}", expected=sub.role
            )
        return sid if isinstance(sid, str) else str(sid)
    return role or ""


def _tail_args(payload: Mapping[str, Any]) -> tuple[int, int]:
    try:
        cursor = int(payload.get("cursor") or 0)
        limit = int(payload["limit"]) if payload.get("limit") is not None else 100
    except (TypeError, ValueError):
        raise _bad("payload.cursor", "cursor and limit must be integers") from None
    if cursor < 0 or not 1 <= limit <= TAIL_MAX:
        raise _bad(
            "payload.limit",
            f"cursor must be >= 0 and limit in [1, {TAIL_MAX}]",
            expected=f"cursor >= 0, 1 <= limit <= {TAIL_MAX}",
        )
    return cursor, limit


def tail_logs(job: Job, payload: Mapping[str, Any]) -> dict[str, Any]:
    cursor, limit = _tail_args(payload)
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
        result = await _cancel(svc, ctx, str(payload["request_id"]))
    else:  # forward
        from .servicer import forward_result

        sid = target(job, body)
        sub = job.find_sub_job(sid) or job.sub_job(sid or "training") or job.sub_job("training")
        if sub is None:
            raise ProtocolError(
                "sub_job_not_found", f"job {job.job_id} has no training sub-job", job_id=job.job_id
            )
        result = forward_result(svc, job, sub, _forward_body(payload))
    return {"result": result}


async def _cancel(svc: FakeServicer, ctx: CallContext, request_id: str) -> dict[str, Any]:
    if svc.core is None:
        raise ProtocolError("unimplemented", "cancel-request needs the protocol core attached")
    call = IncomingCall(
        method=M.CANCEL_REQUEST,
        transport=ctx.transport,
        headers=ctx.headers,
        path_params={"job_id": ctx.job_id or "", "request_id": request_id},
    )
    outcome = await svc.core.handle(call)
    value: dict[str, Any] = outcome.value
    return value
