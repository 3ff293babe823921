"""A sub-job's engine process: `python -m arctic_servers.engines.worker.worker --role R ...`.

The server starts one worker per sub-job and talks to it over an inherited socket (a
`multiprocessing.connection.Connection` on fd N: pickled dicts, NumPy arrays inside; nothing
outside the process tree can reach it). The protocol:

    worker -> server   {"kind": "idle"}     (the engine's libraries are imported; the process may
                                           wait in the server's pool until a job takes it)
    server -> worker   {"id": 1, "cmd": "init", "args": {"spec": {...}}}  (builds the engine)
    server -> worker   {"id": n, "cmd": "forward_backward", "args": {...}}
    worker -> server   {"id": n, "ok": True, "result": ...}
                       or {"id": n, "ok": False, "error": {...}}

A multi-rank trainer (`n_gpus` > 1: this worker is rank 0, `dp_training.py`) that loses one of
its ranks sends `{"kind": "failed", "reason": "lost rank r of W (pid ...) ..."}` and exits.

Errors are the spec's error body (`code`, `message`, `details`). End of input (the server went
away) ends the worker.

A sampling engine (vLLM: `submits` / `submit` / `busy` / `pump` / `abort`) runs its commands
in its continuous batch: `generate`, `generate_stream`, `log_probs` and `forward` are added to the
engine as soon as they are read, and while requests are in the engine the loop alternates
between one engine step (`pump`, which sends what the step finished) and what arrived on the
pipe. Every other command runs on the main thread, one at a time, and only while the engine is
idle (unless the engine runs it between steps: `runs_while_busy`, a LoRA pool sampler's adapter
loads): it waits (deferred) until the requests before it have finished, and the batched commands
that arrive after it wait behind it — so a weight load pauses new generates, swaps once the batch
has drained, and resumes them (`placement`). Waiting commands are served in arrival order per
tenant and tenants in turn (`tenant_queue.py`: a LoRA pool's worker serves many jobs; every other
worker has one tenant, so arrival order). `generate_stream`
answers several messages, the new tokens of each engine step and then the final reply:

    server -> worker   {"id": n, "cmd": "generate_stream", "args": {"prompt", "sampling_params"}}
    worker -> server   {"id": n, "partial": {"token_ids", "logprobs", "text", "at"}}   (0 or more)
    worker -> server   {"id": n, "ok": True, "result": {..., "finished": True, "finish_reason"}}
    server -> worker   {"id": m, "cmd": "abort_stream", "args": {"stream": n}}  (the client left)

The messages of one engine step travel as one, `{"kind": "batch", "msgs": [...]}` (`send_step`;
the reader unpacks them, `unbatch`). `abort_stream` (of any batched command, not only a stream;
a command still waiting is dropped) and `stream_stats` run at once.

The message shapes are `messages.py`, the engines' error `engines/errors.py`, the engine a spec
names `engines/registry.py` (which imports each engine only when it builds it).

This module imports neither the protocol layer nor the SDK: a worker runs in the engines'
environment, which needs only torch, DeepSpeed / vLLM and `arctic_servers`. A command message
may carry `"trace"` (the server's span context, when it traces: `telemetry/tracing.py`); only
then is the tracing module imported, and the command runs in a span of that trace.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
import traceback
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from ..errors import WorkerError, error_body
from ..registry import WORKER_ENGINES, build_engine, preload
from .commands import lookup
from .messages import ABORT_CMD, IMMEDIATE_CMDS, send_step, unbatch
from .process_env import set_threads
from .tenant_queue import TenantQueue, tenant_of

if TYPE_CHECKING:
    from .engine_base import EngineBase


def submits(engine: EngineBase, cmd: Any) -> bool:
    """Whether `cmd` joins the engine's continuous batch (`engine.submit`)."""
    return isinstance(cmd, str) and engine.submits(cmd)


def busy(engine: EngineBase) -> bool:
    return engine.busy()


def placement(engine: EngineBase, cmd: Any, *, waiting: bool) -> str:
    """Where a command goes now: "submit" (into the engine's batch), "run" (at once, the engine
    being idle, or a command the engine runs between its steps) or "defer" (after the requests
    in the engine, or behind the commands already waiting: `waiting`). Shared by this serve loop
    and the gateway's worker host."""
    if waiting:
        return "defer"
    if submits(engine, cmd):
        return "submit"
    if busy(engine) and not (isinstance(cmd, str) and engine.runs_while_busy(cmd)):
        return "defer"
    return "run"


_BATCH_SPANS: Any = None  # `protocol.tracing.WorkerSpans`, once a command carried a trace


def _span(msg: dict[str, Any]) -> Any:
    """The worker's span of a command whose message carries a trace context (the server traces);
    the tracing module is imported only then."""
    carrier = msg.get("trace")
    if not carrier:
        return contextlib.nullcontext()
    from ...telemetry.tracing import worker_span

    return worker_span(str(msg.get("cmd")), carrier)


def _batch_span(msg: dict[str, Any]) -> None:
    """A span for a command that joined the engine's batch, ended by `_replied`."""
    global _BATCH_SPANS
    if not msg.get("trace"):
        return
    if _BATCH_SPANS is None:
        from ...telemetry.tracing import WorkerSpans

        _BATCH_SPANS = WorkerSpans()
    _BATCH_SPANS.start(msg.get("id"), str(msg.get("cmd")), msg["trace"])


def _replied(send: Any) -> Any:
    """`send`, ending the batch spans of the final replies it carries."""
    if _BATCH_SPANS is None:
        return send

    def send_and_end(msg: dict[str, Any]) -> None:
        send(msg)
        for m in unbatch(msg):
            if "ok" in m:
                _BATCH_SPANS.end(m.get("id"), bool(m.get("ok")))

    return send_and_end


def run_command(engine: EngineBase, msg: dict[str, Any]) -> list[dict[str, Any]]:
    """Run one command; the messages that answer it (none for one the engine batch took)."""
    cmd, mid = msg.get("cmd"), msg.get("id")
    args = msg.get("args") or {}
    try:
        if submits(engine, cmd):
            done = engine.submit(int(mid or 0), str(cmd), args)
            if done is None:
                _batch_span(msg)
                return []
            return [{"id": mid, "ok": True, "result": done}]
        if cmd == ABORT_CMD:
            ended = engine.abort(int(args.get("stream") or 0))
            return [*ended, {"id": mid, "ok": True, "result": {"aborted": bool(ended)}}]
        fn = lookup(engine, cmd)
        if fn is None:
            raise WorkerError("unimplemented", f"{type(engine).__name__} has no op {cmd!r}")
        with _span(msg):
            return [{"id": mid, "ok": True, "result": fn(**args)}]
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        return [{"id": mid, "ok": False, "error": error_body(exc, str(cmd))}]


def _drop_waiting(waiting: TenantQueue[dict[str, Any]], msg: dict[str, Any]) -> bool:
    """An abort of a command still waiting: it never runs (its caller has gone)."""
    if msg.get("cmd") != ABORT_CMD:
        return False
    target = int((msg.get("args") or {}).get("stream") or 0)
    return bool(waiting.remove_if(lambda m: int(m.get("id") or 0) == target))


def _take(
    conn: Connection, engine: EngineBase, waiting: TenantQueue[dict[str, Any]], msg: dict[str, Any]
) -> bool:
    """One message read from the server: answered at once (an abort, a command the engine's
    batch takes) or queued with its tenant's waiting commands. True: the shutdown message."""
    cmd = msg.get("cmd")
    if cmd == "shutdown":
        return True
    if cmd in IMMEDIATE_CMDS:
        if _drop_waiting(waiting, msg):
            conn.send({"id": msg.get("id"), "ok": True, "result": {"aborted": True}})
            return False
    elif placement(engine, cmd, waiting=bool(waiting)) != "submit":
        waiting.push(tenant_of(msg.get("args")), msg)
        return False
    for reply in run_command(engine, msg):
        _replied(conn.send)(reply)
    return False


def serve(conn: Connection, engine: EngineBase) -> None:
    waiting: TenantQueue[dict[str, Any]] = TenantQueue()
    shutdown: dict[str, Any] | None = None
    while True:
        try:  # what arrived while the engine worked, queued by tenant before anything runs
            while shutdown is None and conn.poll(0):
                msg = conn.recv()
                if _take(conn, engine, waiting, msg):
                    shutdown = msg
        except (EOFError, OSError):
            return
        # the waiting command whose turn has come (`TenantQueue`: tenants in turn)
        if waiting and placement(engine, waiting.peek().get("cmd"), waiting=False) != "defer":
            for reply in run_command(engine, waiting.pop()):
                conn.send(reply)
            continue
        if shutdown is not None:  # what still waits for the batch to drain does not run
            try:
                engine.close()
            finally:
                conn.send({"id": shutdown.get("id"), "ok": True, "result": None})
            return
        if busy(engine):
            send_step(engine.pump, _replied(conn.send))  # one engine step: what it produced
            continue
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if _take(conn, engine, waiting, msg):
            shutdown = msg


def report_failure(conn: Connection, reason: str) -> None:
    """A rank of this multi-rank sub-job was lost (ranks.py): tell the server, then end."""
    from ..deepspeed.ranks import RANK_GROUP_FAILED

    print(f"{RANK_GROUP_FAILED}{reason}", flush=True)
    with contextlib.suppress(Exception):
        conn.send({"kind": "failed", "reason": f"lost {reason}"})
    os._exit(70)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m arctic_servers.engines.worker.worker")
    ap.add_argument("--role", required=True, choices=("training", "sampling", "log_prob"))
    ap.add_argument("--engine", required=True, choices=WORKER_ENGINES)
    ap.add_argument("--fd", type=int, required=True, help="inherited socket to the server")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    conn = Connection(args.fd)
    os.set_inheritable(args.fd, False)
    t0 = time.perf_counter()
    try:
        preload(args.engine)
    except BaseException as exc:
        conn.send({"kind": "init_failed", "error": error_body(exc, f"{args.engine} import")})
        traceback.print_exc()
        return 1
    conn.send({"kind": "idle", "preload_s": round(time.perf_counter() - t0, 3)})
    # the first command is always init (a pooled worker waits here until a job takes it)
    try:
        msg = conn.recv()
    except (EOFError, OSError):
        return 0
    if msg.get("cmd") != "init":
        return 0
    spec = dict(msg["args"]["spec"])
    t1 = time.perf_counter()
    if args.engine == "deepspeed":
        from ..deepspeed.ranks import set_failure_handler

        set_failure_handler(lambda reason: report_failure(conn, reason))
    try:
        set_threads(int(spec.get("num_threads") or os.environ.get("ARCTIC_NUM_THREADS") or 1))
        engine = build_engine(args.role, spec)
    except BaseException as exc:
        conn.send(
            {
                "id": msg.get("id"),
                "ok": False,
                "error": error_body(exc, f"{args.role} engine start"),
            }
        )
        traceback.print_exc()
        return 1
    info = dict(engine.info())
    info.update(pid=os.getpid(), startup_s=round(time.perf_counter() - t1, 3))
    conn.send({"id": msg.get("id"), "ok": True, "result": info})
    serve(conn, engine)
    return 0


if __name__ == "__main__":
    sys.exit(main())
