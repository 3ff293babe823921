"""A follower rank (1..W-1) of a multi-rank trainer: `python -m
arctic_servers.engines.deepspeed.follower`, its spec in `ARCTIC_RANK_SPEC` (`ranks.py` starts it,
or the gateway's Ray backend). It joins torch.distributed, connects to rank 0's control port, builds
its `RankTrainer` and runs the `rank_*` commands rank 0 sends until `shutdown` or rank 0 is gone.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import signal
import socket
import sys
import threading
import time
import traceback
from multiprocessing.connection import Client

from ..errors import error_body
from ..worker.process_env import set_threads
from ..worker.replies import no_delay
from .ranks import CONNECT_TIMEOUT_S, FOLLOWER_MODULE, SPEC_ENV, dist_env, remove_shm_buffers


def _watch_parent(pid: int) -> None:
    while True:
        time.sleep(1.0)
        if os.getppid() != pid:
            os._exit(0)  # rank 0 is gone


def follower_main() -> int:
    spec = json.loads(os.environ.pop(SPEC_ENV))
    rank, world = int(spec["rank"]), int(spec["world_size"])
    os.environ.update(
        {k: v for k, v in dist_env(rank, world, rank, "", 0).items() if k not in os.environ}
    )
    os.environ["MASTER_ADDR"] = str(spec["master_addr"])
    os.environ["MASTER_PORT"] = str(spec["master_port"])
    if spec.get("parent_pid"):
        threading.Thread(target=_watch_parent, args=(int(spec["parent_pid"]),), daemon=True).start()
    address = (str(spec["control"][0]), int(spec["control"][1]))
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while True:
        try:
            conn = no_delay(Client(address, authkey=bytes.fromhex(spec["authkey"])))
            break
        except (OSError, EOFError):
            if time.monotonic() > deadline:
                print(f"rank {rank}: rank 0's control port {address} never answered", flush=True)
                return 1
            time.sleep(0.1)
    conn.send({"rank": rank, "pid": os.getpid(), "host": socket.gethostname()})
    atexit.register(remove_shm_buffers, str(spec["master_addr"]), int(spec["master_port"]))

    es = dict(spec["engine_spec"])
    try:
        set_threads(int(es.get("num_threads") or os.environ.get("ARCTIC_NUM_THREADS") or 1))
        if not es.get("model_dir"):
            from ..config import ModelChoice, resolve_model

            settings = ModelChoice(model=str(es.get("model") or ""))
            es["model_dir"] = str(resolve_model(str(es.get("model_name") or ""), settings))
        from .dp_training import RankTrainer

        engine = RankTrainer(es)
    except BaseException as exc:
        traceback.print_exc()
        conn.send({"ok": False, "error": error_body(exc, f"rank {rank} engine start")})
        return 1
    conn.send({"ok": True, "result": engine.info()})
    commands = engine.rank_commands()
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return 0
        cmd = str(msg.get("cmd"))
        if cmd == "shutdown":
            engine.close()
            return 0
        try:
            fn = commands.get(cmd)
            if fn is None:
                raise ValueError(f"{type(engine).__name__} has no rank command {cmd!r}")
            reply = {"ok": True, "result": fn(**msg["args"])}
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            traceback.print_exc()
            reply = {"ok": False, "error": error_body(exc, f"rank {rank}: {cmd}")}
        try:
            conn.send(reply)
        except (OSError, ValueError):
            return 1


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(prog=f"python -m {FOLLOWER_MODULE}").parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return follower_main()


if __name__ == "__main__":
    sys.exit(main())
