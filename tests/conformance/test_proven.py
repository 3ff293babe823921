"""Proven both ways: the whole suite passes against the fake gateway over HTTP and gRPC, and each
seeded fault of conformance/faults.yaml, switched on in the fake, makes exactly the cases the
table lists fail — over both transports, over the whole suite.

Two cases wait on server timers (a lease expiring, a sequence gap timing out); to keep the sweep
short they run only for the faults in FULL_RUN and for faults whose table entry lists them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped,unused-ignore]

from conformance.fake import BackgroundFake
from conformance.fake.behaviour import FAULTS
from conformance.runner import Case

from .conftest import run, set_behaviour

TABLE_PATH = Path(__file__).resolve().parents[2] / "conformance" / "faults.yaml"
TABLE: dict[str, dict[str, Any]] = yaml.safe_load(TABLE_PATH.read_text())["faults"]
SLOW = ("jobs/lease/expires", "sequencing/gap-timeout")
FULL_RUN = {
    "replay_executes_twice",
    "sequence_ignored",
    "no_auth_on_data_plane",
    "unknown_fields_ignored",
    "terminal_job_serves",
}


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_every_case_passes(fake: BackgroundFake, cases: list[Case], transport: str) -> None:
    report = run(fake, transport, cases)
    problems = [
        f"{r.case.id}: {r.outcome}: {r.difference}\n{r.detail}"
        for r in report.results
        if r.outcome not in ("pass", "skip")
    ]
    assert not problems, "\n".join(problems)
    assert report.exit_code() == 0
    assert not report.cleanup_problems
    ran = {r.case.id for r in report.ran}
    assert len(ran) >= 300
    # what is skipped is skipped for a reason the fake cannot change: another transport, a
    # limit the vector was built for, a route the fake serves (it serves all of them), or a
    # server without LoRA jobs or without merge-and-push (the fake has them)
    for r in report.results:
        if r.outcome == "skip":
            assert r.difference.startswith(
                (
                    "not run over",
                    "needs limit:",
                    "needs unlisted_route",
                    "needs lora:none",
                    "needs lora:no_sampler_embeddings",
                )
            ), r


def expected(fault: str, transport: str, cases: list[Case]) -> set[str]:
    entry = TABLE[fault]
    if transport not in entry.get("transports", ["http", "grpc"]):
        return set()
    applies = {c.id for c in cases if transport in c.transports}
    return set(entry["fails"]) & applies


@pytest.mark.parametrize("transport", ["http", "grpc"])
@pytest.mark.parametrize("fault", sorted(TABLE))
def test_fault_fails_exactly_its_cases(
    fake: BackgroundFake, cases: list[Case], fault: str, transport: str
) -> None:
    slow = () if fault in FULL_RUN else [s for s in SLOW if s not in TABLE[fault]["fails"]]
    selected = [c for c in cases if c.id not in slow]
    set_behaviour(fake, {fault: True})
    try:
        report = run(fake, transport, selected)
    finally:
        set_behaviour(fake, {fault: None})
    failed = report.failed_ids()
    want = expected(fault, transport, selected)
    missed = sorted(want - failed)
    extra = {r.case.id: r.difference for r in report.results if r.case.id in failed - want}
    assert not missed and not extra, (
        f"{fault} over {transport}: listed but passed {missed}; failed but not listed {extra}"
    )
    if want:
        assert report.exit_code() == 1


def test_table_is_well_formed(cases: list[Case]) -> None:
    ids = {c.id for c in cases}
    assert len(TABLE) >= 10
    assert set(TABLE) == set(FAULTS), "faults.yaml and conformance/fake/behaviour.py disagree"
    for fault, entry in TABLE.items():
        assert entry.get("description"), fault
        assert entry["fails"], f"{fault} lists no case: a fault the suite cannot see"
        assert sorted(entry["fails"]) == entry["fails"], f"{fault}: keep the list sorted"
        unknown = set(entry["fails"]) - ids
        assert not unknown, f"{fault} lists cases that do not exist: {sorted(unknown)}"
        assert set(entry.get("transports", ["http", "grpc"])) <= {"http", "grpc"}
    distinct = {frozenset(e["fails"]) for e in TABLE.values()}
    assert len(distinct) == len(TABLE), "two faults fail the same cases: they are not distinct"
