"""Raw HTTP and gRPC clients for the fake gateway's tests: no SDK; method table + dssst1.

The wire helpers are shared with the on-prem tests (tests/rawwire.py); this module binds them to
a running fake (its token, its prefix and admin URLs) and asserts every result completed.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import grpc

from arctic_sdk.spec.model import MethodInfo
from arctic_sdk.spec.tables import methods as M
from conformance.fake import RunningFake

from ..rawwire import OCTET, TERMINAL, GrpcError, RawGrpc, RawHttp, Resp, chunks_of
from ..rawwire import pad as batch

__all__ = ["OCTET", "TOKEN", "Grpc", "GrpcError", "Http", "batch", "chunks_of"]

TOKEN = "test-token"
TRAIN_SAMPLE = (
    {"job_type": "training", "model_name": "fake-model"},
    {"job_type": "sampling", "model_name": "fake-model"},
)


class Http(RawHttp):
    token_type = "PROGRAMMATIC_ACCESS_TOKEN"

    def __init__(
        self, session: aiohttp.ClientSession, fake: RunningFake, token: str | None = TOKEN
    ):
        super().__init__(session, fake.prefix_url, token)
        self.fake = fake

    async def result(self, resp: Resp, job: str) -> Any:
        """The result of a 200/202 answer: polls until terminal, drains result_chunk events."""
        assert resp.status in (200, 202), (resp.status, resp.data)
        status = await self.until_terminal(resp.data, job)
        assert status["status"] == "completed", status
        return await self.result_of(status, job)

    async def run(self, method: MethodInfo, job: str, value: Any = None, **kw: Any) -> Any:
        """Call an op (DSSST1 or JSON) and return its result."""
        if method.body.value == "dssst1":
            resp = await self.dss(method, job, value, **kw)
        else:
            resp = await self.call(method, value, job_id=job, **kw)
        return await self.result(resp, job)

    async def create_job(self, configs: Any = TRAIN_SAMPLE, **extra: Any) -> str:
        resp = await self.call(M.CREATE_JOB, {"sub_job_configs": list(configs), **extra})
        assert resp.status == 200, resp.data
        return str(resp.data["job_id"])

    async def admin(self, verb: str, path: str, body: Any = None) -> Resp:
        kw = {"json": body} if body is not None else {}
        return await self.request(verb, self.fake.admin_url + path, **kw)

    async def state(self, job: str) -> dict[str, Any]:
        resp = await self.admin("GET", f"/jobs/{job}/state")
        assert resp.status == 200, resp.data
        data: dict[str, Any] = resp.data
        return data


class Grpc(RawGrpc):
    def __init__(self, channel: grpc.aio.Channel, token: str | None = TOKEN):
        super().__init__(channel, token)

    async def result(self, method: MethodInfo, job: str, value: Any, **kw: Any) -> Any:
        status = await self.frames(method, job, value, **kw)
        while status["status"] not in TERMINAL:
            await asyncio.sleep(0.01)
            status = await self.get_request(job, status["request_id"])
        assert status["status"] == "completed", status
        return status["result"]
