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
import collections
import contextlib
import logging
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from multiprocessing.connection import Client, Connection
from typing import Any

from ..engines.worker.replies import Replies, no_delay, reply_error
from ..protocol import faultpoints
from ..rules.errors import ProtocolError

log = logging.getLogger("arctic_servers.gateway")
NO_RESULT = (
    "the gateway restarted after marking the request running and before its worker received "
    "it: it did not run; resubmit it under the same idempotency identity"
)


class WorkerClient(Replies):
    def __init__(
        self,
        sub_job_id: str,
        address: tuple[str, int],
        authkey: bytes,
        *,
        alive: Callable[[], str | None],
        events: collections.Counter[str] | None = None,
    ) -> None:
        """`alive()` answers None while the worker lives, else why it is gone; `events` counts
        reconnects (the supervisor's, for metrics)."""
        super().__init__()
        self.events: collections.Counter[str] = (
            events if events is not None else collections.Counter()
        )
        self.sub_job_id = sub_job_id
        self.address = address
        self.authkey = authkey
        self.alive = alive
        self.failure: str | None = None
        self.stopping: ProtocolError | None = None
        self._conn: Connection | None = None
        self._keys: dict[int, str | None] = {}  # a call's key: collected again after a reconnect
        self._connected = asyncio.Event()

    # ------------------------------------------------------------------ connection

    async def connect(self, attempts: int = 20, delay: float = 0.1) -> None:
        self._loop = asyncio.get_running_loop()
        last: Exception | None = None
        for _ in range(attempts):
            try:
                conn = no_delay(await asyncio.to_thread(Client, self.address, authkey=self.authkey))
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
        exc = self._read_replies_from(conn)
        if exc is not None:  # an answer is lost: reconnect and collect the calls by key
            log.warning("worker %s sent an unreadable answer: %s", self.sub_job_id, exc)
            with contextlib.suppress(OSError):
                conn.close()
        self._post(self._lost, conn)

    def _error_of(self, msg: Mapping[str, Any]) -> BaseException:
        if msg.get("unknown"):  # a collected call the worker never received
            return ProtocolError(
                "not_executed", NO_RESULT, sub_job_id=self.sub_job_id, reason=NO_RESULT
            )
        err = dict(msg.get("error") or {})
        details = dict(err.get("details") or {})
        details.pop("traceback", None)
        return reply_error({**err, "details": details}, f"sub-job {self.sub_job_id}: ")

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
        self.events["reconnected"] += 1
        for mid, fut in list(self._pending.items()):
            if fut.done():
                continue
            key = self._keys.get(mid)
            if key is None:
                fut.set_exception(
                    ProtocolError(
                        "unavailable", f"the connection to sub-job {self.sub_job_id} broke"
                    )
                )
                self._pending.pop(mid, None)
                continue
            with contextlib.suppress(ProtocolError):
                await self._send({"op": "collect", "id": mid, "key": key})

    @property
    def connected(self) -> bool:
        return self._conn is not None

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
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(exc)
        self._pending.clear()
        self._keys.clear()

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
        self._pending[mid], self._keys[mid] = fut, key
        try:
            await self._send({**msg, "id": mid})
        except ProtocolError:
            self._pending.pop(mid, None)
            self._keys.pop(mid, None)
            raise
        if msg.get("op") == "call":
            faultpoints.hit("worker_dispatched")  # kill -9 tests: sent, not yet answered
        try:
            return await fut
        finally:
            self._pending.pop(mid, None)
            self._keys.pop(mid, None)

    async def call(
        self, cmd: str, args: dict[str, Any], *, key: str | None = None, meta: Any = None
    ) -> Any:
        meta = dict(meta or {})
        with self.command(cmd, meta):  # busy time; the span, whose context goes in `meta`
            msg = {"op": "call", "key": key, "cmd": cmd, "args": args, "meta": meta}
            return await self.request(msg, key)

    async def stream(
        self, args: dict[str, Any], *, meta: Any = None
    ) -> AsyncIterator[dict[str, Any]]:
        """One streamed sample (`args`: the engine's `generate_stream` arguments): each message
        the worker sends for it, the final result last. Leaving early aborts it there."""
        assert self._loop is not None
        key = f"stream-{uuid.uuid4().hex}"  # a stream is not collected again (`_keys`: none)

        async def send(mid: int) -> None:
            msg = {"op": "stream", "id": mid, "key": key, "args": args, "meta": meta or {}}
            await self._send(msg)

        def abort(_: int) -> None:
            conn = self._conn
            if conn is not None:
                with contextlib.suppress(OSError, ValueError, EOFError), self._send_lock:
                    conn.send({"op": "abort_stream", "id": next(self._ids), "key": key})

        items = self._run_stream(self._loop, send, abort)
        async with contextlib.aclosing(items):  # an early exit aborts now, not at GC
            async for item in items:
                yield item

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
