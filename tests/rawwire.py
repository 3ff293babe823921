"""Raw arctic.v1 clients for the server tests: aiohttp + DSSST1 chunk frames, and raw gRPC.

No SDK on purpose: these tests pin a server to the wire protocol itself (method table + dssst1).
The fake's and the on-prem server's tests subclass `RawHttp` and `RawGrpc` with their own
fixtures and result semantics (tests/fake/raw.py, tests/onprem/raw.py).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import grpc
import numpy as np

import dssst1
from arctic_sdk.spec.model import MethodInfo
from arctic_sdk.spec.pb.arctic.v1 import dssst1_pb2
from arctic_sdk.spec.tables import methods as M

OCTET = "application/octet-stream"
ERROR_TRAILER = "x-arctic-error-bin"
TERMINAL = ("completed", "failed", "cancelled")


@dataclass
class Resp:
    status: int
    data: Any  # parsed JSON, or bytes
    headers: dict[str, str]

    @property
    def code(self) -> str | None:
        if isinstance(self.data, dict) and isinstance(self.data.get("error"), dict):
            return str(self.data["error"]["code"])
        return None

    @property
    def error(self) -> dict[str, Any]:
        assert isinstance(self.data, dict) and "error" in self.data, self.data
        err: dict[str, Any] = self.data["error"]
        return err


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


def chunks_of(
    method: MethodInfo, value: Any, *, max_bytes: int = 1 << 20, group: str | None = None
) -> list[bytes]:
    return dssst1.encode_chunks(
        dssst1.dumps(value),
        kind="request",
        max_bytes=max_bytes,
        operation=method.name,
        chunk_group_id=group or str(uuid.uuid4()),
    )


def assemble(frames: list[bytes]) -> dict[str, Any]:
    asm = dssst1.ChunkAssembler("result")
    whole = None
    for f in frames:
        whole = asm.feed(f)
    assert whole is not None, "the result stream ended before its last chunk"
    value: dict[str, Any] = dssst1.loads(whole)
    return value


def pad(rows: Sequence[Sequence[int]], *, left: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """input_ids and attention_mask [B, S] of ragged rows, padded with 0."""
    width = max(len(r) for r in rows)
    ids = np.zeros((len(rows), width), np.int64)
    mask = np.zeros((len(rows), width), np.int64)
    for b, r in enumerate(rows):
        sl = slice(width - len(r), width) if left else slice(0, len(r))
        ids[b, sl] = r
        mask[b, sl] = 1
    return ids, mask


# ---------------------------------------------------------------------------- HTTP


class RawHttp:
    """Calls by method-table entry under one prefix URL, with an optional bearer token."""

    token_type: str | None = None  # sent as X-Snowflake-Authorization-Token-Type when set

    def __init__(self, session: aiohttp.ClientSession, prefix_url: str, token: str | None = None):
        self.session = session
        self.prefix = prefix_url
        self.token = token

    def headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        h = {}
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
            if self.token_type:
                h["X-Snowflake-Authorization-Token-Type"] = self.token_type
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
            elif r.content_type == OCTET and OCTET in (headers or {}).get("Accept", ""):
                data = dssst1.loads(raw)  # an octet RequestStatus
            return Resp(r.status, data, dict(r.headers))

    async def call(
        self,
        method: MethodInfo,
        body: Any = None,
        *,
        headers: dict[str, str] | None = None,
        query: Any = None,
        **params: str,
    ) -> Resp:
        url = self.prefix + path_of(method, **params)
        kw: dict[str, Any] = {}
        if body is not None:
            kw["json"] = body
        if query is not None:
            kw["params"] = query
        return await self.request(method.http_method, url, headers=headers, **kw)

    async def post_chunk(
        self, method: MethodInfo, job: str, chunk: bytes, *, headers: dict[str, str] | None = None
    ) -> Resp:
        url = self.prefix + path_of(method, job_id=job)
        h = {"Content-Type": OCTET, **(headers or {})}
        return await self.request("POST", url, headers=h, data=chunk)

    async def dss(
        self,
        method: MethodInfo,
        job: str,
        value: Any,
        *,
        max_bytes: int = 1 << 20,
        group: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> Resp:
        """Send a DSSST1 body as a chunk group; the answer of the last chunk."""
        resp = None
        for chunk in chunks_of(method, value, max_bytes=max_bytes, group=group):
            resp = await self.post_chunk(method, job, chunk, headers=headers)
            if resp.status != 200 or resp.data.get("chunk_cached") is not True:
                break
        assert resp is not None
        return resp

    async def poll(self, job: str, request_id: str, **query: str) -> Resp:
        return await self.call(M.GET_REQUEST, job_id=job, request_id=request_id, query=query)

    async def until_terminal(
        self, status: dict[str, Any], job: str, *, every_s: float = 0.01
    ) -> dict[str, Any]:
        """Poll a request's status until it is terminal."""
        request_id = status["request_id"]
        while status.get("status") not in TERMINAL:
            await asyncio.sleep(every_s)
            status = (await self.poll(job, request_id)).data
        return status

    async def result_of(self, status: dict[str, Any], job: str) -> Any:
        """The result of a completed request: inline, or assembled from result_chunk events."""
        if "result" in status:
            return decode_result(status)
        events = list(status["events"])
        while status["next_cursor"]:
            status = (await self.poll(job, status["request_id"], cursor=status["next_cursor"])).data
            events += status["events"]
        return dssst1.loads(dssst1.assemble_result_events(events))


# ---------------------------------------------------------------------------- gRPC


class GrpcError(Exception):
    def __init__(self, code: grpc.StatusCode, body: dict[str, Any] | None, details: str):
        super().__init__(f"{code}: {details}")
        self.status = code
        self.body = body or {}

    @property
    def code(self) -> str | None:
        err = self.body.get("error")
        return str(err["code"]) if isinstance(err, dict) else None


def _error(exc: grpc.aio.AioRpcError) -> GrpcError:
    body = None
    for key, value in exc.trailing_metadata() or ():
        if key == ERROR_TRAILER:
            body = json.loads(value)
    return GrpcError(exc.code(), body, exc.details() or "")


class RawGrpc:
    """Data-plane RPCs as DSSST1 frame streams, control-plane RPCs as unary messages."""

    def __init__(self, channel: grpc.aio.Channel, token: str | None = None):
        self.channel = channel
        self.token = token

    def md(self, job: str | None = None, **extra: str) -> list[tuple[str, str]]:
        out = []
        if self.token:
            out.append(("authorization", f"Bearer {self.token}"))
        if job:
            out.append(("x-arctic-job-id", job))
        out += [(k.replace("_", "-"), v) for k, v in extra.items()]
        return out

    async def frames(
        self,
        method: MethodInfo,
        job: str,
        value: Any,
        *,
        max_bytes: int = 1 << 20,
        group: str | None = None,
        chunks: list[bytes] | None = None,
        **md: str,
    ) -> dict[str, Any]:
        """One data-plane RPC; the decoded RequestStatus value."""
        stub = self.channel.stream_stream(
            method.grpc_path,
            request_serializer=dssst1_pb2.Frame.SerializeToString,
            response_deserializer=dssst1_pb2.Frame.FromString,
        )
        chunks = chunks or chunks_of(method, value, max_bytes=max_bytes, group=group)
        try:
            call = stub(
                iter([dssst1_pb2.Frame(dssst1=c) for c in chunks]), metadata=self.md(job, **md)
            )
            frames = [f.dssst1 async for f in call]
        except grpc.aio.AioRpcError as exc:
            raise _error(exc) from None
        return assemble(frames)

    async def unary(
        self, method: MethodInfo, request: Any, response_cls: Any, job: str | None = None, **md: str
    ) -> Any:
        stub = self.channel.unary_unary(
            method.grpc_path,
            request_serializer=type(request).SerializeToString,
            response_deserializer=response_cls.FromString,
        )
        try:
            return await stub(request, metadata=self.md(job, **md))
        except grpc.aio.AioRpcError as exc:
            raise _error(exc) from None

    async def get_request(self, job: str, request_id: str) -> dict[str, Any]:
        from arctic_sdk.spec.pb.arctic.v1 import jobs_pb2

        stub = self.channel.unary_stream(
            M.GET_REQUEST.grpc_path,
            request_serializer=jobs_pb2.GetRequestRequest.SerializeToString,
            response_deserializer=dssst1_pb2.Frame.FromString,
        )
        req = jobs_pb2.GetRequestRequest(job_id=job, request_id=request_id)
        try:
            frames = [f.dssst1 async for f in stub(req, metadata=self.md(job))]
        except grpc.aio.AioRpcError as exc:
            raise _error(exc) from None
        return assemble(frames)
