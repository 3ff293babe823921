"""The sync `Client` called inside a running asyncio event loop: warned once, naming `AsyncClient`.

A sync call blocks the thread it runs in; in an event loop's thread that is the whole loop (a
30 s step froze every other task for 36 s, silently). The call still runs (scripts in Jupyter,
whose cell runs inside a loop, rely on it); the first such call of each client warns with
`SyncClientInEventLoopWarning`, pointing at the caller's line. Silence it with
`warnings.simplefilter("ignore", arctic_sdk.SyncClientInEventLoopWarning)`.
"""

from __future__ import annotations

import asyncio
import sys
import warnings
from pathlib import Path
from typing import Any

_PACKAGE = str(Path(__file__).resolve().parent)


class SyncClientInEventLoopWarning(RuntimeWarning):
    """A sync `Client` call blocked a running asyncio event loop: use `AsyncClient`."""


def _caller_stacklevel() -> int:
    """The stacklevel of the first frame outside arctic_sdk (the user's line)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1  # type: ignore[assignment]
    return level


def exempt(client: Any) -> None:
    """No warning from `client`: for an SDK layer whose own API is synchronous by contract (the
    compat client's constructor, `create_arctic_rl_client`, mirrors a sync upstream function)."""
    client._transport._warned_loop = True


def in_running_loop() -> bool:
    return asyncio._get_running_loop() is not None


def warn_blocking(what: str) -> None:
    """Warn that `what` (e.g. `Client.step()`) blocks the running event loop."""
    warnings.warn(
        f"{what} was called inside a running asyncio event loop: the sync Client blocks the "
        "loop (every other task) until the call returns; in async code use "
        "arctic_sdk.AsyncClient and await its calls (or await asyncio.to_thread(...) around "
        "the sync call)",
        SyncClientInEventLoopWarning,
        stacklevel=_caller_stacklevel(),
    )
