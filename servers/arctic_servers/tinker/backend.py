"""The protocol side of the Tinker surface: our own ops, as arctic.v1 bodies handed to the
server's protocol core in this process (`protocol/inproc.py`), with the caller's token.

So a Tinker call is served by the same core (auth, input limits, the field rules, the servicer's
per-op checks, idempotency, the request record), jobs and engines as a native call — on the
on-prem server, the gateway or the fake gateway alike — without an HTTP hop or a DSSST1 frame:
the arrays the surface builds are the arrays the servicer reads. Nothing of the protocol is
re-implemented here. The order of a model's calls is the surface's (`state.Model`, Tinker's
`seq_id` turns): each call is awaited before the model's next turn starts, so its calls carry
no `X-Arctic-Seq`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from arctic_sdk.spec.tables import methods as M

from ..protocol.core import ProtocolCore
from ..protocol.inproc import CoreCalls

__all__ = ["Backend"]


class Backend:
    """Protocol calls on one server's core."""

    def __init__(self, core: ProtocolCore) -> None:
        self.calls = CoreCalls(core)

    async def create_job(
        self, token: str | None, body: Mapping[str, Any], key: str | None = None
    ) -> str:
        """Create the job and wait for it to run; `key` its Idempotency-Key (a resent create
        answers the same job)."""
        res = await self.calls.call(M.CREATE_JOB, token, body, key=key)
        job_id = str(res["job_id"])
        for _ in range(3600):
            job = (await self.calls.call(M.GET_JOB, token, job_id=job_id))["job"]
            state = str(job.get("state", "")).lower()
            if state.endswith("running"):
                return job_id
            if any(state.endswith(s) for s in ("failed", "cancelled", "terminated")):
                raise RuntimeError(f"job {job_id} is {state}: {job.get('reason', '')}")
            await asyncio.sleep(0.2)
        raise TimeoutError(f"job {job_id} did not start")

    async def forward_backward(
        self, token: str | None, job_id: str, body: Mapping[str, Any], *, forward_only: bool
    ) -> Any:
        method = M.FORWARD if forward_only else M.FORWARD_BACKWARD
        return await self.calls.call(method, token, body, job_id=job_id)

    async def step(
        self,
        token: str | None,
        job_id: str,
        lr: float,
        adam: Mapping[str, float] | None = None,
        key: str | None = None,
    ) -> Any:
        body: dict[str, Any] = {"learning_rate": lr}
        if adam:
            body["adam"] = dict(adam)
        return await self.calls.call(M.STEP, token, body, job_id=job_id, key=key)

    async def sync(self, token: str | None, job_id: str) -> int:
        res = await self.calls.call(M.SYNC_WEIGHTS, token, {}, job_id=job_id)
        return int(res.get("weight_version") or 0)

    async def save(self, token: str | None, job_id: str, checkpoint_id: str) -> Any:
        body = {"checkpoint_id": checkpoint_id, "checkpoint_type": "resumable"}
        return await self.calls.call(M.SAVE_CHECKPOINT, token, body, job_id=job_id)

    async def load(
        self, token: str | None, job_id: str, checkpoint_id: str, source_job_id: str
    ) -> Any:
        body = {"checkpoint_id": checkpoint_id}
        if source_job_id != job_id:
            body["source_job_id"] = source_job_id
        return await self.calls.call(M.LOAD_CHECKPOINT, token, body, job_id=job_id)

    async def generate(
        self, token: str | None, job_id: str, prompt: list[int], params: Mapping[str, Any]
    ) -> Any:
        body = {"prompts": [prompt], "sampling_params": dict(params)}
        return await self.calls.call(M.GENERATE, token, body, job_id=job_id)

    async def cancel(self, token: str | None, job_id: str) -> None:
        await self.calls.call(M.CANCEL_JOB, token, job_id=job_id)

    async def close(self) -> None:
        """Nothing to close: no connections (kept for the surface's shutdown path)."""
