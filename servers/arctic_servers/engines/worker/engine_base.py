"""What a worker process and the gateway's worker host ask of an engine, declared once.

Every engine (`engines/fake`, the DeepSpeed trainer and scorers, the vLLM sampler) derives from
`EngineBase` and overrides what it has; the worker loop (`worker.serve`), the gateway's
`WorkerHost` and `commands.lookup` call these methods directly, never by `getattr` on a name:

- `commands()`: the command table (`commands.py`), every engine's own;
- `info()`: what the server learns at start (vocabulary size, timings); `stats()`: counters a
  test reads; `note(meta, cancel)`: who asked for the next command, and its cancel flag;
  `close()`: at shutdown;
- the continuous batch, for an engine whose commands share engine steps (the vLLM sampler):
  `submits(cmd)` (does `cmd` join the batch), `submit`, `busy`, `pump` (one engine step) and
  `abort` (end a batched command early), and `runs_while_busy(cmd)` (a command that need not
  wait for the batch to drain: a LoRA pool sampler's adapter loads). The defaults are those of
  an engine without one: every command runs at once, alone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from ..errors import WorkerError
from .commands import Command
from .messages import ABORT_CMD

V = TypeVar("V")


class EngineBase:
    def commands(self) -> Mapping[str, Command]:
        """Worker command name -> the method that runs it (none by default)."""
        return {}

    def info(self) -> dict[str, Any]:
        return {}

    def stats(self) -> dict[str, Any]:
        return {}

    def note(self, meta: Mapping[str, Any], cancel: threading.Event) -> None:
        """Called before each command (gateway workers): who asked, and its cancel flag."""

    def close(self) -> None:
        """Release what the engine holds (processes, shared memory) at shutdown."""

    # -- the continuous batch (none by default) --------------------------------------------

    def submits(self, cmd: str) -> bool:
        return False

    def submit(self, msg_id: int, cmd: str, args: Mapping[str, Any]) -> dict[str, Any] | None:
        raise WorkerError("unimplemented", f"{cmd!r} does not run in the engine's batch")

    def busy(self) -> bool:
        return False

    def runs_while_busy(self, cmd: str) -> bool:
        """Whether `cmd` (not a batched one) may run between two engine steps instead of
        waiting until the batch is empty."""
        return False

    def pump(self, send: Callable[[dict[str, Any]], None]) -> None:
        """One engine step; `send` each message it produced."""

    def abort(self, msg_id: int) -> list[dict[str, Any]]:
        raise WorkerError("unimplemented", f"{type(self).__name__} has no op {ABORT_CMD!r}")


def tenant_in(tenants: Mapping[str, V], name: str, engine: str) -> V:
    """Tenant `name` of a pool engine's `tenants`; `sub_job_not_found` when it has none (the
    job ended, or never joined)."""
    t = tenants.get(name)
    if t is None:
        raise WorkerError(
            "sub_job_not_found",
            f"this LoRA pool's {engine} holds no adapter {name!r} (its job ended or never joined)",
        )
    return t


# the weight-group commands (`engines/weight_transfer/member.py`, `deepspeed/weight_send.py`)
WEIGHT_GROUP_CMDS = ("weight_group_open", "weight_group_join", "send_weights", "weight_group_close")


def no_weight_group(engine: str) -> Command:
    """A pool engine's answer to the weight-group commands: refused by name. Its tenants sync by
    file or blob (`serving/lora_sync.py` says why); the servers never send them these."""

    def refuse(**_: Any) -> Any:
        raise WorkerError(
            "unsupported_option",
            f"a LoRA pool's {engine} is shared with other jobs: a pooled job syncs its adapter "
            "as a file or a blob (method shm or safetensors), not over a weight group",
            field="method",
        )

    return refuse
