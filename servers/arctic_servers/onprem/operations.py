"""The deployed `/operation` envelope of the on-prem server: its checks (a 4xx before anything
runs), its target sub-job, and each operation type (`protocol/operation_types.py`) run by the
data plane: weight sync, prefix-cache reset, tail-logs, cancel-request, and forward."""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import Mapping
from typing import Any

from google.protobuf import descriptor_pool

import dssst1
from arctic_sdk._generated import methods as M

from ..protocol import jobs as pj
from ..protocol.context import CallContext
from ..protocol.core import IncomingCall
from ..protocol.errors import ProtocolError
from ..protocol.operation_types import (
    OP_CANCEL,
    OP_FORWARD,
    OP_RESET,
    OP_TAIL_LOGS,
    OP_WEIGHT_SYNC,
    OPERATION_TYPES,
)
from ..protocol.validate import validate_body
from . import checks
from .dataplane import DataPlane
from .jobs import Job, SubJob

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
TAIL_MAX = 1000


class Operations(DataPlane):
    operation_types = OPERATION_TYPES

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
        if otype == OP_WEIGHT_SYNC:
            self._check_sync(job, payload, "payload.")
        elif otype == OP_CANCEL and not payload.get("request_id"):
            raise checks.bad("payload.request_id", "is required", "missing_field")
        elif otype == OP_TAIL_LOGS:
            _tail_args(payload)
        elif otype == OP_FORWARD:
            fwd = _forward_body(payload)
            sub = self._op_sub(job, body, "training")
            checks.train_body(fwd, self._vocab_of(sub), need_loss=False)

    def _op_target(self, job: Job, body: Mapping[str, Any]) -> str:
        sid, stype = body.get("sub_job_id"), body.get("sub_job_type")
        role = None
        if stype:
            role = pj.role_of(stype)
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
        if otype == OP_WEIGHT_SYNC:
            result = await self._sync(
                job, {k: v for k, v in payload.items() if k != "weight_format"}
            )
        elif otype == OP_RESET:
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
                *(self._call(s, M.RESET_PREFIX_CACHE.python_name) for s in subs if s is not None)
            )
            result = {"reset": all(bool(r.get("reset")) for r in res)}
        elif otype == OP_TAIL_LOGS:
            result = self._tail_logs(job, body, payload)
        elif otype == OP_CANCEL:
            result = await self._cancel(ctx, str(payload["request_id"]))
        else:  # forward
            sub = self._op_sub(job, body, "training")
            fwd = _forward_body(payload)
            result = dict(await self._call(sub, M.FORWARD.python_name, body=fwd))
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
