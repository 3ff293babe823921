"""Named crash points for crash-recovery tests (the gateway's kill -9 matrix).

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


def arm(spec: str) -> None:
    """Arm points in-process (tests); `""` disarms all."""
    _ARMED.clear()
    _ARMED.update(_parse(spec))
    _COUNTS.clear()
