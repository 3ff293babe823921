"""An engine's command table: worker command name -> the engine method that runs it.

Each engine declares its commands in `commands()`, one explicit entry per command (so "go to
definition" leads from a command name to its method, and a static checker sees every call);
the worker process (`worker.run_command`) and the gateway's worker host look a command up here
instead of by `getattr(engine, f"op_{cmd}")`. The wire command names are the table's keys. A
multi-rank trainer's ranks answer their leader's commands from `rank_commands()` the same way
(`engines/deepspeed/follower.py`). Built once per engine (`table`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

Command = Callable[..., Any]


class HasCommands(Protocol):
    def commands(self) -> Mapping[str, Command]: ...


_LAST: list[tuple[object, Mapping[str, Command]]] = []  # the last engine's table


def table(engine: HasCommands) -> Mapping[str, Command]:
    """The engine's command table, built once (a worker process serves one engine)."""
    if _LAST and _LAST[0][0] is engine:
        return _LAST[0][1]
    built = dict(engine.commands())
    _LAST[:] = [(engine, built)]
    return built


def lookup(engine: HasCommands, cmd: Any) -> Command | None:
    """The method that runs `cmd` on `engine`, or None when it has no such command."""
    if not isinstance(cmd, str):
        return None
    return table(engine).get(cmd)
