"""The process around a gateway worker host (`worker_host.py`): the journal entry and connection
types, the engine it builds from its spec, error bodies, and the exits — a lost rank, a parent
(Ray actor) that is gone, the DeepSpeed shared-memory files left in /dev/shm."""

from __future__ import annotations

import contextlib
import os
import threading
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..rules.states import WORKER_HOST

if TYPE_CHECKING:
    from .worker_host import WorkerHost


@dataclass
class Entry:
    key: str
    cmd: str
    args: dict[str, Any]
    meta: dict[str, Any]
    state: str = "queued"  # `states.WORKER_CALL`
    reply: dict[str, Any] | None = None  # {"ok", "result" | "error"} once done
    waiters: list[tuple[Channel, int]] = field(default_factory=list)
    cancel: threading.Event = field(default_factory=threading.Event)
    kind: str = "call"  # call, stream (a streamed sample), abort (ends the stream `key`)


class Channel:
    """One gateway connection; replies come from several threads."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.lock = threading.Lock()
        self.open = True

    def send(self, msg: dict[str, Any]) -> None:
        if not self.open:
            return
        try:
            with self.lock:
                self.conn.send(msg)
        except (OSError, ValueError, EOFError):
            self.open = False


def error_body(exc: BaseException, what: str) -> dict[str, Any]:
    code = getattr(exc, "code", None)
    if isinstance(code, str) and hasattr(exc, "message"):
        details = dict(getattr(exc, "details", {}) or {})
        return {"code": code, "message": str(exc.message), "details": details}
    return {
        "code": "internal",
        "message": f"{what} failed: {type(exc).__name__}: {exc}",
        "details": {"traceback": traceback.format_exc(limit=8)[-4000:]},
    }


def build_engine(spec: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The sub-job's engine (`engines/registry.py`), and what to add to its info."""
    from ..engines import registry

    kind = spec.get("engine", "fake")
    if kind == "fake":
        return registry.build_engine(str(spec.get("role") or ""), {**spec, "engine": "fake"}), {}
    if kind == "onprem":
        from ..engines.config import ModelChoice, resolve_model
        from ..engines.worker.process_env import set_threads

        es = dict(spec["engine_spec"])
        set_threads(int(es.get("num_threads") or os.environ.get("ARCTIC_NUM_THREADS") or 1))
        settings = ModelChoice(model=str(es.get("model") or ""))
        es["model_dir"] = str(resolve_model(str(es.get("model_name") or ""), settings))
        return registry.build_engine(str(spec["role"]), es), {"model_dir": es["model_dir"]}
    raise ValueError(f"unknown engine {kind!r}")


def remove_shm_buffers() -> None:
    """Remove the DeepSpeed CPU all-reduce buffers this process mapped: they are files in
    /dev/shm that outlive it (70 MB each), and nothing else ever removes them."""
    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return
    for path in {ln.split()[-1] for ln in maps if " /dev/shm/deepspeed_" in ln}:
        with contextlib.suppress(OSError):
            os.unlink(path)


def rank_lost(host: WorkerHost, reason: str) -> None:
    """A rank of this multi-rank trainer died (`engines/deepspeed/ranks.py`): answer the call in
    flight with `sub_job_failed`, then end (the gateway sees the exit, the reason is in the log)."""
    from ..engines.deepspeed.ranks import RANK_GROUP_FAILED

    sid = str(host.spec.get("sub_job_id") or "")
    print(f"worker {sid}: {RANK_GROUP_FAILED}{reason}", flush=True)
    err = {
        "code": "sub_job_failed",
        "message": f"sub-job {sid} failed: lost {reason}",
        "details": {"sub_job_id": sid, "reason": f"lost {reason}"},
    }
    host.error = err
    WORKER_HOST.move(host, "failed")
    with host.lock:
        if host.current is not None and host.current.state != "done":
            host._finish(host.current, {"ok": False, "error": err})
    time.sleep(0.2)  # let the answer go out
    remove_shm_buffers()
    os._exit(70)


def watch_parent(pid: int) -> None:
    while True:
        time.sleep(1.0)
        if os.getppid() != pid:
            os._exit(0)  # placed by a Ray actor that is gone
