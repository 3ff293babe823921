"""Worker processes of sub-jobs: launch, connect, watch, re-attach after a restart, stop.

By default a sub-job's worker is a local detached process (`worker_host.py`: its own session,
its output in a log file, a TCP port on 127.0.0.1 guarded by a per-worker authkey); with a Ray
address it is placed by a detached Ray actor with the sub-job's GPUs (`ray_backend.py`), which
starts the same worker host on its node. Either way the gateway stores the worker's record
(address, authkey, pid, log) with the job, so a restarted gateway connects to the same worker.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import secrets
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Protocol

from ..engines.config import worker_env as engine_worker_env
from ..engines.deepspeed.ranks import describe_exit, lost_rank_reason
from ..rules.errors import ProtocolError
from .model import SubJob
from .settings import GatewaySettings
from .workers import WorkerClient

SERVERS_DIR = Path(__file__).resolve().parents[2]
ROOT_DIR = SERVERS_DIR.parent


def worker_env(settings: GatewaySettings) -> dict[str, str]:
    """A gateway worker's environment (`engines.config.worker_env`), with the checkout's SDK
    and root on its path for a worker host started from a source tree."""
    return engine_worker_env(settings.worker_threads or 0, (str(ROOT_DIR / "sdk"), str(ROOT_DIR)))


def pid_alive(pid: int, marker: str) -> bool:
    """A live (not zombie) process whose command line names `marker` (its spec file)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return False
    state = stat.rsplit(")", 1)[-1].split()[0]
    return state not in ("Z", "X") and marker in cmdline


def tail_lines(path: Path, n: int = 8) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return " | ".join(ln for ln in lines[-n:] if ln.strip())[-1500:]


class Owner(Protocol):
    """Whose workers: a job, or a LoRA pool (`lora_pools.py`); its id names their run dir."""

    @property
    def job_id(self) -> str: ...


class Supervisor:
    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self.clients: dict[str, WorkerClient] = {}
        # launched / reattached / reconnected / lost worker hosts (`gateway/metrics.py`)
        self.events: collections.Counter[str] = collections.Counter()
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ray: Any = None
        if settings.ray_address:
            from .ray_backend import RayPlacement

            self.ray = RayPlacement(
                settings.ray_address, settings.ray_namespace, settings.ray_resources
            )

    # ------------------------------------------------------------------ launch

    def _paths(self, job: Owner, sub: SubJob) -> dict[str, Path]:
        run = self.settings.run_dir / job.job_id
        run.mkdir(parents=True, exist_ok=True)
        name = sub.sub_job_id.replace(":", "_")
        return {s: run / f"{name}.{s}" for s in ("json", "status", "log")}

    async def discard_unrecorded(self, job: Owner, sub: SubJob) -> None:
        """A worker launched by a gateway that stopped before it recorded it: stop it, so that
        the launch that follows does not leave a second one behind."""
        if self.ray is not None:
            await self.ray.stop(sub)
            return
        marker = str(self._paths(job, sub)["json"]).encode()
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                cmd = (d / "cmdline").read_bytes()
            except OSError:
                continue
            if b"worker_host" in cmd and marker in cmd:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(int(d.name), signal.SIGKILL)

    async def launch(self, job: Owner, sub: SubJob, engine_spec: dict[str, Any]) -> dict[str, Any]:
        """Start the sub-job's worker; its record once it listens (its engine may still load)."""
        paths = self._paths(job, sub)
        authkey = secrets.token_bytes(32)
        spec = {
            "sub_job_id": sub.sub_job_id,
            "role": sub.role,
            "engine": self.settings.engine,
            "engine_spec": engine_spec,
            "host": "127.0.0.1",
            "authkey": authkey.hex(),
            "status_file": str(paths["status"]),
            "log": str(paths["log"]),
        }
        paths["status"].unlink(missing_ok=True)
        fd = os.open(paths["json"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(spec, f)
        record: dict[str, Any] = {
            "backend": "ray" if self.ray is not None else "local",
            "authkey": authkey.hex(),
            "log": str(paths["log"]),
            "spec": str(paths["json"]),
        }
        if self.ray is not None:
            # the worker host listens on its node's address, or ARCTIC_GATEWAY_RAY_BIND
            spec["host"] = os.environ.get("ARCTIC_GATEWAY_RAY_BIND", "")
            spec["python"] = self.settings.worker_python  # must exist on the Ray nodes
            timeout = self.settings.worker_start_timeout_s
            placed = await self.ray.place(sub, spec, worker_env(self.settings), timeout)
            record.update(placed)
            self.events["launched"] += 1
            return record
        with paths["log"].open("ab") as logf:
            argv = [self.settings.worker_python, "-m", "arctic_servers.gateway.worker_host"]
            proc = subprocess.Popen(
                [*argv, "--spec", str(paths["json"])],
                env=worker_env(self.settings),
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # outlives the gateway; stop() signals its group
                close_fds=True,
            )
        self._procs[sub.sub_job_id] = proc
        deadline = time.monotonic() + 60.0
        while not paths["status"].exists():
            rc = proc.poll()
            if rc is not None or time.monotonic() > deadline:
                what = describe_exit(rc) if rc is not None else "did not listen within 60 s"
                raise ProtocolError(
                    "sub_job_failed",
                    f"sub-job {sub.sub_job_id}: its worker {what}: {tail_lines(paths['log'])}",
                    sub_job_id=sub.sub_job_id,
                )
            await asyncio.sleep(0.02)
        status = json.loads(paths["status"].read_text())
        record.update(pid=int(status["pid"]), address=list(status["address"]))
        self.events["launched"] += 1
        return record

    # ------------------------------------------------------------------ connect and watch

    def gone(self, sub: SubJob) -> str | None:
        """Why the sub-job's worker is gone, or None while it lives."""
        w = sub.worker
        if not w:
            return "it has no worker"
        proc = self._procs.get(sub.sub_job_id)
        tail = tail_lines(Path(w.get("log", "")))
        suffix = f"; last output: {tail}" if tail else ""
        if proc is not None:
            rc = proc.poll()
            if rc is None:
                return None
            lost = lost_rank_reason(tail)  # a multi-rank trainer says which rank it lost
            if lost:
                return f"worker (pid {proc.pid}) {lost}"
            return f"worker (pid {proc.pid}) {describe_exit(rc)}{suffix}"
        if w.get("backend") == "ray":
            assert self.ray is not None
            why = self.ray.gone(sub)
            return None if why is None else f"{why}{suffix}"
        pid = int(w.get("pid") or 0)
        if pid and pid_alive(pid, str(w.get("spec", ""))):
            return None
        return f"worker (pid {pid}) is gone{suffix}"

    async def attach(self, sub: SubJob) -> WorkerClient:
        w = sub.worker
        old = self.clients.get(sub.sub_job_id)
        if old is not None and old.failure is None and old.stopping is None:
            return old
        host, port = w["address"]
        client = WorkerClient(
            sub.sub_job_id,
            (str(host), int(port)),
            bytes.fromhex(w["authkey"]),
            alive=lambda: self.gone(sub),
            events=self.events,
        )
        await client.connect()
        self.clients[sub.sub_job_id] = client
        return client

    def client(self, sub: SubJob) -> WorkerClient | None:
        return self.clients.get(sub.sub_job_id)

    async def wait_ready(self, sub: SubJob, timeout: float) -> dict[str, Any]:
        client = await self.attach(sub)
        deadline = time.monotonic() + timeout
        while True:
            st = await client.status()
            if st.get("state") == "ready":
                return dict(st.get("info") or {})
            if st.get("state") == "failed":
                err = st.get("error") or {}
                raise ProtocolError(
                    "sub_job_failed",
                    f"sub-job {sub.sub_job_id}: engine start failed: {err.get('message', err)}",
                    sub_job_id=sub.sub_job_id,
                )
            if time.monotonic() > deadline:
                raise ProtocolError(
                    "deadline_exceeded",
                    f"sub-job {sub.sub_job_id}: the engine did not start within {timeout:.0f} s",
                    sub_job_id=sub.sub_job_id,
                )
            await asyncio.sleep(0.05)

    # ------------------------------------------------------------------ stop

    async def stop(self, sub: SubJob, error: ProtocolError, grace: float = 5.0) -> None:
        """Stop the worker: a shutdown message, then SIGTERM / SIGKILL to its process group."""
        client = self.clients.pop(sub.sub_job_id, None)
        w = sub.worker or {}
        if client is not None:
            if client.failure is None:
                await client.shutdown(timeout=grace)
            client.close(error)
        if w.get("backend") == "ray" and self.ray is not None:
            await self.ray.stop(sub)
        else:
            await self._kill_local(sub, grace)
        if w.get("spec"):
            with contextlib.suppress(OSError):
                Path(w["spec"]).unlink()

    async def _kill_local(self, sub: SubJob, grace: float) -> None:
        pid = int((sub.worker or {}).get("pid") or 0)
        if not pid:
            return
        proc = self._procs.pop(sub.sub_job_id, None)
        for sig, wait in ((None, grace), (signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            if sig is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, sig)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                if proc is not None and proc.poll() is not None:
                    return
                if proc is None and self.gone(sub) is not None:
                    return
                await asyncio.sleep(0.05)

    async def close(self) -> None:
        """The gateway stops: drop the connections; the workers keep running."""
        for client in self.clients.values():
            client.close()
        self.clients.clear()
        if self.ray is not None:
            self.ray.close()
