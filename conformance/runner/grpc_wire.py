"""The gRPC transport of the runner: plain `grpc` channels and the generated messages.

Data-plane RPCs stream DSSST1 chunk frames in `arctic.v1.Frame` both ways (PROTOCOL.md §4.3);
`GetRequest` takes a typed message and streams frames back; control-plane RPCs are typed unary
calls whose messages are built from the protocol's JSON form by `protojson`. Errors are the gRPC
status plus the JSON error body of the `x-arctic-error-bin` trailer.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import grpc

from arctic_sdk.spec.model import GrpcShape
from arctic_sdk.spec.pb.arctic.v1 import dssst1_pb2

from . import protojson
from .values import summarize
from .wire import ERROR_TRAILER, Call, Reply, assemble_result, describe_body, redact

MAX_MESSAGE = 256 * 1024 * 1024


class GrpcWire:
    name = "grpc"

    def __init__(self, target: str, *, timeout: float = 60.0) -> None:
        self.target = target
        self.timeout = timeout
        self.channel = grpc.insecure_channel(
            target,
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE),
                ("grpc.max_send_message_length", MAX_MESSAGE),
            ],
        )

    def close(self) -> None:
        self.channel.close()

    def metadata(self, call: Call) -> list[tuple[str, str]]:
        md = [(k.lower(), str(v)) for k, v in call.headers.items() if v is not None and v != ""]
        if call.job_id is not None and call.method is not None and call.method.job_scoped:
            md.append(("x-arctic-job-id", call.job_id))
        return md

    def send(self, call: Call) -> list[Reply]:
        path = call.grpc_path or (call.method.grpc_path if call.method is not None else "")
        md = self.metadata(call)
        reply = Reply("grpc", sent=f"{path} metadata={redact(dict(md))} body={describe_body(call)}")
        method = call.method
        try:
            if call.grpc_path is not None or (method and method.grpc_shape is GrpcShape.FRAMES):
                frames = call.frames if call.frames is not None else []
                self._frames(reply, path, frames, md, call.timeout)
            elif method is not None and method.grpc_shape is GrpcShape.UNARY_TO_FRAMES:
                msg = self._request_message(call)
                stream = self.channel.unary_stream(
                    path, request_serializer=_serialize, response_deserializer=_frame
                )
                self._collect(reply, stream(msg, metadata=md, timeout=call.timeout))
            elif method is not None:
                msg = self._request_message(call)
                cls = protojson.message_class(method.response_type)
                unary = self.channel.unary_unary(
                    path, request_serializer=_serialize, response_deserializer=cls.FromString
                )
                answer = unary(msg, metadata=md, timeout=call.timeout)
                reply.grpc_code = "OK"
                reply.body = protojson.to_json(answer)
                reply.received = summarize(reply.body)
        except grpc.RpcError as exc:
            _error(reply, exc)
        return [reply]

    def _request_message(self, call: Call) -> Any:
        assert call.method is not None
        body = dict(call.json_body or {}) if call.has_json else {}
        body.update(call.query)
        body.update(call.params)
        if call.job_id is not None and "job_id" in call.method.path_params:
            body["job_id"] = call.job_id
        cls = protojson.message_class(call.method.request_type)
        return protojson.to_message(body, cls)

    def _frames(
        self,
        reply: Reply,
        path: str,
        frames: Sequence[bytes],
        md: list[tuple[str, str]],
        timeout: float,
    ) -> None:
        def messages() -> Iterator[dssst1_pb2.Frame]:
            for f in frames:
                yield dssst1_pb2.Frame(dssst1=f)

        stream = self.channel.stream_stream(
            path, request_serializer=_serialize, response_deserializer=_frame
        )
        self._collect(reply, stream(messages(), metadata=md, timeout=timeout))

    def _collect(self, reply: Reply, responses: Any) -> None:
        frames = [bytes(m.dssst1) for m in responses]
        reply.grpc_code = "OK"
        reply.headers = _md(responses.initial_metadata()) | _md(responses.trailing_metadata())
        try:
            reply.body = assemble_result(frames)
        except ValueError as exc:  # DSSError is a ValueError
            reply.decode_error = f"the answer frames do not decode: {exc}"
        reply.received = f"{len(frames)} frame(s): {summarize(reply.body)}"


def _serialize(msg: Any) -> bytes:
    out: bytes = msg.SerializeToString()
    return out


def _frame(data: bytes) -> dssst1_pb2.Frame:
    return dssst1_pb2.Frame.FromString(data)


def _md(pairs: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in pairs or ():
        out[key.lower()] = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    return out


def _error(reply: Reply, exc: grpc.RpcError) -> None:
    code = exc.code() if hasattr(exc, "code") else None
    reply.grpc_code = code.name if code is not None else "UNKNOWN"
    reply.grpc_details = exc.details() if hasattr(exc, "details") else str(exc)
    trailers = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    reply.headers = _md(trailers)
    raw = None
    for key, value in trailers or ():
        if key.lower() == ERROR_TRAILER:
            raw = value
    if raw is None:
        reply.received = "(no x-arctic-error-bin trailer)"
        return
    try:
        reply.body = json.loads(raw)
        reply.received = summarize(reply.body)
    except ValueError as exc2:
        reply.body = raw
        reply.decode_error = f"the {ERROR_TRAILER} trailer is not JSON: {exc2}"
        reply.received = repr(raw[:120])
