"""Where faults enter a server: named crash points, and the protocol core's declared hooks.

Crash points serve the crash-recovery tests (the gateway's kill -9 matrix); the hooks
(`CoreHooks`) serve the fake gateway's behaviour faults (`conformance/fake/behaviour.py`), which
change one step of the request path through them instead of replacing the core's methods.

## Crash points

`hit(name)` is a no-op unless the environment variable `ARCTIC_CRASH_AT` names that point:
`ARCTIC_CRASH_AT=name:N` ends the process with `os._exit(137)` (what a kill -9 looks like to
the clients and the disk) at the N-th time the point is reached (N defaults to 1). Several
points may be given, comma-separated. Points reached by the protocol layer:

- `chunk_accepted`: a chunk frame passed the codec checks, before the chunk store is written;
- `request_recorded`: a data-plane request was recorded, before it is acknowledged;
- `request_started`: a request was recorded as running, before the servicer is called;
- `request_executed`: the servicer returned a result, before it is stored.

Servers add their own (the gateway: `job_recorded`; `worker_dispatched`, a command sent to a
worker and not yet answered).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from arctic_sdk.spec.model import MethodInfo

    from ..rules.errors import ProtocolError
    from ..rules.jobs import JobRecord
    from .calls import IncomingCall
    from .chunk_groups import ChunkGroups, ChunkStep
    from .context import CallContext
    from .sequencer import Sequencer

ENV = "ARCTIC_CRASH_AT"


def _parse(spec: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        name, _, n = part.partition(":")
        out[name] = int(n) if n else 1
    return out


_ARMED: dict[str, int] = _parse(os.environ.get(ENV, ""))
_COUNTS: dict[str, int] = {}


def hit(name: str) -> None:
    """Crash here if this point is armed and this is its N-th hit."""
    if not _ARMED or name not in _ARMED:
        return
    _COUNTS[name] = _COUNTS.get(name, 0) + 1
    if _COUNTS[name] >= _ARMED[name]:
        sys.stderr.write(f"{ENV}: crashing at {name} (hit {_COUNTS[name]})\n")
        sys.stderr.flush()
        os._exit(137)


# ---------------------------------------------------------------------- the core's hooks


@dataclass
class CoreHooks:
    """Optional callables the protocol core calls at fixed points of a call's path; each is None
    by default (the core then does what the spec says, at the cost of one `is None` test).

    Install them with `ProtocolCore(..., hooks=CoreHooks(...))` or by setting `core.hooks`. A
    "refused" hook gets the refusal (a `ProtocolError`): it raises to refuse (the refusal or
    another error), and returning serves the call as if nothing was wrong.
    """

    # Auth refused the call's token (`handle`, first step of every call): return the token to
    # serve it as (None: none).
    auth_refused: Callable[[IncomingCall, ProtocolError], str | None] | None = None
    # A body failed its request message's checks (`validate_body`; every op, also polls).
    body_refused: Callable[[MethodInfo, Any, ProtocolError], None] | None = None
    # A job-scoped op on a job that is not running, or has ended (`JobControl.require_running`).
    job_refused: Callable[[JobRecord[Any], MethodInfo, ProtocolError], None] | None = None
    # A DSSST1 or gRPC frame reaches the chunk groups: called instead of `groups.accept(job_id,
    # method, frame)` (which it calls itself), so it may change the limits or the step.
    chunk_accept: Callable[[ChunkGroups, str, MethodInfo, bytes | memoryview], ChunkStep] | None = (
        None
    )
    # A data-plane request is about to be recorded under its identity kind ("key": the
    # Idempotency-Key, "group": its chunk group, "": none) and identity: return the pair to
    # record it under (("", "") records it with none, so a retry runs again).
    identity: Callable[[MethodInfo, str, str], tuple[str, str]] | None = None
    # The per-job sequencer (X-Arctic-Seq order) is about to be used: return the one to use.
    sequencer: Callable[[Sequencer], Sequencer] | None = None
    # The servicer is about to run an op: return the body it gets.
    request_body: Callable[[MethodInfo, CallContext, Any], Any] | None = None
    # The servicer returned `result` for an op with `body`: return the result to record.
    result: Callable[[MethodInfo, CallContext, Any, Any], Any] | None = None
    # A GetRequest poll, before it is answered: return the call to answer.
    poll: Callable[[IncomingCall], IncomingCall] | None = None
