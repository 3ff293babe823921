"""A sub-job's engine process: `python -m arctic_servers.onprem.worker --role R --engine E --fd N`.

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

Errors are the spec's error body (`code`, `message`, `details`). Commands run one at a time, in
arrival order, on the main thread. End of input (the server went away) ends the worker.

Streaming (sampling engines with `stream_start` / `pump`): `generate_stream` answers several
messages, the new tokens of each engine step and then the final reply:

    server -> worker   {"id": n, "cmd": "generate_stream", "args": {"prompt", "sampling_params"}}
    worker -> server   {"id": n, "partial": {"token_ids", "logprobs", "text", "at"}}   (0 or more)
    worker -> server   {"id": n, "ok": True, "result": {..., "finished": True, "finish_reason"}}
    server -> worker   {"id": m, "cmd": "abort_stream", "args": {"stream": n}}  (the client left)

While streams run, the loop alternates between one engine step (`pump`) and what arrived on the
pipe: another `generate_stream` joins the running batch, `abort_stream` and `stream_stats` run at
once, and every other command waits until the streams have ended (in arrival order, after them).

This module imports neither the protocol layer nor the SDK: a worker runs in the engines'
environment, which needs only torch, DeepSpeed / vLLM and `arctic_servers`.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import signal
import sys
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any


class WorkerError(Exception):
    """An error with a spec code, raised by the engines; becomes the call's error body."""

    def __init__(self, code: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details

    def body(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "details": self.details}


def error_body(exc: BaseException, what: str) -> dict[str, Any]:
    """The error body of an engine's exception. Matched by shape, not class: the worker runs as
    `__main__`, so the engines' `WorkerError` (imported as `arctic_servers.onprem.worker`) is not
    this module's class; `LossConfigError` carries a spec code the same way."""
    from arctic_sdk._generated.error_codes import ERRORS

    code, message = getattr(exc, "code", None), getattr(exc, "message", None)
    if isinstance(code, str) and code in ERRORS and isinstance(message, str):
        details = getattr(exc, "details", None)
        return {"code": code, "message": message, "details": dict(details or {})}
    tb = traceback.format_exc(limit=8)
    return {
        "code": "internal",
        "message": f"{what} failed: {type(exc).__name__}: {exc}",
        "details": {"traceback": tb[-4000:]},
    }


def set_threads(n: int) -> None:
    """Pin torch's intra-op pool to `n` threads (vLLM's CPU worker forbids changing it later)."""
    import torch

    torch.set_num_threads(n)
    with contextlib.suppress(RuntimeError):  # already set (a parallel region ran first)
        torch.set_num_interop_threads(1)


def build_engine(role: str, spec: dict[str, Any]) -> Any:
    engine = spec.get("engine") or {"training": "deepspeed", "sampling": "vllm"}.get(role, "hf")
    if engine == "deepspeed" and role == "log_prob":  # a forward-only reference model
        from .ds_scoring import DeepSpeedScoringEngine

        return DeepSpeedScoringEngine(spec)
    if engine == "deepspeed":
        from .ranks import world_size

        if world_size(spec) > 1:  # n_gpus ranks under torch.distributed (dp_training.py)
            from .dp_training import DataParallelTrainer

            return DataParallelTrainer(spec)
        from .training import TrainingEngine

        return TrainingEngine(spec)
    if engine == "vllm":
        from .sampling import SamplingEngine

        return SamplingEngine(spec)
    if engine == "hf":
        from .scoring import ScoringEngine

        return ScoringEngine(spec)
    raise WorkerError("invalid_argument", f"unknown engine {engine!r}")


STREAM_CMD = "generate_stream"  # a command answered by partial messages, then its reply
ABORT_CMD = "abort_stream"  # ends a stream early (its final reply: finish_reason "abort")
IMMEDIATE_CMDS = frozenset({ABORT_CMD, "stream_stats"})  # not deferred behind running streams


def run_command(engine: Any, msg: dict[str, Any]) -> list[dict[str, Any]]:
    """Run one command; the messages that answer it (none for a stream that started)."""
    cmd, mid = msg.get("cmd"), msg.get("id")
    args = msg.get("args") or {}
    try:
        if cmd == STREAM_CMD and hasattr(engine, "stream_start"):
            engine.stream_start(int(mid or 0), **args)
            return []
        if cmd == ABORT_CMD and hasattr(engine, "stream_abort"):
            ended = engine.stream_abort(int(args.get("stream") or 0))
            return [*ended, {"id": mid, "ok": True, "result": {"aborted": bool(ended)}}]
        fn = getattr(engine, f"op_{cmd}", None)
        if fn is None:
            raise WorkerError("unimplemented", f"{type(engine).__name__} has no op {cmd!r}")
        return [{"id": mid, "ok": True, "result": fn(**args)}]
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        return [{"id": mid, "ok": False, "error": error_body(exc, str(cmd))}]


def serve(conn: Connection, engine: Any) -> None:
    pump = getattr(engine, "pump", None)
    streaming = getattr(engine, "streaming", None)
    deferred: collections.deque[dict[str, Any]] = collections.deque()
    while True:
        busy = bool(pump is not None and streaming is not None and streaming())
        if busy and pump is not None and not conn.poll(0):
            pump(conn.send)  # one engine step: the streams' new tokens
            continue
        if not busy and deferred:
            msg, queued = deferred.popleft(), True
        else:
            try:
                msg, queued = conn.recv(), False
            except (EOFError, OSError):
                return
        cmd = msg.get("cmd")
        if cmd == "shutdown":
            try:
                engine.close()
            finally:
                conn.send({"id": msg.get("id"), "ok": True, "result": None})
            return
        # behind running streams or deferred commands, a command waits its turn; a new stream
        # joins the running batch (unless commands wait before it), aborts run at once
        joins = cmd == STREAM_CMD and not deferred
        if not queued and (busy or deferred) and cmd not in IMMEDIATE_CMDS and not joins:
            deferred.append(msg)
            continue
        for reply in run_command(engine, msg):
            conn.send(reply)


def torch_extensions_dir() -> str:
    """Where DeepSpeed's JIT-built ops are cached: one directory per interpreter prefix.

    torch's default (`~/.cache/torch_extensions/py311_cpu`) is shared by every environment of
    the same Python and torch build; two venvs then rebuild each other's ops (about 30-60 s a
    time). `tools/install_engines.sh` prebuilds into this same directory.
    """
    import hashlib

    tag = hashlib.sha256(sys.prefix.encode()).hexdigest()[:12]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "arctic", "torch_extensions", tag)


def preload(engine: str) -> None:
    """Import the engine's libraries before any job needs them (the slow part of a start-up)."""
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", torch_extensions_dir())
    import torch

    cuda = bool(torch.cuda.is_available())
    if engine == "deepspeed":
        if not cuda:
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        import deepspeed  # noqa: F401
        from transformers import AutoModelForCausalLM
    elif engine == "vllm":
        from .sampling import set_vllm_env

        set_vllm_env(cuda)
        from vllm import LLM, SamplingParams  # noqa: F401
    else:
        from transformers import AutoModelForCausalLM  # noqa: F401


def report_failure(conn: Connection, reason: str) -> None:
    """A rank of this multi-rank sub-job was lost (ranks.py): tell the server, then end."""
    from .ranks import RANK_GROUP_FAILED

    print(f"{RANK_GROUP_FAILED}{reason}", flush=True)
    with contextlib.suppress(Exception):
        conn.send({"kind": "failed", "reason": f"lost {reason}"})
    os._exit(70)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m arctic_servers.onprem.worker")
    ap.add_argument("--role", required=True, choices=("training", "sampling", "log_prob"))
    ap.add_argument("--engine", required=True, choices=("deepspeed", "vllm", "hf"))
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
        from .ranks import set_failure_handler

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
