"""The state machines of the servers, each one table of allowed moves (h11's `_state.py` is the
model).

- `JOB`: a job's `state` (jobs.proto `JobState`): `pending → placing → initializing → running`,
  and from any of them to a terminal `cancelled`, `terminated` or `failed`.
- `SUB_JOB`: a sub-job's `state` (the same enum): as a job, and `pending → initializing` (the
  on-prem server has no placing step for its workers).
- `REQUEST`: a data-plane request's `status` (jobs.proto `RequestState`): `pending → running`,
  `running → streaming` (in the spec; no server streams partial results yet), and from pending,
  running or streaming to a terminal `completed`, `failed` or `cancelled`.
- `WORKER_HOST`, `WORKER_CALL`: the gateway's worker process (`loading → ready`, either to
  `failed`) and one command in its journal (`queued → running → done`, `queued → done` when it is
  cancelled before it runs): internal, on the gateway ↔ worker wire only.

Every state change in the servers goes through a machine's `check` (or `move`), which raises
`IllegalMove` (an `internal` error: a server bug) on a move its table does not have. The job and
request tables' state names are the proto enums' values (`tests/protocol/test_states.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from .errors import ProtocolError

_ENDS_JOB = frozenset({"cancelled", "terminated", "failed"})
_ENDS_REQUEST = frozenset({"completed", "failed", "cancelled"})


class IllegalMove(ProtocolError):
    """A move its state machine's table does not allow: a server bug, never the client's."""

    def __init__(self, machine: str, current: str, to: str, allowed: frozenset[str]) -> None:
        super().__init__(
            "internal",
            f"{machine} state machine: no move from {current!r} to {to!r} (allowed from "
            f"{current!r}: {sorted(allowed)})",
            machine=machine,
            state=current,
            to=to,
        )


class HasState(Protocol):
    state: str


class HasStatus(Protocol):
    status: str


@dataclass(frozen=True)
class Machine:
    """One state machine: its start states and, per state, the states it may move to."""

    name: str
    starts: frozenset[str]
    edges: Mapping[str, frozenset[str]]

    @property
    def states(self) -> tuple[str, ...]:
        return tuple(self.edges)

    @property
    def terminal(self) -> frozenset[str]:
        """The states with no move out."""
        return frozenset(s for s, out in self.edges.items() if not out)

    def allows(self, current: str, to: str) -> bool:
        return to in self.edges.get(current, frozenset())

    def start(self, state: str) -> str:
        """A record's first state (one of `starts`)."""
        if state not in self.starts:
            raise IllegalMove(self.name, "(new)", state, self.starts)
        return state

    def check(self, current: str, to: str) -> str:
        """`to`, if the table has the move `current → to`; else `IllegalMove`."""
        if not self.allows(current, to):
            raise IllegalMove(self.name, current, to, self.edges.get(current, frozenset()))
        return to

    def move(self, record: HasState, to: str) -> None:
        """Move `record.state` to `to` (checked)."""
        record.state = self.check(record.state, to)


JOB = Machine(
    "job",
    starts=frozenset({"pending"}),
    edges={
        "pending": frozenset({"placing"}) | _ENDS_JOB,
        "placing": frozenset({"initializing"}) | _ENDS_JOB,
        "initializing": frozenset({"running"}) | _ENDS_JOB,
        "running": _ENDS_JOB,
        "cancelled": frozenset(),
        "terminated": frozenset(),
        "failed": frozenset(),
    },
)

SUB_JOB = Machine(
    "sub-job",
    starts=frozenset({"pending"}),
    edges={
        "pending": frozenset({"placing", "initializing"}) | _ENDS_JOB,
        "placing": frozenset({"initializing"}) | _ENDS_JOB,
        "initializing": frozenset({"running"}) | _ENDS_JOB,
        "running": _ENDS_JOB,
        "cancelled": frozenset(),
        "terminated": frozenset(),
        "failed": frozenset(),
    },
)

REQUEST = Machine(
    "request",
    # `completed`: a keyed control-plane call's answer, recorded once it ran (its replay)
    starts=frozenset({"pending", "completed"}),
    edges={
        "pending": frozenset({"running"}) | _ENDS_REQUEST,
        "running": frozenset({"streaming"}) | _ENDS_REQUEST,
        "streaming": _ENDS_REQUEST,
        "completed": frozenset(),
        "failed": frozenset(),
        "cancelled": frozenset(),
    },
)

WORKER_HOST = Machine(
    "worker host",
    starts=frozenset({"loading"}),
    edges={
        "loading": frozenset({"ready", "failed"}),
        "ready": frozenset({"failed"}),  # a rank of its trainer was lost
        "failed": frozenset(),
    },
)

WORKER_CALL = Machine(
    "worker call",
    starts=frozenset({"queued"}),
    edges={
        "queued": frozenset({"running", "done"}),  # done: cancelled before it ran
        "running": frozenset({"done"}),
        "done": frozenset(),
    },
)

MACHINES = (JOB, SUB_JOB, REQUEST, WORKER_HOST, WORKER_CALL)


def move_request(rec: HasStatus, to: str) -> None:
    """Move a request's `status` to `to` (checked against `REQUEST`)."""
    rec.status = REQUEST.check(rec.status, to)


class HasStateReason(HasState, Protocol):
    reason: str


def move_sub_job(sub: HasStateReason, to: str, reason: str | None = None) -> None:
    """Move a sub-job to `to` (checked against `SUB_JOB`); `reason` replaces its reason."""
    SUB_JOB.move(sub, to)
    if reason is not None:
        sub.reason = reason
