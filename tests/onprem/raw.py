"""A raw arctic.v1 client for the on-prem tests: aiohttp + dssst1 chunk frames, and raw gRPC.

No SDK on purpose: these tests pin the server to the wire protocol itself.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass
from typing import Any

import aiohttp
import grpc
import numpy as np

import dssst1
from arctic_sdk._generated import methods as M
from arctic_sdk._generated.arctic.v1 import dssst1_pb2
from arctic_sdk._spec import MethodInfo

OCTET = "application/octet-stream"
ERROR_TRAILER = "x-arctic-error-bin"


class CallError(Exception):
    def __init__(self, status: int, code: str, body: dict[str, Any]):
        super().__init__(f"{status} {code}: {body}")
        self.status = status
        self.code = code
        self.body = body


@dataclass
class Resp:
    status: int
    data: Any
    headers: dict[str, str]

    @property
    def code(self) -> str | None:
        if isinstance(self.data, dict) and isinstance(self.data.get("error"), dict):
            return str(self.data["error"]["code"])
        return None


def path_of(method: MethodInfo, **params: str) -> str:
    path = method.http_path
    for k, v in params.items():
        path = path.replace("{" + k + "}", v)
    return path


def decode_result(status: dict[str, Any]) -> Any:
    res = status.get("result")
    if isinstance(res, dict) and res.get("wire_format") == "DSSST1":
        return dssst1.loads(dssst1.decode_inline_envelope(res))
    return res


class Http:
    def __init__(self, session: aiohttp.ClientSession, prefix_url: str, token: str | None = None):
        self.session = session
        self.prefix = prefix_url
        self.token = token

    def headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        h = {}
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        h.update(extra or {})
        return h

    async def request(
        self, verb: str, url: str, *, headers: dict[str, str] | None = None, **kw: Any
    ) -> Resp:
        async with self.session.request(verb, url, headers=self.headers(headers), **kw) as r:
            raw = await r.read()
            data: Any = raw
            if r.content_type == "application/json":
                data = json.loads(raw)
            return Resp(r.status, data, dict(r.headers))

    async def call(
        self,
        method: MethodInfo,
        body: Any = None,
        *,
        headers: dict[str, str] | None = None,
        **params: str,
    ) -> Resp:
        url = self.prefix + path_of(method, **params)
        kw: dict[str, Any] = {}
        if body is not None:
            kw["json"] = body
        return await self.request(method.http_method, url, headers=headers, **kw)

    async def dss(
        self, method: MethodInfo, job: str, value: Any, *, headers: dict[str, str] | None = None
    ) -> Resp:
        """Send a DSSST1 body as a chunk group; the answer of the last chunk."""
        chunks = dssst1.encode_chunks(
            dssst1.dumps(value),
            kind="request",
            max_bytes=1 << 20,
            operation=method.name,
            chunk_group_id=str(uuid.uuid4()),
        )
        resp = None
        url = self.prefix + path_of(method, job_id=job)
        for chunk in chunks:
            resp = await self.request(
                "POST", url, headers={"Content-Type": OCTET, **(headers or {})}, data=chunk
            )
            if resp.status != 200 or resp.data.get("chunk_cached") is not True:
                break
        assert resp is not None
        return resp

    async def result(self, resp: Resp, job: str) -> Any:
        if resp.status not in (200, 202):
            err = resp.data.get("error", {}) if isinstance(resp.data, dict) else {}
            raise CallError(resp.status, str(err.get("code")), err)
        status = resp.data
        while status.get("status") not in ("completed", "failed", "cancelled"):
            await asyncio.sleep(0.02)
            status = (
                await self.call(M.GET_REQUEST, job_id=job, request_id=resp.data["request_id"])
            ).data
        if status["status"] != "completed":
            err = status.get("error") or {}
            raise CallError(200, str(err.get("code")), err)
        if "result" in status:
            return decode_result(status)
        events = list(status["events"])
        while status["next_cursor"]:
            nxt = await self.request(
                "GET",
                self.prefix + path_of(M.GET_REQUEST, job_id=job, request_id=status["request_id"]),
                params={"cursor": status["next_cursor"]},
            )
            status = nxt.data
            events += status["events"]
        return dssst1.loads(dssst1.assemble_result_events(events))

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
            err = resp.data.get("error", {}) if isinstance(resp.data, dict) else {}
            raise CallError(resp.status, str(err.get("code")), err)
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


class Grpc:
    def __init__(self, channel: grpc.aio.Channel, token: str | None = None):
        self.channel = channel
        self.token = token

    def md(self, job: str | None = None) -> list[tuple[str, str]]:
        out = []
        if self.token:
            out.append(("authorization", f"Bearer {self.token}"))
        if job:
            out.append(("x-arctic-job-id", job))
        return out

    async def run(self, method: MethodInfo, job: str, value: Any) -> Any:
        stub = self.channel.stream_stream(
            method.grpc_path,
            request_serializer=dssst1_pb2.Frame.SerializeToString,
            response_deserializer=dssst1_pb2.Frame.FromString,
        )
        chunks = dssst1.encode_chunks(
            dssst1.dumps(value),
            kind="request",
            max_bytes=1 << 20,
            operation=method.name,
            chunk_group_id=str(uuid.uuid4()),
        )
        call = stub(iter([dssst1_pb2.Frame(dssst1=c) for c in chunks]), metadata=self.md(job))
        frames = [f.dssst1 async for f in call]
        asm = dssst1.ChunkAssembler("result")
        whole = None
        for f in frames:
            whole = asm.feed(f)
        assert whole is not None
        status = dssst1.loads(whole)
        assert status["status"] == "completed", status
        return status["result"]


def pad(rows: list[list[int]], *, left: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """input_ids and attention_mask [B, S] of ragged rows, padded with 0."""
    width = max(len(r) for r in rows)
    ids = np.zeros((len(rows), width), np.int64)
    mask = np.zeros((len(rows), width), np.int64)
    for b, r in enumerate(rows):
        sl = slice(width - len(r), width) if left else slice(0, len(r))
        ids[b, sl] = r
        mask[b, sl] = 1
    return ids, mask
