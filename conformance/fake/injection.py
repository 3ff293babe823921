"""Where faults bite: an aiohttp middleware and a grpc.aio interceptor over the `FaultRegistry`."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from aiohttp import web

from arctic_sdk.spec.model import MethodInfo
from arctic_sdk.spec.tables import methods as M
from arctic_servers.serving.grpc_app import ERROR_TRAILER
from arctic_servers.serving.http_app import DEFAULT_PREFIX, error_response, json_response

from .faults import Fault, FaultRegistry

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_BY_ROUTE = {(m.http_method, m.http_path): m for m in M.METHODS}


def http_method_of(request: web.Request, prefix: str = DEFAULT_PREFIX) -> MethodInfo | None:
    """The op a routed request is for (None for admin and unknown routes)."""
    route = request.match_info.route
    resource = getattr(route, "resource", None)
    canonical = getattr(resource, "canonical", "")
    if not canonical.startswith(prefix):
        return None
    return _BY_ROUTE.get((request.method, canonical[len(prefix) :] or "/"))


def fault_middleware(registry: FaultRegistry) -> Any:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        method = http_method_of(request)
        fault = registry.take(method.name, "http") if method is not None else None
        if fault is None:
            return await handler(request)
        return await _http_fault(fault, registry, request, handler)

    return middleware


async def _http_fault(
    fault: Fault, registry: FaultRegistry, request: web.Request, handler: Handler
) -> web.StreamResponse:
    if fault.kind == "fail":
        if fault.body is None:
            return error_response(fault.error())
        headers = {}
        if fault.retry_after_s is not None:
            headers["Retry-After"] = str(int(fault.retry_after_s))
        return json_response(fault.body, fault.status, headers)
    if fault.kind == "delay":
        await asyncio.sleep(fault.delay_s)
        return await handler(request)
    if fault.kind == "reorder":
        await registry.hold(fault)
        return await handler(request)
    response = await handler(request)  # the call executes
    transport = request.transport
    if fault.kind == "close_mid_body" and transport is not None:
        body = _body_bytes(response)
        out = web.StreamResponse(status=response.status, headers=response.headers)
        out.content_length = len(body)
        await out.prepare(request)
        await out.write(body[: len(body) // 2])
    if transport is not None:
        transport.abort()
    # aiohttp answers nothing for a cancelled handler; the client sees the connection drop.
    raise asyncio.CancelledError()


def _body_bytes(response: web.StreamResponse) -> bytes:
    body = getattr(response, "body", None)
    if isinstance(body, bytes | bytearray):
        return bytes(body)
    text = getattr(response, "text", None)
    return text.encode() if isinstance(text, str) else b""


# ---------------------------------------------------------------------------- gRPC


class FaultInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Applies armed faults to gRPC calls (faults with transport "grpc" or "any")."""

    def __init__(self, registry: FaultRegistry) -> None:
        self.registry = registry

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = await continuation(details)
        method = M.BY_GRPC_PATH.get(details.method)
        if handler is None or method is None:
            return handler
        registry = self.registry
        if handler.request_streaming and handler.response_streaming:
            inner = handler.stream_stream

            async def stream_stream(requests: Any, context: Any) -> AsyncIterator[Any]:
                async for item in _stream(
                    registry, method, context, lambda: inner(requests, context), requests
                ):
                    yield item

            return grpc.stream_stream_rpc_method_handler(
                stream_stream, handler.request_deserializer, handler.response_serializer
            )
        if handler.response_streaming:
            inner_us = handler.unary_stream

            async def unary_stream(request: Any, context: Any) -> AsyncIterator[Any]:
                async for item in _stream(
                    registry, method, context, lambda: inner_us(request, context)
                ):
                    yield item

            return grpc.unary_stream_rpc_method_handler(
                unary_stream, handler.request_deserializer, handler.response_serializer
            )
        inner_uu = handler.unary_unary

        async def unary_unary(request: Any, context: Any) -> Any:
            fault = registry.take(method.name, "grpc")
            if fault is None:
                return await inner_uu(request, context)
            await _before(fault, registry, context)
            response = await inner_uu(request, context)
            if fault.kind in ("drop_after_execute", "close_mid_body"):
                await _drop(context)
            return response

        return grpc.unary_unary_rpc_method_handler(
            unary_unary, handler.request_deserializer, handler.response_serializer
        )


async def _before(
    fault: Fault, registry: FaultRegistry, context: Any, requests: Any = None
) -> None:
    """The part of a fault that acts before the call runs (fail, delay, reorder)."""
    if fault.kind == "fail":
        if requests is not None:  # let the client finish writing, or it sees INTERNAL
            with contextlib.suppress(Exception):
                async for _ in requests:
                    pass
        exc = fault.error()
        body = fault.body if fault.body is not None else exc.body()
        context.set_trailing_metadata(((ERROR_TRAILER, json.dumps(body).encode()),))
        await context.abort(grpc.StatusCode[exc.grpc_status], exc.message)
    elif fault.kind == "delay":
        await asyncio.sleep(fault.delay_s)
    elif fault.kind == "reorder":
        await registry.hold(fault)


async def _drop(context: Any) -> None:
    await context.abort(grpc.StatusCode.UNAVAILABLE, "injected fault: connection dropped")


async def _stream(
    registry: FaultRegistry,
    method: MethodInfo,
    context: Any,
    call: Callable[[], AsyncIterator[Any]],
    requests: Any = None,
) -> AsyncIterator[Any]:
    fault = registry.take(method.name, "grpc")
    if fault is None:
        async for item in call():
            yield item
        return
    await _before(fault, registry, context, requests)
    if fault.kind not in ("drop_after_execute", "close_mid_body"):
        async for item in call():
            yield item
        return
    items = [item async for item in call()]  # the call executes
    if fault.kind == "close_mid_body":
        for item in items[: len(items) // 2]:
            yield item
    await _drop(context)
