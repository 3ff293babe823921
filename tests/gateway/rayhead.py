"""A local Ray instance for the gateway's Ray tests: `ray start --head --block` with 2 CPUs.

Its node address is loopback (127.0.0.1): the gateway connects there, and its worker hosts bind
there through ARCTIC_GATEWAY_RAY_BIND (Ray's own servers still listen on every interface). The
ports Ray would take at fixed defaults (GCS 6379, client server 10001, dashboard agent 52365) are
free ones picked here and its worker ports a range per test process, so two runs on one machine
do not collide; its other ports Ray picks at random.

The head runs in a session of its own: every process Ray starts (GCS, raylet, agents, actor
workers) is in that session and none of them leaves it, so stopping the instance is SIGTERM to
the blocking `ray start` (which stops what it started), then SIGKILL to whatever of the session
is left, and the processes are checked gone. Nothing else on the machine is touched
(`ray stop` would stop every Ray instance of this user).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from arctic_servers.protocol.serve import free_port

ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
RAY_MISSING = "ray is not installed: pip install -e '.[ray]' (the dev extra has it)"


def require_ray() -> None:
    """Skip without ray; under CI (`CI` set, where tools/test.sh installs it) fail instead."""
    if importlib.util.find_spec("ray") is None:
        if os.environ.get("CI"):
            pytest.fail(RAY_MISSING)
        pytest.skip(RAY_MISSING)


def session_pids(sid: int) -> set[int]:
    """The live processes of session `sid` (zombies excluded)."""
    out = set()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[3]) == sid:
            out.add(int(d.name))
    return out


def _signal(pids: set[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


@contextlib.contextmanager
def local_ray_head(num_cpus: int = 2, start_timeout: float = 120.0) -> Iterator[str]:
    """Start the instance; yields its address `127.0.0.1:PORT`; stops it and checks that none
    of its processes is left (AssertionError naming them otherwise)."""
    tmp = tempfile.mkdtemp(prefix="arcray")  # short: Ray's socket paths must stay < 108 bytes
    log = Path(tmp) / "ray-start.log"
    port = free_port()
    lo = 20000 + (os.getpid() * 61) % 12000  # worker ports: a range per test process, below
    # the ephemeral ports (32768+) that free_port() and outgoing connections draw from
    argv = [
        sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
        "--node-ip-address", "127.0.0.1", "--port", str(port), "--num-cpus", str(num_cpus),
        "--num-gpus", "0", "--include-dashboard", "false", "--disable-usage-stats",
        "--temp-dir", tmp, "--ray-client-server-port", str(free_port()),
        "--dashboard-agent-listen-port", str(free_port()),
        "--min-worker-port", str(lo), "--max-worker-port", str(lo + 60),
    ]  # fmt: skip
    env = dict(os.environ, **ENV)
    env.pop("PYTHONWARNINGS", None)
    with log.open("wb") as logf:
        head = subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + start_timeout
        while b"Ray runtime started" not in log.read_bytes():
            assert head.poll() is None, f"ray start exited {head.returncode}:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"ray start did not finish:\n{log.read_text()}"
            time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        head.send_signal(signal.SIGTERM)
        # `ray start --block` rarely exits on SIGTERM within 30 s here (teardowns of 30 s were
        # measured); whatever is left is killed below, and the check that nothing remains stays
        with contextlib.suppress(subprocess.TimeoutExpired):
            head.wait(5)
        _signal(session_pids(head.pid), signal.SIGKILL)
        head.kill()
        head.wait(10)
        deadline = time.monotonic() + 10
        while (left := session_pids(head.pid)) and time.monotonic() < deadline:
            time.sleep(0.2)
        shutil.rmtree(tmp, ignore_errors=True)
        assert not left, f"Ray processes left behind: {sorted(left)}"
