"""What every `python -m` server entry point does around its server (the on-prem server, the
gateway, `python -m conformance serve`): the ready file its launcher waits for, and the wait for
SIGINT / SIGTERM before it drains."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["stop_signal", "write_ready_file"]


def write_ready_file(path: Path | None, info: Mapping[str, Any]) -> None:
    """Write `info` as JSON to `path` atomically (a launcher polling for it never reads half)."""
    if path is None:
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(dict(info)))
    tmp.replace(path)


async def stop_signal() -> None:
    """Return once the process gets SIGINT or SIGTERM (where the loop can take signals)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
