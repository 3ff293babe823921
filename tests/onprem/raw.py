"""A raw arctic.v1 client for the on-prem tests: aiohttp + dssst1 chunk frames, and raw gRPC.

No SDK on purpose: these tests pin the server to the wire protocol itself. The wire helpers are
shared with the fake's tests (tests/rawwire.py); here a failed call raises `CallError`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from arctic_sdk.spec.model import MethodInfo
from arctic_sdk.spec.tables import methods as M

from ..rawwire import RawGrpc, RawHttp, Resp


class CallError(Exception):
    def __init__(self, status: int, code: str, body: dict[str, Any]):
        super().__init__(f"{status} {code}: {body}")
        self.status = status
        self.code = code
        self.body = body


def _refused(resp: Resp) -> CallError:
    err = resp.data.get("error", {}) if isinstance(resp.data, dict) else {}
    return CallError(resp.status, str(err.get("code")), err)


class Http(RawHttp):
    async def result(self, resp: Resp, job: str) -> Any:
        if resp.status not in (200, 202):
            raise _refused(resp)
        status = await self.until_terminal(resp.data, job, every_s=0.02)
        if status["status"] != "completed":
            err = status.get("error") or {}
            raise CallError(200, str(err.get("code")), err)
        return await self.result_of(status, job)

    async def run(
        self,
        method: MethodInfo,
        job: str,
        value: Any = None,
        *,
        headers: dict[str, str] | None = None,
        **params: str,
    ) -> Any:
        """Call an op (DSSST1 or JSON body) and return its result; CallError on failure."""
        if method.body.value == "dssst1":
            resp = await self.dss(method, job, value, headers=headers)
        else:
            resp = await self.call(method, value, headers=headers, job_id=job, **params)
        if method.response_type == "":
            if resp.status != 200:
                raise CallError(resp.status, str(resp.code), resp.data)
            return resp.data
        return await self.result(resp, job)

    async def control(self, method: MethodInfo, body: Any = None, **params: str) -> Any:
        resp = await self.call(method, body, **params)
        if resp.status != 200:
            raise _refused(resp)
        return resp.data

    async def create_job(self, configs: list[dict[str, Any]], **extra: Any) -> str:
        res = await self.control(M.CREATE_JOB, {"sub_job_configs": configs, **extra})
        return str(res["job_id"])

    async def get_job(self, job: str) -> dict[str, Any]:
        res = await self.control(M.GET_JOB, job_id=job)
        return dict(res["job"])

    async def wait_running(self, job: str, timeout: float = 300.0) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            j = await self.get_job(job)
            if j["state"] == "running":
                return j
            if j["state"] in ("failed", "cancelled", "terminated"):
                raise AssertionError(f"job {job} ended while starting: {j}")
            if loop.time() > deadline:
                raise AssertionError(f"job {job} not running after {timeout} s: {j}")
            await asyncio.sleep(0.1)


class Grpc(RawGrpc):
    async def run(self, method: MethodInfo, job: str, value: Any) -> Any:
        """One data-plane RPC whose answer stream ends completed; its result."""
        status = await self.frames(method, job, value)
        assert status["status"] == "completed", status
        return status["result"]
