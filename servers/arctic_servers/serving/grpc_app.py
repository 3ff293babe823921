"""The gRPC binding (PROTOCOL.md §4) on grpc.aio, over the protocol core.

Data-plane RPCs stream DSSST1 chunk frames both ways: every request frame goes through the same
chunk-group logic as an HTTP chunk POST, and the answer (`RequestStatus` with tensors in place) is
sent back as result chunk frames. Control-plane RPCs carry typed messages, converted with the
protocol's JSON mapping. Errors end the call with the table's gRPC status and the JSON error body
in the `x-arctic-error-bin` trailer.
"""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
from google.protobuf import descriptor_pool, message_factory
from google.protobuf.message import Message

import dssst1
from arctic_sdk.spec.model import MethodInfo
from arctic_sdk.spec.pb.arctic.v1 import dssst1_pb2
from arctic_sdk.spec.proto_json import json_to_message, message_to_json

from .._generated.grpc_services import generic_handlers
from ..protocol.core import IncomingCall, Outcome, ProtocolCore
from ..protocol.results import status_value
from ..rules.errors import ProtocolError
from .metrics_http import log_failed

log = logging.getLogger("arctic_servers.grpc")

ERROR_TRAILER = "x-arctic-error-bin"
REQUEST_ID_TRAILER = "x-request-id"  # the server's id of the call (the request's, if recorded)


def _metadata(context: grpc.aio.ServicerContext) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in context.invocation_metadata() or ():
        out[key.lower()] = value.decode() if isinstance(value, bytes) else str(value)
    return out


class GrpcBridge:
    """Implements the generated handler protocol (`frames`, `unary_frames`, `unary`) for aio."""

    def __init__(self, core: ProtocolCore) -> None:
        self.core = core
        self._pool = descriptor_pool.Default()

    def _max_chunk(self) -> int:
        return self.core.config.limits.max_grpc_message_bytes - 1024

    async def _abort(
        self,
        context: grpc.aio.ServicerContext,
        exc: ProtocolError,
        method: MethodInfo,
        request_id: str,
    ) -> None:
        """End the call with `exc`: the table's status, the error body and the server's id of
        the call (`x-request-id`) in the trailers, and its log line."""
        log_failed(f"gRPC {method.name}", exc.http_status, exc, None, request_id)
        context.set_trailing_metadata(
            (
                (ERROR_TRAILER, json.dumps(exc.body()).encode()),
                (REQUEST_ID_TRAILER, request_id),
            )
        )
        await context.abort(grpc.StatusCode[exc.grpc_status], exc.message)

    @staticmethod
    def _answered(context: grpc.aio.ServicerContext, request_id: str) -> None:
        context.set_trailing_metadata(((REQUEST_ID_TRAILER, request_id),))

    def _frames_of(self, outcome: Outcome) -> list[dssst1_pb2.Frame]:
        value = status_value(outcome) if outcome.record is not None else outcome.value
        if outcome.raw is not None:
            value = {"data": outcome.raw, "offset": 0}
        frame = dssst1.dumps(value)
        chunks = dssst1.encode_chunks(frame, kind="result", max_bytes=self._max_chunk())
        return [dssst1_pb2.Frame(dssst1=bytes(c)) for c in chunks]

    async def frames(
        self,
        method: MethodInfo,
        requests: AsyncIterator[dssst1_pb2.Frame],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[dssst1_pb2.Frame]:
        headers = _metadata(context)
        params = {"job_id": headers.get("x-arctic-job-id", "")}
        cached: dict[str, Any] | None = None
        rid = uuid.uuid4().hex  # the call's id; each frame's handling names its own
        try:
            async for msg in requests:
                call = IncomingCall(
                    method=method,
                    transport="grpc",
                    headers=headers,
                    path_params=params,
                    body=msg.dssst1,
                    request_id=rid,
                )
                outcome = await self.core.handle(call)
                if (
                    outcome.record is None
                    and isinstance(outcome.value, dict)
                    and (outcome.value.get("chunk_cached"))
                ):
                    cached = outcome.value
                    continue
                self._answered(context, outcome.request_id(call))
                for frame in self._frames_of(outcome):
                    yield frame
                await _drain(requests)
                return
            if cached is not None:  # the stream closed the group with chunks missing (§3.5)
                raise self._missing_chunks(params["job_id"], cached)
            raise ProtocolError(
                "missing_field", "the request stream carried no frame", field="frames"
            )
        except ProtocolError as exc:
            await _drain(requests)
            await self._abort(context, exc, method, rid)
        except Exception as exc:
            log.exception("gRPC %s failed (request %s)", method.name, rid)
            internal = ProtocolError("internal", f"{type(exc).__name__}: {exc}")
            await self._abort(context, internal, method, rid)

    def _missing_chunks(self, job_id: str, cached: dict[str, Any]) -> ProtocolError:
        gid = str(cached.get("chunk_group_id", ""))
        group = self.core.groups.store.get_group(job_id, gid)
        total = int(cached.get("total_chunks") or 0)
        got = group.received if group is not None else set()
        missing: list[int] = []  # the first 1000 (total_chunks is bounded by max_chunks)
        for i in range(total):
            if i not in got:
                missing.append(i)
                if len(missing) >= 1000:
                    break
        return ProtocolError(
            "chunk_group_missing_chunks",
            f"the request stream ended with chunk group {gid!r} incomplete: missing {missing}",
            chunk_group_id=gid,
            missing_chunks=missing,
        )

    async def unary_frames(
        self, method: MethodInfo, request: Message, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[dssst1_pb2.Frame]:
        call = self._unary_call(method, request, context)
        try:
            outcome = await self.core.handle(call)
            self._answered(context, outcome.request_id(call))
            for frame in self._frames_of(outcome):
                yield frame
        except ProtocolError as exc:
            await self._abort(context, exc, method, call.request_id)

    async def unary(
        self, method: MethodInfo, request: Message, context: grpc.aio.ServicerContext
    ) -> Message:
        call = self._unary_call(method, request, context)
        try:
            outcome = await self.core.handle(call)
            cls = message_factory.GetMessageClass(
                self._pool.FindMessageTypeByName(method.response_type)
            )
            self._answered(context, outcome.request_id(call))
            return json_to_message(_plain(outcome.value), cls)
        except ProtocolError as exc:
            await self._abort(context, exc, method, call.request_id)
            raise AssertionError("unreachable") from exc

    @staticmethod
    def _unary_call(
        method: MethodInfo, request: Message, context: grpc.aio.ServicerContext
    ) -> IncomingCall:
        headers = _metadata(context)
        body = message_to_json(request)
        params = {p: str(body.pop(p)) for p in method.path_params if p in body}
        if "job_id" not in params and headers.get("x-arctic-job-id"):
            params["job_id"] = headers["x-arctic-job-id"]
        return IncomingCall(
            method=method, transport="grpc", headers=headers, path_params=params, value=body
        )


async def _drain(requests: AsyncIterator[dssst1_pb2.Frame]) -> None:
    """Read the client's remaining frames before the call ends: a client still writing when the
    server closes sees INTERNAL instead of the answer (a replayed group, an early refusal)."""
    with contextlib.suppress(Exception):
        async for _ in requests:
            pass


def _plain(value: Any) -> Any:
    """Drop None so optional fields stay unset in the message."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


async def start_grpc_server(
    core: ProtocolCore,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
) -> tuple[grpc.aio.Server, int]:
    """Start a grpc.aio server for `core`; returns it and the bound port."""
    limit = core.config.limits.max_grpc_message_bytes
    server = grpc.aio.server(
        interceptors=list(interceptors) or None,
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
        ],
    )
    server.add_generic_rpc_handlers(generic_handlers(GrpcBridge(core), aio=True))
    bound = server.add_insecure_port(f"{host}:{port}")
    await server.start()
    return server, bound
