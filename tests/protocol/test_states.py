"""The state machines' tables (`rules/states.py`): every allowed move moves, every other move
is refused with `IllegalMove`, and the state names are the proto enums' values."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from arctic_sdk.spec.pb.arctic.v1 import jobs_pb2
from arctic_servers.engines.fake.state import Job
from arctic_servers.protocol.stores import TERMINAL, RequestRecord
from arctic_servers.rules import jobs as pj
from arctic_servers.rules import states
from arctic_servers.rules.states import (
    JOB,
    MACHINES,
    REQUEST,
    SUB_JOB,
    IllegalMove,
    Machine,
    move_request,
    move_sub_job,
)


@dataclass
class _Rec:
    state: str
    reason: str = ""


def _enum_values(enum: object, prefix: str) -> set[str]:
    names = enum.keys()  # type: ignore[attr-defined]
    return {n.removeprefix(prefix).lower() for n in names if not n.endswith("_UNSPECIFIED")}


def test_job_and_sub_job_states_are_the_proto_enum() -> None:
    assert set(JOB.states) == _enum_values(jobs_pb2.JobState, "JOB_STATE_")
    assert set(SUB_JOB.states) == _enum_values(jobs_pb2.JobState, "JOB_STATE_")
    # the ListJobs filter names, in the order its refusal lists them
    assert (
        JOB.states
        == pj.STATES
        == ("pending", "placing", "initializing", "running", "cancelled", "terminated", "failed")
    )


def test_request_states_are_the_proto_enum() -> None:
    assert set(REQUEST.states) == _enum_values(jobs_pb2.RequestState, "REQUEST_STATE_")
    assert TERMINAL == REQUEST.terminal == {"completed", "failed", "cancelled"}


def test_terminal_states() -> None:
    assert JOB.terminal == SUB_JOB.terminal == {"cancelled", "terminated", "failed"}
    assert JOB.terminal == pj.TERMINAL


@pytest.mark.parametrize("machine", MACHINES, ids=lambda m: m.name)
def test_tables_are_closed(machine: Machine) -> None:
    """Every target and start is a state of the machine; every state is reachable."""
    reach = set(machine.starts)
    for src, out in machine.edges.items():
        assert out <= set(machine.states), (src, out)
        reach |= out
    assert machine.starts <= set(machine.states)
    assert reach == set(machine.states)


def _edges(machine: Machine) -> list[tuple[str, str]]:
    return [(a, b) for a, out in machine.edges.items() for b in sorted(out)]


def _non_edges(machine: Machine) -> list[tuple[str, str]]:
    return [(a, b) for a in machine.states for b in machine.states if b not in machine.edges[a]]


@pytest.mark.parametrize(
    ("machine", "a", "b"),
    [(m, a, b) for m in MACHINES for a, b in _edges(m)],
    ids=lambda v: v.name if isinstance(v, Machine) else v,
)
def test_every_allowed_move_moves(machine: Machine, a: str, b: str) -> None:
    rec = _Rec(a)
    machine.move(rec, b)
    assert rec.state == b


@pytest.mark.parametrize(
    ("machine", "a", "b"),
    [(m, a, b) for m in MACHINES for a, b in _non_edges(m)],
    ids=lambda v: v.name if isinstance(v, Machine) else v,
)
def test_every_other_move_is_refused(machine: Machine, a: str, b: str) -> None:
    rec = _Rec(a)
    with pytest.raises(IllegalMove) as info:
        machine.move(rec, b)
    assert rec.state == a  # unchanged
    assert info.value.code == "internal"
    assert info.value.details == {"machine": machine.name, "state": a, "to": b}


def test_the_expected_edges() -> None:
    """The tables as the servers use them (a change here is a change of the protocol)."""
    ends = {"cancelled", "terminated", "failed"}
    assert JOB.edges["pending"] == {"placing"} | ends
    assert JOB.edges["placing"] == {"initializing"} | ends
    assert JOB.edges["initializing"] == {"running"} | ends
    assert JOB.edges["running"] == ends
    assert SUB_JOB.edges["pending"] == {"placing", "initializing"} | ends  # on-prem: no placing
    assert REQUEST.edges["pending"] == {"running", "completed", "failed", "cancelled"}
    assert REQUEST.edges["running"] == {"streaming", "completed", "failed", "cancelled"}
    assert states.WORKER_HOST.edges["loading"] == {"ready", "failed"}
    assert states.WORKER_CALL.edges["queued"] == {"running", "done"}


def test_start_states() -> None:
    assert JOB.start("pending") == "pending"
    with pytest.raises(IllegalMove):
        JOB.start("running")
    assert REQUEST.start("completed") == "completed"  # a keyed control-plane answer
    with pytest.raises(IllegalMove):
        REQUEST.start("running")


def test_request_record_moves() -> None:
    rec = RequestRecord(job_id="j", request_id="r", op="Forward")
    move_request(rec, "running")
    move_request(rec, "completed")
    assert rec.terminal
    with pytest.raises(IllegalMove, match="no move from 'completed' to 'running'"):
        move_request(rec, "running")
    assert rec.status == "completed"


def test_job_record_enter_is_checked() -> None:
    job = Job("job-1", None, [], {}, "", "", 0)
    job.enter("pending")  # the first entry starts it
    job.enter("placing")
    with pytest.raises(IllegalMove):
        job.enter("pending")
    job.enter("cancelled", "cancelled by CancelJob")
    with pytest.raises(IllegalMove):
        job.enter("running")
    assert job.state == "cancelled"
    assert [h["state"] for h in job.history] == ["pending", "placing", "cancelled"]


def test_end_sub_jobs_through_the_table() -> None:
    subs = [_Rec("running"), _Rec("failed", "died"), _Rec("pending")]
    pj.end_sub_jobs(subs, "failed", "sub-job x failed")
    assert [(s.state, s.reason) for s in subs] == [
        ("terminated", "sub-job x failed"),
        ("failed", "died"),
        ("terminated", "sub-job x failed"),
    ]
    sub = _Rec("cancelled")
    with pytest.raises(IllegalMove):
        move_sub_job(sub, "running", "")
