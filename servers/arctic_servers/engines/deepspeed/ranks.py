"""The rank group of a multi-rank (data-parallel) training sub-job: launch, connect, watch.

A training sub-job with `n_gpus` = W > 1 runs W processes under torch.distributed (gloo on CPU,
NCCL on GPU). Rank 0 is the sub-job's worker (the on-prem `worker.py` or the gateway's
`worker_host.py`): it alone talks to the server. Ranks 1..W-1 are followers
(`python -m arctic_servers.engines.deepspeed.follower`, their spec in `ARCTIC_RANK_SPEC`),
started either by rank 0 itself (`launch: "local"`, the default: children in its process group, so
stopping the worker stops them) or by someone else (`launch: "external"`: the gateway's Ray
backend, one actor per rank).

Besides torch.distributed (which DeepSpeed uses for the gradient all-reduce), every follower holds
one control connection to rank 0 (`multiprocessing.connection`, authkey): rank 0 sends each rank
its command and its share of the batch there and reads its answer back. The connection is also
the liveness signal: when a follower dies (`kill -9`, OOM, a crash) its socket closes at once, and
rank 0 calls the failure handler with a reason naming the rank — the on-prem worker reports it to
the server and exits; the gateway's worker host logs it and exits — so the sub-job fails within
moments instead of hanging in a collective. A follower exits when its connection to rank 0 ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection, Listener
from typing import Any

from ..errors import WorkerError
from ..worker.replies import no_delay

SPEC_ENV = "ARCTIC_RANK_SPEC"
CONNECT_TIMEOUT_S = 600.0  # followers wait this long for rank 0's control port
FOLLOWER_LOST = "closed its connection to rank 0 (it died, or its host is unreachable)"
FOLLOWER_MODULE = "arctic_servers.engines.deepspeed.follower"  # `python -m` of ranks 1..W-1


def world_size(spec: Mapping[str, Any]) -> int:
    """Ranks of a sub-job: a training sub-job's `n_gpus` (1 for every other role)."""
    if str(spec.get("role") or "training") != "training":
        return 1
    conf = spec.get("config") or {}
    return max(1, int(conf.get("n_gpus") or 1))


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def describe_exit(rc: int | None, closed: str = "closed its connection") -> str:
    """How a process ended, from its exit status (None: it only closed its connection, which
    `closed` says). Worker processes (on-prem and gateway) and followers are described alike."""
    if rc is None:
        return closed
    if rc < 0:
        try:
            return f"was killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"was killed by signal {-rc}"
    return f"exited with code {rc}"


def dist_env(rank: int, world: int, local_rank: int, addr: str, port: int) -> dict[str, str]:
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(world),
        "LOCAL_SIZE": str(world if local_rank == rank else 1),
        "MASTER_ADDR": addr,
        "MASTER_PORT": str(port),
    }


def follower_spec(
    engine_spec: Mapping[str, Any], rank: int, world: int, dist: Mapping[str, Any]
) -> dict[str, Any]:
    """What a follower needs (`ARCTIC_RANK_SPEC`): its engine spec, rank, and rank 0's addresses
    (`dist`: master_addr, master_port, control_port, authkey)."""
    return {
        "engine_spec": {k: v for k, v in engine_spec.items() if k != "dist"},
        "rank": rank,
        "world_size": world,
        "master_addr": str(dist["master_addr"]),
        "master_port": int(dist["master_port"]),
        "control": [str(dist["master_addr"]), int(dist["control_port"])],
        "authkey": str(dist["authkey"]),
    }


def remove_shm_buffers(addr: str, port: int) -> None:
    """Remove the DeepSpeed CPU all-reduce buffers of this rank group (`/dev/shm`, about 70 MB a
    rank, named after MASTER_ADDR and MASTER_PORT): they outlive their processes otherwise. An
    unlinked buffer stays valid for the processes that still map it."""
    with contextlib.suppress(OSError):
        for name in os.listdir("/dev/shm"):
            if name.startswith("deepspeed_") and f"_{addr}_{port}_" in name:
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join("/dev/shm", name))


# ---------------------------------------------------------------------------- failure handler


RANK_GROUP_FAILED = "rank group failed: "  # the log line a failed rank group's worker ends with


def lost_rank_reason(log_tail: str) -> str | None:
    """The reason a worker's log gives for losing its rank group (its last such line), or None:
    a supervisor that only sees the exit (code 70) reports this instead of the bare exit."""
    found = log_tail.rfind(RANK_GROUP_FAILED)
    if found < 0:
        return None
    return "lost " + log_tail[found + len(RANK_GROUP_FAILED) :].split(" | ")[0].strip()


def _default_failure(reason: str) -> None:
    print(f"{RANK_GROUP_FAILED}{reason}", flush=True)
    os._exit(70)


_on_failure: Callable[[str], None] = _default_failure


def set_failure_handler(fn: Callable[[str], None]) -> None:
    """What rank 0 does when a follower is lost (called from a watcher thread; must not return
    into a usable group: report, then end the process)."""
    global _on_failure
    _on_failure = fn


class RankLost(Exception):
    pass


# ---------------------------------------------------------------------------- rank 0


class _Follower:
    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.conn: Connection | None = None
        self.pid: int | None = None
        self.host = ""
        self.proc: subprocess.Popen[bytes] | None = None
        self.replies: queue.Queue[Any] = queue.Queue()
        self.tail: deque[str] = deque(maxlen=6)


class RankGroup:
    """Rank 0's view of its followers (create it before torch.distributed is initialised)."""

    def __init__(self, spec: Mapping[str, Any], world: int) -> None:
        dist = dict(spec.get("dist") or {})
        self.world = world
        self.sub_job_id = str(spec.get("sub_job_id") or "")
        self.launch = str(dist.get("launch") or "local")
        self.addr = str(dist.get("master_addr") or "127.0.0.1")
        self.master_port = int(dist.get("master_port") or free_port(self.addr))
        self.authkey = bytes.fromhex(str(dist.get("authkey") or secrets.token_hex(32)))
        self.followers = {r: _Follower(r) for r in range(1, world)}
        self.lost: str | None = None
        self.closing = False
        self._lock = threading.Lock()
        self.listener = Listener(
            (self.addr, int(dist.get("control_port") or 0)), authkey=self.authkey
        )
        self.control = self.listener.address
        threading.Thread(target=self._accept, daemon=True, name="rank-accept").start()

    def env(self) -> dict[str, str]:
        """Rank 0's torch.distributed environment."""
        env = dist_env(0, self.world, 0, self.addr, self.master_port)
        if self.launch != "local":  # one rank per actor (and GPU) on its node
            env["LOCAL_SIZE"] = "1"
        return env

    def follower_spec(self, engine_spec: Mapping[str, Any], rank: int) -> dict[str, Any]:
        dist = {
            "master_addr": self.addr,
            "master_port": self.master_port,
            "control_port": self.control[1],
            "authkey": self.authkey.hex(),
        }
        return follower_spec(engine_spec, rank, self.world, dist)

    # -- local launch ---------------------------------------------------------------------

    def launch_local(self, engine_spec: Mapping[str, Any]) -> None:
        """Start ranks 1..W-1 as children of this process (same process group)."""
        for r, f in self.followers.items():
            env = dict(os.environ)
            env.update(dist_env(r, self.world, r, self.addr, self.master_port))
            env[SPEC_ENV] = json.dumps(
                dict(self.follower_spec(engine_spec, r), parent_pid=os.getpid())
            )
            f.proc = subprocess.Popen(
                [sys.executable, "-m", FOLLOWER_MODULE],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            f.pid = f.proc.pid
            threading.Thread(target=self._echo, args=(f,), daemon=True).start()
            threading.Thread(target=self._wait_child, args=(f,), daemon=True).start()

    def _echo(self, f: _Follower) -> None:
        assert f.proc is not None and f.proc.stdout is not None
        for raw in f.proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            f.tail.append(line)
            print(f"[rank {f.rank}] {line}", flush=True)

    def _wait_child(self, f: _Follower) -> None:
        assert f.proc is not None
        rc = f.proc.wait()
        if f.conn is None:  # died before it connected (its connection's EOF reports it otherwise)
            self._lose(f, describe_exit(rc))

    # -- connections ------------------------------------------------------------------------

    def _accept(self) -> None:
        pending = len(self.followers)
        while pending:
            try:
                conn = no_delay(self.listener.accept())
                hello = conn.recv()
            except Exception:  # a stray or unauthenticated connection
                continue
            f = self.followers.get(int(hello.get("rank") or 0))
            if f is None or f.conn is not None:
                conn.close()
                continue
            f.conn, f.pid, f.host = conn, int(hello["pid"]), str(hello.get("host") or "")
            threading.Thread(target=self._read, args=(f,), daemon=True).start()
            pending -= 1
        with contextlib.suppress(OSError):
            self.listener.close()

    def _read(self, f: _Follower) -> None:
        assert f.conn is not None
        while True:
            try:
                msg = f.conn.recv()
            except (EOFError, OSError):
                break
            except Exception as exc:
                self._lose(f, f"sent an unreadable answer ({type(exc).__name__}: {exc})")
                return
            f.replies.put(msg)
        rc = None
        if f.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                rc = f.proc.wait(timeout=2.0)
        self._lose(f, describe_exit(rc, FOLLOWER_LOST))

    def _lose(self, f: _Follower, what: str) -> None:
        with self._lock:
            if self.lost is not None or self.closing:
                return
            where = f" on {f.host}" if f.host else ""
            pid = f" (pid {f.pid}{where})" if f.pid else ""
            reason = f"rank {f.rank} of {self.world}{pid} {what}"
            tail = " | ".join(ln for ln in f.tail if ln.strip())[-300:]
            if tail and not what.startswith("was killed"):  # a crash: its traceback
                reason += f"; its last output: {tail}"
            self.lost = reason
        f.replies.put(RankLost(reason))
        for g in self.followers.values():
            if g is not f:
                g.replies.put(RankLost(reason))
        remove_shm_buffers(self.addr, self.master_port)
        _on_failure(reason)

    # -- calls ------------------------------------------------------------------------------

    def wait_ready(self, timeout: float) -> list[dict[str, Any]]:
        """Each follower's engine info, once its engine is built (raises if one failed)."""
        return [self.recv(r, timeout) for r in sorted(self.followers)]

    def send(self, rank: int, cmd: str, **args: Any) -> None:
        f = self.followers[rank]
        if self.lost is not None:
            raise RankLost(self.lost)
        if f.conn is None:
            raise RankLost(f"rank {rank} of {self.world} is not connected")
        try:
            f.conn.send({"cmd": cmd, "args": args})
        except (OSError, ValueError) as exc:
            raise RankLost(
                self.lost or f"rank {rank} of {self.world}: send failed: {exc}"
            ) from None

    def recv(self, rank: int, timeout: float | None = None) -> Any:
        try:
            msg = self.followers[rank].replies.get(timeout=timeout)
        except queue.Empty:
            raise WorkerError(
                "deadline_exceeded", f"rank {rank} of {self.world} did not answer in {timeout} s"
            ) from None
        if isinstance(msg, RankLost):
            raise msg
        if not msg.get("ok"):
            err = dict(msg.get("error") or {})
            details = dict(err.get("details") or {})
            details["rank"] = rank
            raise WorkerError(
                str(err.get("code") or "internal"), str(err.get("message")), **details
            )
        return msg.get("result")

    def call_all(self, cmd: str, per_rank: Mapping[int, Mapping[str, Any]] | None = None) -> None:
        """Send `cmd` to every follower (its own arguments from `per_rank`)."""
        for r in sorted(self.followers):
            self.send(r, cmd, **dict((per_rank or {}).get(r) or {}))

    def gather(self, timeout: float | None = None) -> dict[int, Any]:
        """Every follower's answer to the command just sent (raises the first error)."""
        out: dict[int, Any] = {}
        first: BaseException | None = None
        for r in sorted(self.followers):
            try:
                out[r] = self.recv(r, timeout)
            except (WorkerError, RankLost) as exc:
                first = first or exc
        if first is not None:
            raise first
        return out

    def fail(self, reason: str) -> None:
        """The group cannot go on (a rank is stuck): the failure handler ends this process."""
        with self._lock:
            if self.lost is not None:
                return
            self.lost = reason
        _on_failure(reason)

    def hold_if_lost(self, grace: float = 2.0) -> None:
        """After a failed collective: when a follower died, let the failure handler (which ends
        this process) report that, rather than the collective's own error."""
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if self.lost is not None:
                time.sleep(grace)  # the handler is ending the process
                return
            time.sleep(0.05)

    def close(self) -> None:
        self.closing = True
        for f in self.followers.values():
            if f.conn is not None:
                with contextlib.suppress(Exception):
                    f.conn.send({"cmd": "shutdown", "args": {}})
        for f in self.followers.values():
            if f.proc is not None:
                try:
                    f.proc.wait(10)
                except subprocess.TimeoutExpired:
                    f.proc.kill()
            if f.conn is not None:
                with contextlib.suppress(OSError):
                    f.conn.close()
        remove_shm_buffers(self.addr, self.master_port)


# ---------------------------------------------------------------------------- followers
