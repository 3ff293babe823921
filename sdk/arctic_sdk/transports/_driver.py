"""The drivers: run a protocol flow, performing its effects with blocking or asyncio I/O.

`SyncTransport` and `AsyncTransport` implement the `Transport` / `AsyncTransport` protocols of
`arctic_sdk._client_base` over any byte mover (`SyncIO` / `AsyncIO`: requests, aiohttp, grpcio,
grpc.aio, in-process). All protocol logic is in `arctic_sdk._core`; this module only loops.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import dataclasses
import importlib
import logging
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar

from .. import tracing
from .._client_base import CallOptions
from .._core.calls import call_flow, prepare
from .._core.effects import (
    Answer,
    ConnectionFailure,
    Flow,
    GrpcRequest,
    HttpRequest,
    HttpResponse,
    Progress,
    Send,
    Sleep,
)
from .._core.replies import Wire
from .._core.state import CoreState
from .._loop_guard import in_running_loop, warn_blocking
from ..config import ArcticConfig
from ..spec.model import MethodInfo

log = logging.getLogger("arctic_sdk")
T = TypeVar("T")
Request = HttpRequest | GrpcRequest


class SyncIO(Protocol):
    def send(self, request: Any) -> Answer: ...

    def close(self) -> None: ...


class AsyncIO(Protocol):
    async def send(self, request: Any) -> Answer: ...

    async def close(self) -> None: ...


class ProgressReporter:
    """tqdm bars for `Progress` effects, only when stderr is a terminal (or when forced)."""

    def __init__(self, enabled: bool | None) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled

    def handle(self, effect: Progress, bars: dict[str, Any]) -> None:
        if not self.enabled:
            return
        tqdm = importlib.import_module("tqdm.auto").tqdm
        if effect.event == "start":
            old = bars.pop(effect.key, None)
            if old is not None:
                old.close()
            bars[effect.key] = tqdm(
                total=effect.total,
                desc=effect.desc,
                unit=effect.unit,
                leave=False,
                unit_scale=effect.unit == "B",
                unit_divisor=1024 if effect.unit == "B" else 1000,
                bar_format=None if effect.total else "{desc} {elapsed}",
            )
        elif effect.event == "update":
            bar = bars.get(effect.key)
            if bar is not None:
                if effect.desc:
                    bar.set_description_str(effect.desc, refresh=False)
                bar.update(effect.n)
        elif effect.event == "close":
            bar = bars.pop(effect.key, None)
            if bar is not None:
                bar.close()

    @staticmethod
    def close_all(bars: dict[str, Any]) -> None:
        for bar in bars.values():
            bar.close()
        bars.clear()


def _log_exchange(request: Request, answer: Answer, started: float) -> None:
    if not log.isEnabledFor(logging.DEBUG):
        return
    ms = (time.perf_counter() - started) * 1000
    if isinstance(request, HttpRequest):
        what = f"{request.method} {request.url.split('?')[0]}"
    else:
        what = f"gRPC {request.path}"
    if isinstance(answer, ConnectionFailure):
        outcome = f"no answer ({answer.reason})"
    elif isinstance(answer, HttpResponse):
        outcome = str(answer.status)
    else:
        outcome = answer.code
    log.debug(
        "%s -> %s in %.1f ms",
        what,
        outcome,
        ms,
        extra={"arctic_op": request.op.name, "arctic_ms": round(ms, 3)},
    )


def _traced(request: Request) -> Request:
    """The request carrying the current span's context (W3C `traceparent`), when tracing."""
    carrier = tracing.current_carrier()
    if not carrier:
        return request
    if isinstance(request, HttpRequest):
        return dataclasses.replace(request, headers={**request.headers, **carrier})
    return dataclasses.replace(request, metadata=(*request.metadata, *carrier.items()))


def _answered(span: Any, answer: Answer) -> None:
    """Note the server's request id of an answer on the call's span."""
    if isinstance(answer, HttpResponse):
        rid = answer.headers.get("x-arctic-request-id") or answer.headers.get("x-request-id")
    elif isinstance(answer, ConnectionFailure):
        return
    else:
        raw = answer.trailers.get("x-request-id")
        rid = raw.decode() if isinstance(raw, bytes) else raw
    if rid:
        span.set_attribute("arctic.request_id", rid)


def _call_span(method: MethodInfo | None) -> Any:
    if method is None:
        return None
    return tracing.start_span(f"arctic.sdk {method.name}", kind="client",
                              attributes={"arctic.op": method.name})  # fmt: skip


def run_sync(
    flow: Flow[T],
    send: Callable[[Any], Answer],
    reporter: ProgressReporter,
    method: MethodInfo | None = None,
) -> T:
    """Drive `flow` to completion with blocking I/O (in a span of `method`'s, when tracing)."""
    span = _call_span(method)
    if span is None:
        return _run_sync(flow, send, reporter, None)
    with tracing.use_span(span):
        try:
            return _run_sync(flow, send, reporter, span)
        except Exception as exc:
            tracing.record_error(span, exc)
            raise


def _run_sync(
    flow: Flow[T], send: Callable[[Any], Answer], reporter: ProgressReporter, span: Any
) -> T:
    bars: dict[str, Any] = {}
    value: Any = None
    abandoned: KeyboardInterrupt | None = None
    cancelling = False  # the flow was told it is abandoned: it is cancelling its request
    try:
        while True:
            try:
                effect = flow.send(value) if abandoned is None else flow.throw(abandoned)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            value = None
            cancelling, abandoned = cancelling or abandoned is not None, None
            try:
                if isinstance(effect, Send):
                    started = time.perf_counter()
                    request = effect.request if span is None else _traced(effect.request)
                    value = send(request)
                    if span is not None:
                        _answered(span, value)
                    _log_exchange(effect.request, value, started)
                elif isinstance(effect, Sleep):
                    time.sleep(max(0.0, effect.seconds))
                else:
                    reporter.handle(effect, bars)
            except KeyboardInterrupt as exc:
                # Ctrl-C: the flow cancels its request (bounded) and re-raises it; a second
                # Ctrl-C while it cancels leaves at once
                if cancelling:
                    raise
                abandoned = exc
    finally:
        reporter.close_all(bars)
        flow.close()


async def run_async(
    flow: Flow[T],
    send: Callable[[Any], Awaitable[Answer]],
    reporter: ProgressReporter,
    method: MethodInfo | None = None,
) -> T:
    """Drive `flow` to completion in the running event loop (in a span, when tracing)."""
    span = _call_span(method)
    if span is None:
        return await _run_async(flow, send, reporter, None)
    with tracing.use_span(span):
        try:
            return await _run_async(flow, send, reporter, span)
        except Exception as exc:
            tracing.record_error(span, exc)
            raise


async def _run_async(
    flow: Flow[T], send: Callable[[Any], Awaitable[Answer]], reporter: ProgressReporter, span: Any
) -> T:
    bars: dict[str, Any] = {}
    value: Any = None
    abandoned: asyncio.CancelledError | None = None
    cancelling = False  # the flow was told it is abandoned: it is cancelling its request
    try:
        while True:
            try:
                effect = flow.send(value) if abandoned is None else flow.throw(abandoned)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            value = None
            cancelling, abandoned = cancelling or abandoned is not None, None
            try:
                if isinstance(effect, Send):
                    started = time.perf_counter()
                    request = effect.request if span is None else _traced(effect.request)
                    value = await send(request)
                    if span is not None:
                        _answered(span, value)
                    _log_exchange(effect.request, value, started)
                elif isinstance(effect, Sleep):
                    await asyncio.sleep(max(0.0, effect.seconds))
                else:
                    reporter.handle(effect, bars)
            except asyncio.CancelledError as exc:
                # the task was cancelled: the flow cancels its request (bounded) and re-raises
                # it; cancelled again while it cancels, it leaves at once
                if cancelling:
                    raise
                abandoned = exc
    finally:
        reporter.close_all(bars)
        flow.close()


class SyncTransport:
    """The sync client's transport: calls run in the caller's thread, futures in a pool."""

    def __init__(
        self, config: ArcticConfig, io: SyncIO, wire: Wire, *, seq_start: dict[str, int] | None
    ) -> None:
        self.config = config
        self.io = io
        self.state = CoreState(config, wire, seq_start=seq_start)
        self.reporter = ProgressReporter(config.progress)
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._warned_loop = False

    def run(self, flow: Flow[T], method: MethodInfo | None = None) -> T:
        if not self._warned_loop and in_running_loop():
            self._warned_loop = True
            name = method.python_name if method is not None else "wait_until_running"
            warn_blocking(f"Client.{name}()")
        return run_sync(flow, self.io.send, self.reporter, method)

    def call(self, method: MethodInfo, body: dict[str, Any], options: CallOptions | None) -> Any:
        return self.run(call_flow(self.state, prepare(self.state, method, body, options)), method)

    def submit(
        self, method: MethodInfo, body: dict[str, Any], options: CallOptions | None
    ) -> concurrent.futures.Future[Any]:
        flow = call_flow(self.state, prepare(self.state, method, body, options))
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    self.config.max_in_flight, thread_name_prefix="arctic-call"
                )
            # the caller's context (its current span) goes with the call into the pool
            return self._pool.submit(contextvars.copy_context().run, self.run, flow, method)

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=False)
        self.io.close()


class AsyncTransport:
    """The async client's transport: calls run in the running loop; futures are tasks."""

    def __init__(
        self, config: ArcticConfig, io: AsyncIO, wire: Wire, *, seq_start: dict[str, int] | None
    ) -> None:
        self.config = config
        self.io = io
        self.state = CoreState(config, wire, seq_start=seq_start)
        self.reporter = ProgressReporter(config.progress)

    async def run(self, flow: Flow[T], method: MethodInfo | None = None) -> T:
        return await run_async(flow, self.io.send, self.reporter, method)

    async def call(
        self, method: MethodInfo, body: dict[str, Any], options: CallOptions | None
    ) -> Any:
        flow = call_flow(self.state, prepare(self.state, method, body, options))
        return await self.run(flow, method)

    def submit(
        self, method: MethodInfo, body: dict[str, Any], options: CallOptions | None
    ) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()  # futures belong to the caller's running loop
        flow = call_flow(self.state, prepare(self.state, method, body, options))
        return loop.create_task(self.run(flow, method))

    async def close(self) -> None:
        await self.io.close()


def lower_headers(headers: Mapping[str, str] | Any) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in headers.items()}
