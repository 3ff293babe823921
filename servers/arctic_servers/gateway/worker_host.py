"""A sub-job's worker process: `python -m arctic_servers.gateway.worker_host --spec FILE`.

It outlives the gateway that started it (own session, output to a log file, no pipe to its
parent) and serves a TCP port on which a gateway — the one that started it, or the next one after
a restart — connects with the authkey from the spec (`multiprocessing.connection`, pickled dicts).

    gateway -> worker  {"op": "status"}                         -> {state, info, error, pid}
                       {"op": "call", id, key, cmd, args, meta} -> {id, ok, result | error}
                       {"op": "collect", id, key}               -> the call's answer, or
                                                                   {id, ok: False, unknown: True}
                       {"op": "cancel", id, key}                -> {id, ok, result: {cancelled,
                                                                                    state}}
                       {"op": "stats" | "logs" | "shutdown", id, ...}
                       {"op": "stream", id, key, args, meta}    -> {id, partial: {...}} per engine
                                                                   step, then {id, ok, result}
                       {"op": "abort_stream", key}              -> (no answer) ends that stream

Commands run on the main thread (the engine's `commands()` table: the on-prem engines' command
set, or the fake engine's), scheduled as the on-prem worker's serve loop does
(`engines/worker/worker.py` `placement`): a vLLM sampler's generates, streams and scoring join
its engine's continuous batch as they arrive (`submit`; the thread alternates between one engine
step and the queue), and every other command runs alone, once the requests before it have
finished — batched commands that arrive after it wait behind it (a weight load pauses new
generates) — in arrival order per tenant, tenants in turn (`tenant_queue.py`: a LoRA pool's
worker serves many jobs).
Every call with a `key` is journaled in memory before it runs and keeps its answer afterwards,
so a gateway that restarts collects the answer of a call it sent before it died, and a call
whose key the worker has seen is never run twice. A worker that dies takes its journal with it;
its sub-job has then failed anyway. `cancel` of a call in the engine's batch aborts its requests.

Streams (the vLLM sampler: `engines/vllm/sampling.py`): one sample whose new tokens go to the
gateway after every engine step. Streams are not journaled (a stream cut by a gateway restart is
not collected); an abort ends one at once.
"""

from __future__ import annotations

import argparse
import atexit
import collections
import json
import os
import queue
import signal
import sys
import threading
import time
import traceback
from multiprocessing.connection import Listener
from pathlib import Path
from typing import Any

from ..engines.errors import WorkerError
from ..engines.worker.commands import lookup
from ..engines.worker.engine_base import EngineBase
from ..engines.worker.messages import BATCH_KIND
from ..engines.worker.replies import no_delay
from ..engines.worker.tenant_queue import TenantQueue, tenant_of
from ..engines.worker.worker import busy, placement, submits
from ..rules.states import WORKER_CALL, WORKER_HOST
from ..telemetry import tracing
from .worker_process import (
    Channel,
    Entry,
    build_engine,
    error_body,
    rank_lost,
    remove_shm_buffers,
    watch_parent,
)

JOURNAL_MAX = 1024  # finished calls kept for collection after a gateway restart


class WorkerHost:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.log_path = Path(spec.get("log") or "")
        self.state = WORKER_HOST.start("loading")
        self.info: dict[str, Any] = {}
        self.error: dict[str, Any] | None = None
        self.engine: EngineBase | None = None  # built by `main` before `run`
        self.lock = threading.Lock()
        self.journal: collections.OrderedDict[str, Entry] = collections.OrderedDict()
        self.queue: queue.Queue[Entry | None] = queue.Queue()
        self.readers: list[threading.Thread] = []
        self.current: Entry | None = None
        self.anon = 0
        self.stream_entries: dict[str, Entry] = {}  # stream key -> its entry (until it ends)
        self.submitted: dict[int, Entry] = {}  # engine batch id -> its entry (stream or call)
        self.submit_count = 0
        self.spans = tracing.WorkerSpans()  # of batched commands, when the gateway traces

    # ------------------------------------------------------------------ connections

    def serve_connections(self, listener: Listener) -> None:
        while True:
            try:
                conn = no_delay(listener.accept())
            except Exception:
                continue
            # A new gateway: let the readers of the old connections (closed when the old gateway
            # died) enqueue what they had received first, so `collect` sees every call.
            for t in self.readers:
                t.join(timeout=2.0)
            self.readers = [t for t in self.readers if t.is_alive()]
            chan = Channel(conn)
            t = threading.Thread(target=self.read, args=(chan,), daemon=True)
            self.readers.append(t)
            t.start()

    def read(self, chan: Channel) -> None:
        while True:
            try:
                msg = chan.conn.recv()
            except (EOFError, OSError):
                chan.open = False
                return
            except Exception as exc:
                print(f"worker: unreadable message: {exc}", flush=True)
                continue
            try:
                self.dispatch(chan, msg)
            except Exception as exc:
                chan.send({"id": msg.get("id"), "ok": False, "error": error_body(exc, "dispatch")})

    def dispatch(self, chan: Channel, msg: dict[str, Any]) -> None:
        op, mid = msg.get("op"), int(msg.get("id") or 0)
        if op == "status":
            chan.send({"id": mid, "ok": True, "result": self.status()})
        elif op == "call":
            self.submit(chan, mid, msg)
        elif op == "collect":
            self.collect(chan, mid, str(msg.get("key")))
        elif op == "cancel":
            chan.send({"id": mid, "ok": True, "result": self.cancel(str(msg.get("key")))})
        elif op == "stream":
            key = str(msg.get("key") or f"stream-{mid}")
            e = Entry(key, "stream", dict(msg.get("args") or {}), msg.get("meta") or {})
            e.kind = "stream"
            e.waiters.append((chan, mid))
            with self.lock:
                self.stream_entries[key] = e
            self.queue.put(e)
        elif op == "abort_stream":  # runs on the main thread, at once (the engine's thread)
            key = str(msg.get("key"))
            self.queue.put(Entry(f"abort-{key}", "abort", {"key": key}, {}, kind="abort"))
        elif op == "stats":
            stats = self.engine.stats() if self.engine is not None else {}
            chan.send({"id": mid, "ok": True, "result": stats})
        elif op == "logs":
            chan.send({"id": mid, "ok": True, "result": self.logs(msg)})
        elif op == "shutdown":  # the job ended: what is queued will not run
            with self.lock:
                for e in self.journal.values():
                    if e.state == "queued":
                        self._finish(e, self._cancelled(e))
            chan.send({"id": mid, "ok": True, "result": None})
            self.queue.put(None)
        else:
            chan.send({"id": mid, "ok": False, "error": {"code": "internal", "message": f"{op}"}})

    def status(self) -> dict[str, Any]:
        return {"state": self.state, "info": self.info, "error": self.error, "pid": os.getpid()}

    def submit(self, chan: Channel, mid: int, msg: dict[str, Any]) -> None:
        key = msg.get("key")
        with self.lock:
            if not key:
                self.anon += 1
                key = f"anon-{self.anon}"
            e = self.journal.get(key)
            if e is None:
                e = Entry(key, str(msg["cmd"]), dict(msg.get("args") or {}), msg.get("meta") or {})
                e.waiters.append((chan, mid))
                self.journal[key] = e
                self.queue.put(e)
                return
            if e.state != "done":
                e.waiters.append((chan, mid))
                return
        assert e.reply is not None
        chan.send({"id": mid, **e.reply})

    def collect(self, chan: Channel, mid: int, key: str) -> None:
        with self.lock:
            e = self.journal.get(key)
            if e is not None and e.state != "done":
                e.waiters.append((chan, mid))
                return
        if e is None:
            chan.send({"id": mid, "ok": False, "unknown": True})
        else:
            assert e.reply is not None
            chan.send({"id": mid, **e.reply})

    @property
    def built(self) -> EngineBase:
        """The engine, once `main` has built it (commands run only then)."""
        assert self.engine is not None, "the engine is built before any command runs"
        return self.engine

    def cancel(self, key: str) -> dict[str, Any]:
        with self.lock:
            e = self.journal.get(key)
            if e is None:
                return {"cancelled": False, "state": "unknown"}
            if e.state == "queued":
                self._finish(e, self._cancelled(e))
                return {"cancelled": True, "state": "cancelled"}
            e.cancel.set()  # the engine stops at its next safe point, if it has one
        if e.state == "running" and submits(self.built, e.cmd):  # in the engine's batch
            self.queue.put(Entry(f"abort-{key}", "abort", {"key": key}, {}, kind="abort"))
        return {"cancelled": False, "state": e.state}

    @staticmethod
    def _cancelled(e: Entry) -> dict[str, Any]:
        rid = e.meta.get("request_id") or e.key
        return {
            "ok": False,
            "error": {
                "code": "request_cancelled",
                "message": f"request {rid} was cancelled before it ran",
                "details": {"request_id": rid},
            },
        }

    def _finish(self, e: Entry, reply: dict[str, Any]) -> None:
        """Record the answer and send it to every waiter (call with the lock held)."""
        if e.state == "done":
            return  # answered already (`rank_lost` answers the call in flight)
        WORKER_CALL.move(e, "done")
        e.reply = reply
        waiters, e.waiters = e.waiters, []
        for chan, mid in waiters:
            chan.send({"id": mid, **reply})
        done = [k for k, v in self.journal.items() if v.state == "done"]
        for k in done[: max(0, len(done) - int(self.spec.get("journal_max") or JOURNAL_MAX))]:
            del self.journal[k]

    def logs(self, msg: dict[str, Any]) -> dict[str, Any]:
        cursor, limit = int(msg.get("cursor") or 0), int(msg.get("limit") or 100)
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            lines = []
        page = lines[cursor : cursor + limit]
        return {"entries": page, "next": cursor + len(page), "total": len(lines)}

    # ------------------------------------------------------------------ execution

    def run(self) -> None:
        """The engine's thread: the onprem `worker.serve` loop's scheduling (`placement`) over
        this host's queue. Batched commands (the vLLM sampler's generates, streams and scoring)
        join the engine's batch as they arrive; the rest wait in `TenantQueue` (a pool worker's
        tenants in turn, arrival order within each) and run one at a time, the engine idle."""
        waiting: TenantQueue[Entry] = TenantQueue()
        closing = False  # the shutdown sentinel arrived: what can run now runs, then return
        while True:
            while not closing:  # what arrived while the engine worked, queued first
                try:
                    e = self.queue.get_nowait()
                except queue.Empty:
                    break
                closing = self._take(e, waiting)
            if waiting and placement(self.built, _cmd(waiting.peek()), waiting=False) != "defer":
                self._dispatch(waiting.pop())
                continue
            if closing:
                return
            if busy(self.built):
                self._step(self.built.pump)  # one engine step: what it produced
                continue
            closing = self._take(self.queue.get(), waiting)

    def _take(self, e: Entry | None, waiting: TenantQueue[Entry]) -> bool:
        """An entry off the queue: an abort runs at once, a command the engine's batch takes
        joins it, the rest wait their turn. True: shut down."""
        if e is None:
            return True
        if e.kind == "abort":
            self._abort(str(e.args["key"]))
        elif placement(self.built, _cmd(e), waiting=bool(waiting)) == "submit":
            self._dispatch(e)
        else:
            waiting.push(tenant_of(e.args), e)
        return False

    def _dispatch(self, e: Entry) -> None:
        if submits(self.built, _cmd(e)):
            self._submit(e)
            return
        with self.lock:
            if e.state != "queued":
                return  # cancelled while queued
            WORKER_CALL.move(e, "running")
            self.current = e
        reply = self.execute(e)
        with self.lock:
            self.current = None
            self._finish(e, reply)

    def _submit(self, e: Entry) -> None:
        """Add the entry's command to the engine's batch (`engine.submit`)."""
        stream = e.kind == "stream"
        reply: dict[str, Any]
        if e.state != "queued":
            return  # a call cancelled while it waited
        if stream and e.cancel.is_set():  # aborted before it started
            reply = {"ok": True, "result": {"token_ids": [], "finished": True,
                                            "finish_reason": "abort"}}  # fmt: skip
        else:
            self.submit_count += 1
            sid = self.submit_count
            try:
                done = self.built.submit(sid, _cmd(e), e.args)
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as exc:
                reply = {"ok": False, "error": error_body(exc, _cmd(e))}
            else:
                if done is None:
                    WORKER_CALL.move(e, "running")
                    self.submitted[sid] = e
                    self.spans.start(e.key, _cmd(e), e.meta.get(tracing.TRACE_KEY))
                    return
                reply = {"ok": True, "result": done}
        self._end(e, reply)

    def _end(self, e: Entry, reply: dict[str, Any]) -> None:
        self.spans.end(e.key, bool(reply.get("ok")))
        with self.lock:
            if e.kind == "stream":
                self.stream_entries.pop(e.key, None)
                self._finish_stream(e, reply)
            else:
                self._finish(e, reply)

    def _abort(self, key: str) -> None:
        """End the command `key` (a stream the client left, a cancelled call) in the engine."""
        with self.lock:
            e = self.stream_entries.get(key) or self.journal.get(key)
        if e is None or e.state == "done":
            return  # ended already
        e.cancel.set()
        sid = next((i for i, x in self.submitted.items() if x is e), None)
        if sid is not None:
            for msg in self.built.abort(sid):
                self._engine_send(msg)

    def _step(self, pump: Any) -> None:
        """One engine step: its stream partials go out as one message per connection (like
        `engines.worker.messages.send_step`), then what finished."""
        out: list[dict[str, Any]] = []
        pump(out.append)
        by_chan: dict[int, tuple[Channel, list[dict[str, Any]]]] = {}
        for msg in out:
            e = self.submitted.get(int(msg.get("id") or 0))
            if e is None or "partial" not in msg:
                continue
            for chan, mid in e.waiters:
                by_chan.setdefault(id(chan), (chan, []))[1].append(
                    {"id": mid, "partial": msg["partial"]}
                )
        for chan, msgs in by_chan.values():
            chan.send(msgs[0] if len(msgs) == 1 else {"kind": BATCH_KIND, "msgs": msgs})
        for msg in out:
            if "partial" not in msg:
                self._engine_send(msg)

    def _engine_send(self, msg: dict[str, Any]) -> None:
        """A message of the engine's `pump` / `abort`, keyed by its batch id."""
        sid = int(msg.get("id") or 0)
        e = self.submitted.get(sid)
        if e is None:
            return
        if "partial" in msg:
            for chan, mid in list(e.waiters):
                chan.send({"id": mid, "partial": msg["partial"]})
            return
        del self.submitted[sid]
        reply = {k: v for k, v in msg.items() if k != "id"}
        if not reply.get("ok") and (reply.get("error") or {}).get("code") == "request_cancelled":
            rid = e.meta.get("request_id") or e.key
            err = {"code": "request_cancelled", "message": f"request {rid} was cancelled while "
                   "it ran", "details": {"request_id": rid}}  # fmt: skip
            reply = {"ok": False, "error": err}
        self._end(e, reply)

    @staticmethod
    def _finish_stream(e: Entry, reply: dict[str, Any]) -> None:
        WORKER_CALL.move(e, "done")
        e.reply = reply
        waiters, e.waiters = e.waiters, []
        for chan, mid in waiters:
            chan.send({"id": mid, **reply})

    def execute(self, e: Entry) -> dict[str, Any]:
        if self.engine is None:
            return {"ok": False, "error": {"code": "unavailable", "message": "engine not ready"}}
        fn = lookup(self.engine, e.cmd)
        try:
            if fn is None:
                raise WorkerError(
                    "unimplemented", f"{type(self.engine).__name__} has no op {e.cmd!r}"
                )
            self.engine.note(e.meta, e.cancel)
            with tracing.worker_span(e.cmd, e.meta.get(tracing.TRACE_KEY)):
                return {"ok": True, "result": fn(**e.args)}
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:
            return {"ok": False, "error": error_body(exc, e.cmd)}


def _cmd(e: Entry) -> str:
    return "generate_stream" if e.kind == "stream" else e.cmd


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m arctic_servers.gateway.worker_host")
    ap.add_argument("--spec", required=True, help="JSON file with the sub-job's worker spec")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    atexit.register(remove_shm_buffers)  # on shutdown and on SIGTERM; a SIGKILL leaves them
    spec = json.loads(Path(args.spec).read_text())
    host = WorkerHost(spec)
    authkey = bytes.fromhex(spec["authkey"])
    listener = Listener((spec.get("host") or "127.0.0.1", 0), authkey=authkey)
    address = listener.address
    status = Path(spec["status_file"])
    tmp = status.with_suffix(".tmp")
    tmp.write_text(json.dumps({"address": list(address), "pid": os.getpid()}))
    tmp.replace(status)
    print(f"worker {spec.get('sub_job_id')}: pid {os.getpid()}, listening on {address}", flush=True)
    threading.Thread(target=host.serve_connections, args=(listener,), daemon=True).start()
    if spec.get("parent_pid"):
        threading.Thread(target=watch_parent, args=(int(spec["parent_pid"]),), daemon=True).start()
    t0 = time.perf_counter()
    if spec.get("engine") == "onprem":
        from ..engines.deepspeed.ranks import set_failure_handler

        set_failure_handler(lambda reason: rank_lost(host, reason))
    try:
        host.engine, extra = build_engine(spec)
        info = {**host.engine.info(), **extra}
    except BaseException as exc:
        traceback.print_exc()
        host.error = error_body(exc, f"{spec.get('role')} engine start")
        WORKER_HOST.move(host, "failed")
        time.sleep(3600)  # keep answering `status` until the gateway stops this process
        return 1
    info.update(pid=os.getpid(), startup_s=round(time.perf_counter() - t0, 3))
    host.info = info
    WORKER_HOST.move(host, "ready")
    print(f"worker {spec.get('sub_job_id')}: ready in {info['startup_s']} s", flush=True)
    host.run()
    remove_shm_buffers()  # before the engine unmaps them (an unlinked mapping stays valid)
    if host.engine is not None:
        host.engine.close()
    print(f"worker {spec.get('sub_job_id')}: shut down", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
