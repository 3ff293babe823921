"""The gateway's worker hosts outlive it by design (a restarted gateway collects their answers):
a benchmark that starts a gateway in a temporary directory ends them itself."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

__all__ = ["kill_workers"]


def kill_workers(tmp: Path) -> None:
    """Every worker host of the gateway whose state lives under `tmp` (found by that path)."""
    for p in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError):
            cmd = (p / "cmdline").read_bytes()
            if b"worker_host" in cmd and str(tmp).encode() in cmd:
                os.killpg(int(p.name), signal.SIGKILL)
