"""gRPC byte movers: grpcio for the sync client, grpc.aio for the async client.

They run one RPC of a `GrpcRequest` (a stream of request chunk frames, or a typed message) and
collect every answer frame (or the answer message) and the trailers. The channel target is
`config.grpc.target`, else the HTTP server's host with the `grpc_port` its capabilities advertise.
The async mover keeps one channel per event loop, closed when that loop shuts down.
"""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request
import weakref
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import urlsplit

import grpc
import grpc.aio

from .._core.effects import ConnectionFailure, GrpcRequest, GrpcResponse
from .._core.grpc_wire import trailers_dict
from .._generated.grpc_stubs import MESSAGE_TYPES, make_stubs
from ..config import ArcticConfig
from ..spec.model import GrpcShape
from ..spec.pb.arctic.v1 import dssst1_pb2
from ..spec.tables import methods as M


def resolve_target(config: ArcticConfig) -> str:
    """`host:port` of the gRPC endpoint."""
    if config.grpc.target:
        return config.grpc.target
    prefix = config.cortex.prefix_url()
    try:
        url = prefix + M.GET_CAPABILITIES.http_path
        with urllib.request.urlopen(url, timeout=config.connect_timeout) as r:
            doc = json.loads(r.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ConnectionError(
            f"cannot read the server's capabilities to find its gRPC port: {exc}"
        ) from None
    port = int((doc.get("features") or {}).get("grpc_port") or 0)
    if not port:
        raise ConnectionError("the server advertises no gRPC port; pass grpc_target=")
    host = urlsplit(prefix).hostname or "127.0.0.1"
    return f"{host}:{port}"


# gRPC's own reconnect backoff (1 s, x1.6, up to 120 s) would stack on the SDK's retry backoff:
# after a server restart the channel waits out its timer, failing every SDK retry fast until
# then (a 20 s outage: the first call succeeded ~11 s after the server was ready, HTTP ~2 s).
# Capped at 1 s, the channel is ready for the SDK's next retry on either transport.
RECONNECT_BACKOFF_MS = (100, 1000)  # initial / min, max


def _options(config: ArcticConfig) -> list[tuple[str, Any]]:
    limit = config.grpc.max_message_bytes + 64 * 1024
    lo, hi = RECONNECT_BACKOFF_MS
    return [
        ("grpc.max_send_message_length", limit),
        ("grpc.max_receive_message_length", limit),
        ("grpc.enable_retries", 0),
        ("grpc.initial_reconnect_backoff_ms", lo),
        ("grpc.min_reconnect_backoff_ms", lo),
        ("grpc.max_reconnect_backoff_ms", hi),
    ]


def _frames(request: GrpcRequest) -> Iterator[bytes]:
    """Each chunk frame as a serialized `Frame` message (field 1, bytes), built in one copy."""
    for chunk in request.frames:
        n = sum(len(p) for p in chunk)
        head = bytearray(b"\x0a")
        while True:  # the length as a protobuf varint
            byte, n = n & 0x7F, n >> 7
            head.append(byte | (0x80 if n else 0))
            if not n:
                break
        yield b"".join((bytes(head), *chunk))


def _raw_frame_stubs(channel: Any, stubs: dict[str, Any]) -> dict[str, Any]:
    """The data-plane (stream Frame -> stream Frame) RPCs with pre-serialized requests."""
    out = dict(stubs)
    for path, (req, resp) in MESSAGE_TYPES.items():
        if req is dssst1_pb2.Frame:
            out[path] = channel.stream_stream(path, response_deserializer=resp.FromString)
    return out


def _trailers(call: Any) -> dict[str, Any]:
    """A finished call's trailing metadata (the server's `x-request-id`), as a dict."""
    try:
        return trailers_dict(call.trailing_metadata())
    except Exception:  # a stub without them (test doubles)
        return {}


async def _aio_trailers(call: Any) -> dict[str, Any]:
    try:
        return trailers_dict(await call.trailing_metadata())
    except Exception:
        return {}


def _error(exc: grpc.RpcError) -> GrpcResponse:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    trailers = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    return GrpcResponse(
        code=code.name if code is not None else "UNKNOWN",
        details=str(details or ""),
        trailers=trailers_dict(trailers),
    )


class GrpcSyncIO:
    def __init__(self, config: ArcticConfig) -> None:
        self._config = config
        self._channel: grpc.Channel | None = None
        self._stubs: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._finalizer: weakref.finalize[Any, Any] | None = None

    def _get(self) -> dict[str, Any]:
        if self._channel is None:
            with self._lock:
                if self._channel is None:
                    target = resolve_target(self._config)
                    if self._config.grpc.secure:
                        creds = grpc.ssl_channel_credentials()
                        ch = grpc.secure_channel(target, creds, options=_options(self._config))
                    else:
                        ch = grpc.insecure_channel(target, options=_options(self._config))
                    self._stubs = _raw_frame_stubs(ch, make_stubs(ch))
                    self._finalizer = weakref.finalize(self, ch.close)
                    self._channel = ch
        return self._stubs

    def send(self, request: GrpcRequest) -> GrpcResponse | ConnectionFailure:
        try:
            stubs = self._get()
        except ConnectionError as exc:
            return ConnectionFailure(False, str(exc))
        stub = stubs[request.path]
        md = request.metadata
        try:
            if request.shape is GrpcShape.UNARY:
                msg, call = stub.with_call(request.message, metadata=md, timeout=request.timeout)
                return GrpcResponse("OK", message=msg, trailers=_trailers(call))
            if request.shape is GrpcShape.UNARY_TO_FRAMES:
                it = stub(request.message, metadata=md, timeout=request.timeout)
            else:
                it = stub(_frames(request), metadata=md, timeout=request.timeout)
            try:
                frames = [f.dssst1 for f in it]
            except KeyboardInterrupt:
                it.cancel()  # Ctrl-C: the server sees the call cancelled (and cancels its work)
                raise
            return GrpcResponse("OK", frames=frames, trailers=_trailers(it))
        except grpc.RpcError as exc:
            return _error(exc)

    def close(self) -> None:
        with self._lock:
            ch, self._channel = self._channel, None
            if self._finalizer is not None:
                self._finalizer.detach()
                self._finalizer = None
        if ch is not None:
            ch.close()


class _LoopChannel:
    def __init__(self, channel: grpc.aio.Channel, loop: asyncio.AbstractEventLoop) -> None:
        self.channel = channel
        self.loop = loop
        self.stubs = _raw_frame_stubs(channel, make_stubs(channel))
        self.keeper: AsyncIterator[None] | None = None

    @staticmethod
    async def _keep(channel: grpc.aio.Channel) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await channel.close()

    async def start(self) -> None:
        self.keeper = self._keep(self.channel)
        await self.keeper.__anext__()

    async def close(self) -> None:
        if self.keeper is not None:
            keeper, self.keeper = self.keeper, None
            await keeper.aclose()  # type: ignore[attr-defined]


class GrpcAsyncIO:
    def __init__(self, config: ArcticConfig) -> None:
        self._config = config
        self._target: str | None = config.grpc.target
        self._channels: dict[int, _LoopChannel] = {}
        self._lock = threading.Lock()

    async def _get(self) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        entry = self._channels.get(id(loop))
        if entry is not None and entry.loop is loop:
            return entry.stubs
        with self._lock:
            for key, old in list(self._channels.items()):
                if old.loop.is_closed():
                    del self._channels[key]
        if self._target is None:
            self._target = await asyncio.to_thread(resolve_target, self._config)
            entry = self._channels.get(id(loop))  # another task may have opened it meanwhile
            if entry is not None and entry.loop is loop:
                return entry.stubs
        if self._config.grpc.secure:
            ch = grpc.aio.secure_channel(
                self._target, grpc.ssl_channel_credentials(), options=_options(self._config)
            )
        else:
            ch = grpc.aio.insecure_channel(self._target, options=_options(self._config))
        entry = _LoopChannel(ch, loop)
        await entry.start()
        with self._lock:
            self._channels[id(loop)] = entry
        return entry.stubs

    async def send(self, request: GrpcRequest) -> GrpcResponse | ConnectionFailure:
        try:
            stubs = await self._get()
        except ConnectionError as exc:
            return ConnectionFailure(False, str(exc))
        stub = stubs[request.path]
        md = request.metadata
        try:
            if request.shape is GrpcShape.UNARY:
                unary = stub(request.message, metadata=md, timeout=request.timeout)
                msg = await unary
                return GrpcResponse("OK", message=msg, trailers=await _aio_trailers(unary))
            if request.shape is GrpcShape.UNARY_TO_FRAMES:
                call = stub(request.message, metadata=md, timeout=request.timeout)
            else:
                call = stub(_frames(request), metadata=md, timeout=request.timeout)
            try:
                frames = [f.dssst1 async for f in call]
            except asyncio.CancelledError:
                call.cancel()  # the task was cancelled: so is the call (the server stops it)
                raise
            return GrpcResponse("OK", frames=frames, trailers=await _aio_trailers(call))
        except grpc.RpcError as exc:
            return _error(exc)

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        with self._lock:
            entries = list(self._channels.values())
            self._channels.clear()
        for entry in entries:
            if entry.loop is loop:
                await entry.close()
            elif entry.loop.is_running():
                await asyncio.wrap_future(
                    asyncio.run_coroutine_threadsafe(entry.close(), entry.loop)
                )
