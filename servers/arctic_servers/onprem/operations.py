"""The deployed `/operation` envelope of the on-prem server: its checks (a 4xx before anything
runs), its target sub-job, and each operation type (`rules/operation_types.py`) run by the
data plane: weight sync, prefix-cache reset, tail-logs, cancel-request, and forward."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from arctic_sdk.spec.tables import methods as M

from ..protocol.context import CallContext
from ..protocol.inproc import cancel_request
from ..rules.operation_types import (
    OP_CANCEL,
    OP_RESET,
    OP_TAIL_LOGS,
    OP_WEIGHT_SYNC,
    OPERATION_TYPES,
    forward_body,
    operation_sub,
    operation_target,
    tail_args,
)
from .dataplane import DataPlane
from .jobs import Job


class Operations(DataPlane):
    operation_types = OPERATION_TYPES

    # ------------------------------------------------------------------ /operation

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
            t = operation_target(job, body)
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
            result = await cancel_request(self.core, ctx, str(payload["request_id"]))
        else:  # forward
            sub = operation_sub(job, body, "training")
            fwd = operation_forward_body(payload)
            result = dict(await self._call(sub, M.FORWARD.python_name, body=fwd))
        return {"result": result}

    def _tail_logs(
        self, job: Job, body: Mapping[str, Any], payload: Mapping[str, Any]
    ) -> dict[str, Any]:
        cursor, limit = tail_args(payload)
        t = operation_target(job, body)
        subs = [s for s in job.sub_jobs if not t or s.sub_job_id == t or s.role == t]
        lines: list[str] = []
        for s in subs:
            if s.worker is not None:
                lines += [f"[{s.sub_job_id}] {ln}" for ln in list(s.worker.logs)]
        page = lines[cursor : cursor + limit]
        end = cursor + len(page)
        return {"entries": page, "next_cursor": str(end), "eof": end >= len(lines)}


def operation_forward_body(payload: Mapping[str, Any]) -> dict[str, Any]:
    """A forward body from an operation payload (`forward_body`), its nested lists as arrays:
    `kwargs` as int64, `context` as they are."""
    body = forward_body(payload)
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
