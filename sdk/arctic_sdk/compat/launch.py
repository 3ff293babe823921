"""Launching the on-prem server for a legacy `backend="local"` config.

`launch_onprem(host, port, ...)` runs `python -m arctic_servers.onprem serve` in a child process,
waits for its ready file (written once it serves), and returns a `LaunchedServer` that stops it.
The SDK only starts the process: the server package is needed in the interpreter that runs it
(`server_python`), not in the driver's.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ArcticTimeoutError, ServiceUnavailableError

__all__ = ["LaunchedServer", "launch_onprem", "reachable"]


def reachable(host: str, port: int, timeout: float = 0.5) -> bool:
    """True when something accepts TCP connections at host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


@dataclass
class LaunchedServer:
    """A server process this client started; `stop()` ends it (idempotent)."""

    proc: subprocess.Popen[bytes]
    base_url: str
    info: dict[str, Any] = field(default_factory=dict)
    output: deque[str] = field(default_factory=lambda: deque(maxlen=200))
    _drainer: threading.Thread | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, grace: float = 10.0) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        if self._drainer is not None:
            self._drainer.join(5)
        if self.proc.stdout is not None:
            with contextlib.suppress(OSError):
                self.proc.stdout.close()


def _drain(proc: subprocess.Popen[bytes], out: deque[str], echo: bool = False) -> None:
    assert proc.stdout is not None
    try:
        for raw in proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip()
            out.append(line)
            if echo:  # `server_logs`: the launched server's output on this process's stdout
                print(f"[arctic server] {line}", flush=True)
    except (OSError, ValueError):  # closed by stop()
        pass
    finally:
        with contextlib.suppress(OSError):
            proc.stdout.close()


def launch_onprem(
    host: str,
    port: int,
    *,
    python: str | None = None,
    tokens: tuple[str, ...] = (),
    timeout: float = 300.0,
    extra_args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    echo: bool = False,
) -> LaunchedServer:
    """Start the on-prem server on host:port and wait until it serves."""
    ready = Path(tempfile.mkdtemp(prefix="arctic-launch-")) / "ready.json"
    argv = [
        python or sys.executable,
        "-m",
        "arctic_servers.onprem",
        "serve",
        "--host",
        host,
        "--port",
        str(port),
        "--ready-file",
        str(ready),
        "--no-grpc",
        *extra_args,
    ]
    for t in tokens:
        argv += ["--token", t]
    child_env = dict(os.environ if env is None else env)
    child_env.pop("PYTHONWARNINGS", None)
    proc = subprocess.Popen(
        argv,
        env=child_env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: stop() takes its workers down too
    )
    server = LaunchedServer(proc, f"http://{host}:{port}")
    server._drainer = threading.Thread(target=_drain, args=(proc, server.output, echo), daemon=True)
    server._drainer.start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready.is_file():
            server.info = json.loads(ready.read_text())
            server.base_url = str(server.info.get("base_url") or server.base_url)
            return server
        if proc.poll() is not None:
            tail = " | ".join(list(server.output)[-8:])
            raise ServiceUnavailableError(
                f"the on-prem server exited with code {proc.returncode} before serving: {tail}",
                code="unavailable",
            )
        time.sleep(0.1)
    server.stop()
    raise ArcticTimeoutError(
        f"the on-prem server did not serve within {timeout:.0f} s at {host}:{port}",
        code="deadline_exceeded",
    )
