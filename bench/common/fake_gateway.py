"""A fake-engine gateway for a benchmark: started in a temporary directory, ended with its worker
hosts (which outlive the gateway by design)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from .workers import kill_workers

__all__ = ["fake_gateway", "free_port"]

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def fake_gateway(
    tmp: Path, token: str, args: Sequence[str] = (), start_timeout_s: float = 120
) -> Iterator[str]:
    """`python -m arctic_servers.gateway --engine fake` with its state under `tmp`, one token and
    the extra `args`; yields its base URL; ends it and its worker hosts."""
    (tmp / "tokens").write_text(token + "\n")
    ready, port = tmp / "ready.json", free_port()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "servers"), str(ROOT / "sdk"), str(ROOT), env.get("PYTHONPATH", "")]
    )
    argv = [
        sys.executable, "-m", "arctic_servers.gateway", "--db", str(tmp / "state.db"),
        "--tokens-file", str(tmp / "tokens"), "--engine", "fake", "--port", str(port),
        "--no-grpc", "--ready-file", str(ready), *args,
    ]  # fmt: skip
    log = (tmp / "gateway.log").open("wb")
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + start_timeout_s
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the gateway did not start: {(tmp / 'gateway.log').read_text()}")
            time.sleep(0.05)
        yield str(json.loads(ready.read_text())["base_url"])
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()
        kill_workers(tmp)
