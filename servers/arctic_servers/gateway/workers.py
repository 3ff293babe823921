"""The gateway's side of a worker connection (`worker_host.py` is the other side).

`WorkerClient.call` sends a command keyed by the request that needs it and awaits the answer;
`collect` asks, after a gateway restart, for the answer of a call the previous gateway sent. The
connection is re-established when it breaks while the worker lives, and calls in flight are then
collected again by key, so an answer is never lost and a command never runs twice. When the
worker is gone, every call fails with `sub_job_failed` naming the sub-job and why.

`stream` iterates over a streamed sample's messages (the new tokens of each engine step, then the
final result); leaving it early tells the worker to abort it. A stream is not collected again
after a reconnect: it fails with `unavailable`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from multiprocessing.connection import Client, Connection
from typing import Any

from ..engines.worker.worker import merge_stream, unbatch
from ..protocol import faultpoints
from ..protocol.errors import ProtocolError

log = logging.getLogger("arctic_servers.gateway")
NO_RESULT = (
    "the gateway restarted after marking the request running and before its worker received "
    "it: it did not run; resubmit it under the same idempotency identity"
)


@dataclass
class _Pending:
    fut: asyncio.Future[Any]
    key: str | None  # collected again after a reconnect


class WorkerClient:
    def __init__(
        self,
        sub_job_id: str,
        address: tuple[str, int],
        authkey: bytes,
        *,
        alive: Callable[[], str | None],
    ) -> None:
        """`alive()` answers None while the worker lives, else why it is gone."""
        self.sub_job_id = sub_job_id
        self.address = address
        self.authkey = authkey
        self.alive = alive
        self.failure: str | None = None
        self.stopping: ProtocolError | None = None
        self._conn: Connection | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._streams: dict[int, asyncio.Queue[dict[str, Any] | None]] = {}
        self._send_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connected = asyncio.Event()

    # ------------------------------------------------------------------ connection

    async def connect(self, attempts: int = 20, delay: float = 0.1) -> None:
        self._loop = asyncio.get_running_loop()
        last: Exception | None = None
        for _ in range(attempts):
            try:
                conn = await asyncio.to_thread(Client, self.address, authkey=self.authkey)
            except (OSError, EOFError) as exc:
                last = exc
                gone = self.alive()
                if gone is not None:
                    self.fail(gone)
                    raise self.error() from None
                await asyncio.sleep(delay)
                continue
            self._conn = conn
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()
            self._connected.set()
            return
        self.fail(f"cannot connect to its worker at {self.address}: {last}")
        raise self.error()

    def _read(self, conn: Connection) -> None:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                break
            except Exception as exc:
                log.warning("worker %s sent an unreadable answer: %s", self.sub_job_id, exc)
                continue
            self._post(self._deliver_all, unbatch(msg))
        self._post(self._lost, conn)

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(fn, *args)

    def _deliver_all(self, msgs: list[dict[str, Any]]) -> None:
        for msg in msgs:
            self._deliver(msg)

    def _deliver(self, msg: dict[str, Any]) -> None:
        if "partial" in msg:  # a stream's new tokens
            q = self._streams.get(int(msg.get("id") or 0))
            if q is not None:
                q.put_nowait(dict(msg["partial"]))
            return
        p = self._pending.pop(int(msg.get("id") or 0), None)
        if p is None or p.fut.done():
            return
        if msg.get("ok"):
            p.fut.set_result(msg.get("result"))
        elif msg.get("unknown"):
            p.fut.set_exception(
                ProtocolError(
                    "not_executed", NO_RESULT, sub_job_id=self.sub_job_id, reason=NO_RESULT
                )
            )
        else:
            p.fut.set_exception(_error(msg.get("error") or {}, self.sub_job_id))

    def _lost(self, conn: Connection) -> None:
        if conn is not self._conn:
            return
        self._conn = None
        self._connected.clear()
        if self.stopping is not None or self.failure is not None:
            self._fail_pending()
            return
        gone = self.alive()
        if gone is not None:
            self.fail(gone)
            return
        asyncio.get_running_loop().create_task(self._reconnect())

    async def _reconnect(self) -> None:
        """The connection broke but the worker lives: reconnect, collect what was in flight."""
        try:
            await self.connect(attempts=30, delay=0.2)
        except ProtocolError:
            return
        for mid, p in list(self._pending.items()):
            if p.fut.done():
                continue
            if p.key is None:
                p.fut.set_exception(
                    ProtocolError(
                        "unavailable", f"the connection to sub-job {self.sub_job_id} broke"
                    )
                )
                self._pending.pop(mid, None)
                continue
            with contextlib.suppress(ProtocolError):
                await self._send({"op": "collect", "id": mid, "key": p.key})

    # ------------------------------------------------------------------ failure

    def error(self) -> ProtocolError:
        if self.stopping is not None:
            return self.stopping
        return ProtocolError(
            "sub_job_failed",
            f"sub-job {self.sub_job_id} failed: {self.failure}",
            sub_job_id=self.sub_job_id,
            reason=self.failure,
        )

    def fail(self, reason: str) -> None:
        if self.failure is None:
            self.failure = reason
        self._fail_pending()

    def _fail_pending(self) -> None:
        exc = self.error()
        for p in self._pending.values():
            if not p.fut.done():
                p.fut.set_exception(exc)
        self._pending.clear()

    def close(self, error: ProtocolError | None = None) -> None:
        """Stop using this worker (the job ended, or the gateway stops); it keeps running."""
        if error is not None:
            self.stopping = error
            self._fail_pending()
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.close()

    # ------------------------------------------------------------------ requests

    async def _send(self, msg: dict[str, Any]) -> None:
        if self.failure is not None or self.stopping is not None:
            raise self.error()
        if self._conn is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._connected.wait(), 10.0)
        conn = self._conn
        if conn is None:
            raise (
                self.error()
                if self.failure
                else ProtocolError(
                    "unavailable", f"sub-job {self.sub_job_id}: no connection to its worker"
                )
            )

        def send() -> None:
            with self._send_lock:
                conn.send(msg)

        # on a broken connection the reader notices, and the reconnect collects this call
        with contextlib.suppress(OSError, ValueError, EOFError):
            await asyncio.to_thread(send)

    async def request(self, msg: dict[str, Any], key: str | None = None) -> Any:
        assert self._loop is not None
        mid = next(self._ids)
        fut: asyncio.Future[Any] = self._loop.create_future()
        self._pending[mid] = _Pending(fut, key)
        try:
            await self._send({**msg, "id": mid})
        except ProtocolError:
            self._pending.pop(mid, None)
            raise
        if msg.get("op") == "call":
            faultpoints.hit("worker_dispatched")  # kill -9 tests: sent, not yet answered
        try:
            return await fut
        finally:
            self._pending.pop(mid, None)

    async def call(
        self, cmd: str, args: dict[str, Any], *, key: str | None = None, meta: Any = None
    ) -> Any:
        msg = {"op": "call", "key": key, "cmd": cmd, "args": args, "meta": meta or {}}
        return await self.request(msg, key)

    async def stream(
        self, args: dict[str, Any], *, meta: Any = None
    ) -> AsyncIterator[dict[str, Any]]:
        """One streamed sample (`args`: the engine's `generate_stream` arguments): each message
        the worker sends for it, the final result last. Leaving early aborts it there."""
        assert self._loop is not None
        mid, key = next(self._ids), f"stream-{uuid.uuid4().hex}"
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        fut: asyncio.Future[Any] = self._loop.create_future()
        fut.add_done_callback(lambda _: queue.put_nowait(None))
        self._pending[mid] = _Pending(fut, None)
        self._streams[mid] = queue
        ended = False
        try:
            msg = {"op": "stream", "id": mid, "key": key, "args": args, "meta": meta or {}}
            try:
                await self._send(msg)
            except ProtocolError:
                ended = True
                raise
            while True:
                items = [await queue.get()]
                while items[-1] is not None and not queue.empty():
                    items.append(queue.get_nowait())  # what piled up: one item (merge_stream)
                if items[-1] is None:  # the final answer, or the worker's failure
                    ended = True
                    final = dict(fut.result())
                    yield merge_stream([*(i for i in items if i is not None), final])
                    return
                yield merge_stream([i for i in items if i is not None])
        finally:
            self._streams.pop(mid, None)
            self._pending.pop(mid, None)
            conn = self._conn
            if not ended and conn is not None:
                with contextlib.suppress(OSError, ValueError, EOFError), self._send_lock:
                    conn.send({"op": "abort_stream", "id": next(self._ids), "key": key})

    async def collect(self, key: str) -> Any:
        return await self.request({"op": "collect", "key": key}, key)

    async def cancel(self, key: str) -> dict[str, Any]:
        return dict(await self.request({"op": "cancel", "key": key}))

    async def status(self) -> dict[str, Any]:
        return dict(await self.request({"op": "status"}))

    async def stats(self) -> dict[str, Any]:
        return dict(await self.request({"op": "stats"}))

    async def logs(self, cursor: int, limit: int) -> dict[str, Any]:
        return dict(await self.request({"op": "logs", "cursor": cursor, "limit": limit}))

    async def shutdown(self, timeout: float = 5.0) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.request({"op": "shutdown"}), timeout)


def _error(err: dict[str, Any], sub_job_id: str) -> ProtocolError:
    code = str(err.get("code") or "internal")
    details = dict(err.get("details") or {})
    details.pop("traceback", None)
    try:
        return ProtocolError(code, str(err.get("message") or code), **details)
    except ValueError:  # a code outside errors.proto
        return ProtocolError(
            "internal", f"sub-job {sub_job_id}: {code}: {err.get('message')}", **details
        )
