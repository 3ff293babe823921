"""The reply side every client of a worker shares: numbered calls, streams, errors.

The on-prem server's `WorkerHandle` (`procs.py`, a worker process it spawned) and the gateway's
`WorkerClient` (`gateway/workers.py`, a worker host it reconnects to) send numbered commands and
read numbered replies over a `multiprocessing.connection`. `Replies` holds what both do with a
reply: a stream's `partial` messages go to its queue, a final reply settles its call's future
(a result, or the worker's error body as a `ProtocolError`), and a stream's consumer reads what
piled up as one merged item (`merge_stream`). Each client adds its own transport and its own
messages (idle / failed / init_failed for a spawned worker, `unknown` for a collected call).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import socket
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator, Mapping
from multiprocessing.connection import Connection
from typing import Any

from ...rules.errors import ProtocolError
from ...telemetry import tracing
from ...telemetry.metrics import BusyMeter
from .messages import merge_stream, unbatch


def no_delay(conn: Connection) -> Connection:
    """Nagle's algorithm off on a TCP `multiprocessing.connection` (a pipe or a Unix socket is left
    as it is). Its users pipeline small messages — calls in flight, one reply each — and with Nagle
    on, a small write behind an unacknowledged one waits for the peer's delayed ACK (40 ms on
    Linux): the gateway's worker link held concurrent generates back until an answer went the
    other way, and the answers of a step's finished requests for 40 ms."""
    with contextlib.suppress(OSError, ValueError):
        s = socket.socket(fileno=os.dup(conn.fileno()))
        try:
            if s.family in (socket.AF_INET, socket.AF_INET6):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        finally:
            s.close()
    return conn


def reply_error(err: Mapping[str, Any], fallback_prefix: str = "") -> ProtocolError:
    """A worker's error body as a `ProtocolError` (a code outside errors.proto is `internal`)."""
    code = str(err.get("code") or "internal")
    details = dict(err.get("details") or {})
    try:
        return ProtocolError(code, str(err.get("message") or code), **details)
    except ValueError:  # a code outside errors.proto
        return ProtocolError(
            "internal", f"{fallback_prefix}{code}: {err.get('message')}", **details
        )


class Replies:
    """Numbered calls in flight and open streams, settled by the replies the reader thread posts."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._streams: dict[int, asyncio.Queue[dict[str, Any] | None]] = {}
        self._send_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ended: set[int] = set()  # streams whose final reply (or failure) was read
        self.busy = BusyMeter()  # seconds with a command in flight (metrics: engine busy time)

    @contextlib.contextmanager
    def command(self, cmd: str, message: dict[str, Any]) -> Iterator[None]:
        """One engine command in flight: the engine's busy time, and its span when tracing
        (`message` then carries the span's context to the worker)."""
        with self.busy.held(), tracing.engine_call(cmd, getattr(self, "sub_job_id", ""), message):
            yield

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        """Run `fn(*args)` on the event loop (from a reader thread); nothing once it closed."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # loop closing
                loop.call_soon_threadsafe(fn, *args)

    def _read_replies_from(self, conn: Connection) -> BaseException | None:
        """The reader thread's loop: each pipe message's replies go to `_deliver` on the event
        loop, until the worker closes the connection (None) or a message cannot be read (the
        exception: a reply is lost, so the caller ends the connection — the on-prem client
        fails every call in flight, the gateway's reconnects and collects its calls by key)."""
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                return None
            except Exception as exc:
                return exc
            self._post(self._deliver_all, unbatch(msg))

    def _deliver_all(self, msgs: list[dict[str, Any]]) -> None:
        for msg in msgs:
            self._deliver(msg)

    def _deliver(self, msg: Mapping[str, Any]) -> None:
        if "partial" in msg:  # a stream's new tokens
            q = self._streams.get(int(msg.get("id") or 0))
            if q is not None:
                q.put_nowait(dict(msg["partial"]))
            return
        fut = self._pending.pop(int(msg.get("id") or 0), None)
        if fut is None or fut.done():
            return
        if msg.get("ok"):
            fut.set_result(msg.get("result"))
        else:
            fut.set_exception(self._error_of(msg))

    def _error_of(self, msg: Mapping[str, Any]) -> BaseException:
        """The exception of a failed reply (a client may read more of the reply first)."""
        return reply_error(msg.get("error") or {})

    def _open_stream(
        self, loop: asyncio.AbstractEventLoop
    ) -> tuple[int, asyncio.Future[Any], asyncio.Queue[dict[str, Any] | None]]:
        """A new stream's id, its final reply's future and its queue (None: the final is in)."""
        rid = next(self._ids)
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        fut: asyncio.Future[Any] = loop.create_future()
        fut.add_done_callback(lambda _: queue.put_nowait(None))
        self._pending[rid] = fut
        self._streams[rid] = queue
        return rid, fut, queue

    async def _stream_items(
        self, rid: int, fut: asyncio.Future[Any], queue: asyncio.Queue[dict[str, Any] | None]
    ) -> AsyncIterator[dict[str, Any]]:
        """Stream `rid`'s messages as they arrive, what piled up merged into one, the final reply
        last (merged with what came just before it); raises the worker's error if it failed."""
        while True:
            items = [await queue.get()]
            while items[-1] is not None and not queue.empty():
                items.append(queue.get_nowait())  # what piled up: one item (merge_stream)
            if items[-1] is None:  # the final reply (or the worker's failure)
                self._ended.add(rid)
                final = dict(fut.result())
                yield merge_stream([*(i for i in items if i is not None), final])
                return
            yield merge_stream([i for i in items if i is not None])

    async def _run_stream(
        self,
        loop: asyncio.AbstractEventLoop,
        send: Callable[[int], Awaitable[None]],
        abort: Callable[[int], None],
    ) -> AsyncGenerator[dict[str, Any], None]:
        """One streamed command: `send(id)` sends it; its messages as they arrive, the final
        reply last. A consumer that leaves before the final reply calls `abort(id)`, which
        stops the engine's work on it; a send the worker refused needs no abort."""
        rid, fut, queue = self._open_stream(loop)
        ended = False
        self.busy.begin()
        try:
            try:
                await send(rid)
            except ProtocolError:
                ended = True
                raise
            async for item in self._stream_items(rid, fut, queue):
                yield item
        finally:
            self.busy.end()
            ended = self._close_stream(rid) or ended
            if not ended:
                abort(rid)

    def _close_stream(self, rid: int) -> bool:
        """Forget stream `rid`; whether its final reply was read (else the consumer left early)."""
        self._streams.pop(rid, None)
        self._pending.pop(rid, None)
        ended = rid in self._ended
        self._ended.discard(rid)
        return ended
