"""Worker processes as the server sees them: spawn, call, watch, stop.

Each sub-job is one `python -m arctic_servers.engines.worker.worker` process with its own
environment (thread counts, PYTHONPATH) and an inherited socket (`socket.socketpair`, so nothing
else can connect to it) wrapped in a `multiprocessing.connection.Connection`. A reader thread turns
the worker's replies into asyncio results; a watcher thread waits on the process. When the process
ends — killed, crashed, or out of memory — every call in flight and every later call fails at once
with `sub_job_failed` (details: `sub_job_id`, `reason` with the exit status and the last lines the
worker printed), and `on_exit` tells the job manager. A multi-rank trainer's worker (rank 0) that
loses one of its ranks says so first (`{"kind": "failed"}`): the reason then names the rank.

`call` awaits a command's one reply; `stream` iterates over a streaming command's messages (the
worker's `partial` messages, then its final result) as they arrive. Leaving a stream early
(the consumer stops iterating, or its task is cancelled because the HTTP client went away) sends
the worker the abort command, which removes the request from the engine; so does a cancelled
`call` on a sampler (a whole generate whose client went away, a cancelled request).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from multiprocessing.connection import Connection
from typing import Any

from ...rules.errors import ProtocolError
from ...rules.request_scope import RUNNING_REQUEST
from ..config import worker_env
from ..deepspeed.ranks import describe_exit
from .messages import ABORT_CMD
from .replies import Replies

log = logging.getLogger("arctic_servers.onprem")
LOG_LINES = 2000


class WorkerHandle(Replies):
    def __init__(
        self,
        role: str,
        engine: str,
        *,
        python: str,
        threads: int,
        cpus: list[int] | None = None,
        echo: bool = False,
    ) -> None:
        super().__init__()
        self.sub_job_id = f"(pooled {engine} worker)"
        self.role = role
        self.engine = engine
        self.python = python
        self.threads = threads
        self.cpus = cpus
        self.echo = echo
        self.on_exit: Callable[[WorkerHandle, str], None] | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.info: dict[str, Any] = {}
        self.failure: str | None = None
        self.stopping = False
        self.logs: collections.deque[str] = collections.deque(maxlen=LOG_LINES)
        self.log_count = 0  # lines ever printed (cursor base for tail-logs)
        self.idle: asyncio.Future[dict[str, Any]] | None = None  # set once the imports are done
        self._serving: collections.Counter[str] = collections.Counter()  # request -> commands
        self._conn: Connection | None = None
        self._outbox: queue.SimpleQueue[tuple[Any, asyncio.Future[None] | None]] | None = None
        self._exit_reported = False

    # ------------------------------------------------------------------ lifecycle

    def role_ok(self, role: str) -> bool:
        """A pooled worker serves any role of its engine (vLLM: sampling or log_prob)."""
        return role == self.role or (
            self.engine in ("vllm", "hf") and role in ("sampling", "log_prob")
        )

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and self.failure is None

    def _env(self) -> dict[str, str]:
        return worker_env(self.threads)

    def spawn(self) -> None:
        """Start the process; it imports its engine's libraries, then waits for `init`."""
        self._loop = asyncio.get_running_loop()
        parent, child = socket.socketpair()
        argv = [
            self.python,
            "-m",
            "arctic_servers.engines.worker.worker",
            "--role",
            self.role,
            "--engine",
            self.engine,
            "--fd",
            str(child.fileno()),
        ]
        self.proc = subprocess.Popen(
            argv,
            env=self._env(),
            pass_fds=(child.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group: stop() takes vLLM's helpers down too
        )
        if self.cpus:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(self.proc.pid, self.cpus)
        child.close()
        self._conn = Connection(parent.detach())
        self.idle = self._loop.create_future()
        self.idle.add_done_callback(lambda f: f.exception() if not f.cancelled() else None)
        threading.Thread(target=self._read_output, daemon=True, name=f"out-{self.engine}").start()
        threading.Thread(target=self._read_replies, daemon=True, name=f"rx-{self.engine}").start()
        threading.Thread(target=self._watch, daemon=True, name=f"wait-{self.engine}").start()

    async def start(
        self, sub_job_id: str, spec: Mapping[str, Any], timeout: float
    ) -> dict[str, Any]:
        """Build the sub-job's engine in this worker (spawning it first unless pooled)."""
        self.sub_job_id = sub_job_id
        if self.proc is None:
            self.spawn()
        assert self.idle is not None
        try:
            await asyncio.wait_for(asyncio.shield(self.idle), timeout)
            self.info = dict(
                await asyncio.wait_for(
                    self.call("init", spec=dict(spec, num_threads=self.threads)), timeout
                )
            )
        except ProtocolError as exc:
            if self.failure is None:  # the worker exits next: its exit names this, not a status
                self.failure = f"{self.role} engine start failed: {exc.message}"
            raise
        except TimeoutError:
            await self.stop(reason=f"did not start within {timeout:.0f} s")
            raise ProtocolError(
                "deadline_exceeded",
                f"sub-job {self.sub_job_id}: the {self.role} engine did not start "
                f"within {timeout:.0f} s",
                sub_job_id=self.sub_job_id,
            ) from None
        return self.info

    def _read_output(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.logs.append(line)
            self.log_count += 1
            if self.echo:
                print(f"[{self.sub_job_id}] {line}", file=sys.stderr, flush=True)

    def _read_replies(self) -> None:
        conn = self._conn
        assert conn is not None
        exc = self._read_replies_from(conn)
        if exc is not None:
            self._post(self._fail_all, f"sent an unreadable reply ({type(exc).__name__}: {exc})")
            return
        # EOF: the worker died or closed its end; give the OS a moment to report the exit status
        proc = self.proc
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=2.0)
        if proc is not None and proc.returncode is not None:
            self._post(self._process_exited)
        else:
            self._post(self._connection_lost)

    def _watch(self) -> None:
        assert self.proc is not None
        self.proc.wait()
        time.sleep(0.05)  # let the reader drain a final reply first
        self._post(self._process_exited)

    def _deliver(self, msg: Mapping[str, Any]) -> None:
        kind = msg.get("kind")
        if kind == "idle":
            if self.idle is not None and not self.idle.done():
                self.idle.set_result(dict(msg))
            return
        if kind == "failed":  # a multi-rank trainer lost one of its ranks (ranks.py)
            self._fail_all(str(msg.get("reason") or "failed"))
            return
        if kind == "init_failed":
            err = msg.get("error") or {}
            self._fail_all(f"engine start failed: {err.get('message', err)}", init_error=err)
            return
        super()._deliver(msg)  # a reply, or a stream's partial message

    def _connection_lost(self) -> None:
        if self.proc is not None and self.proc.poll() is None and not self.stopping:
            # the process lives but its pipe is gone: it is of no use any more
            self._fail_all("closed its connection to the server")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)

    def _process_exited(self) -> None:
        assert self.proc is not None
        self._fail_all(describe_exit(self.proc.returncode))

    def tail(self, n: int = 4) -> str:
        lines = [ln for ln in list(self.logs)[-n:] if ln.strip()]
        return " | ".join(lines)[-600:]

    def _fail_all(self, what: str, init_error: Mapping[str, Any] | None = None) -> None:
        if self.failure is None:
            pid = self.pid
            reason = f"{self.role} worker (pid {pid}) {what}"
            if not self.stopping and not init_error:
                tail = self.tail()
                if tail:
                    reason += f"; last output: {tail}"
            self.failure = reason
        exc = ProtocolError(
            "sub_job_failed",
            f"sub-job {self.sub_job_id} failed: {self.failure}",
            sub_job_id=self.sub_job_id,
            reason=self.failure,
        )
        if self.idle is not None and not self.idle.done():
            self.idle.set_exception(exc)
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(exc)
        self._pending.clear()
        if not self._exit_reported and self.on_exit is not None:
            self._exit_reported = True
            self.on_exit(self, self.failure)

    def error(self) -> ProtocolError:
        return ProtocolError(
            "sub_job_failed",
            f"sub-job {self.sub_job_id} failed: {self.failure}",
            sub_job_id=self.sub_job_id,
            reason=self.failure,
        )

    # ------------------------------------------------------------------ calls

    def _send(self, msg: Mapping[str, Any]) -> None:
        assert self._conn is not None
        with self._send_lock:
            self._conn.send(msg)

    def _started_loop(self) -> asyncio.AbstractEventLoop:
        """The loop of a worker that can take a command (else the error to raise)."""
        if self.failure is not None:
            raise self.error()
        if self._conn is None or self._loop is None:
            raise ProtocolError("unavailable", f"sub-job {self.sub_job_id} is not started")
        return self._loop

    def _queue_send(self, msg: Mapping[str, Any]) -> asyncio.Future[None]:
        """Queue `msg` for the sender thread (a large body does not block the event loop):
        messages reach the worker in the order they were queued. The future: sent, or why not."""
        loop = self._started_loop()
        fut: asyncio.Future[None] = loop.create_future()
        if self._outbox is None:
            self._outbox = queue.SimpleQueue()
            threading.Thread(target=self._sender, daemon=True, name=f"tx-{self.engine}").start()
        self._outbox.put((msg, fut))
        return fut

    def _sender(self) -> None:
        box = self._outbox
        assert box is not None
        while True:
            msg, fut = box.get()
            if msg is None:
                return
            err: BaseException | None = None
            try:
                self._send(msg)
            except (OSError, ValueError) as exc:
                err = exc
            self._post(_settle, fut, err)

    async def _request(
        self, rid: int, cmd: str, args: Mapping[str, Any], extra: Mapping[str, Any] | None = None
    ) -> None:
        """Send command `rid` (`extra`: more keys of its message, e.g. its trace context); a
        failed send is the sub-job's failure (a ProtocolError)."""
        try:
            await self._queue_send({"id": rid, "cmd": cmd, "args": args, **(extra or {})})
        except (OSError, ValueError) as exc:
            if self.failure is not None:
                raise self.error() from None
            raise ProtocolError(
                "sub_job_failed",
                f"sub-job {self.sub_job_id}: send failed: {exc}",
                sub_job_id=self.sub_job_id,
            ) from None

    async def call(self, cmd: str, **args: Any) -> Any:
        """Run `cmd` in the worker; its result, or its error as a ProtocolError."""
        extra: dict[str, Any] = {}
        request = RUNNING_REQUEST.get()  # the protocol request this command serves, if any
        if request:
            self._serving[request] += 1
        try:
            with self.command(cmd, extra):  # busy time; the span, whose context goes in `extra`
                return await self._call(cmd, args, extra)
        finally:
            if request:
                self._serving[request] -= 1
                if self._serving[request] <= 0:
                    del self._serving[request]

    def serves(self, request_id: str) -> bool:
        """A command of the protocol request `request_id` is in flight on this worker."""
        return self._serving.get(request_id, 0) > 0

    async def _call(self, cmd: str, args: Mapping[str, Any], extra: Mapping[str, Any]) -> Any:
        loop = self._started_loop()
        rid = next(self._ids)
        fut: asyncio.Future[Any] = loop.create_future()
        self._pending[rid] = fut
        try:
            await self._request(rid, cmd, args, extra)
        except ProtocolError:
            self._pending.pop(rid, None)
            raise
        try:
            return await fut
        except asyncio.CancelledError:
            # the caller went away: a sampler drops the command (out of its engine's batch)
            self._pending.pop(rid, None)
            if self.engine == "vllm":
                self._abort(rid)
            raise

    def _abort(self, rid: int) -> None:
        """Tell the worker to drop command `rid` (its reply, and the abort's, are not read)."""
        if self.failure is None and self._conn is not None and self._loop is not None:
            fut = self._queue_send(
                {"id": next(self._ids), "cmd": ABORT_CMD, "args": {"stream": rid}}
            )
            fut.add_done_callback(lambda f: f.cancelled() or f.exception())

    async def stream(self, cmd: str, **args: Any) -> AsyncIterator[dict[str, Any]]:
        """Run the streaming command `cmd`: each message the worker sends for it, the final
        result last. Leaving early sends the worker's abort command (`{"stream": id}`)."""
        items = self._run_stream(
            self._started_loop(), lambda rid: self._request(rid, cmd, args), self._abort
        )
        async with contextlib.aclosing(items):  # an early exit aborts now, not at GC
            async for item in items:
                yield item

    async def stop(self, *, reason: str = "stopped", grace: float = 5.0) -> None:
        """Ask the worker to exit, then terminate / kill its process group."""
        self.stopping = True
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None and self.failure is None and self._conn is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.call("shutdown"), min(grace, 10.0))
            deadline = time.monotonic() + grace
            while proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            if proc.poll() is not None:
                break
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)
            deadline = time.monotonic() + wait
            while proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # helpers left in the group
        if self.failure is None:
            self.failure = f"{self.role} worker {reason}"
        if self._outbox is not None:
            self._outbox.put((None, None))  # ends the sender thread
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.close()


def _settle(fut: asyncio.Future[None] | None, err: BaseException | None) -> None:
    if fut is None or fut.done():
        return
    if err is None:
        fut.set_result(None)
    else:
        fut.set_exception(err)
