"""The fake gateway's `/operation` runner, over the fake engine's checks and weight sync."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from arctic_sdk.spec.tables import methods as M
from arctic_servers.engines.fake.operations import sync, tail_logs
from arctic_servers.engines.fake.state import Job
from arctic_servers.protocol.context import CallContext
from arctic_servers.protocol.inproc import cancel_request
from arctic_servers.rules.errors import ProtocolError
from arctic_servers.rules.operation_types import (
    OP_CANCEL,
    OP_RESET,
    OP_TAIL_LOGS,
    OP_WEIGHT_SYNC,
    forward_body,
    operation_target,
)

if TYPE_CHECKING:
    from .servicer import FakeServicer


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
        from .servicer import engine_command

        sid = operation_target(job, body)
        sub = job.find_sub_job(sid) or job.sub_job(sid or "training") or job.sub_job("training")
        if sub is None:
            raise ProtocolError(
                "sub_job_not_found", f"job {job.job_id} has no training sub-job", job_id=job.job_id
            )
        result = engine_command(job, sub, M.FORWARD.python_name, body=forward_body(payload))
    return {"result": result}
