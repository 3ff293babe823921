"""A request that failed `not_executed` (it never reached its worker: the server restarted in
between) is resubmitted under the same identity, at most `calls.RESUBMITS` times; any other
failure is raised as before (issue 14 §5)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import dssst1
from arctic_sdk import errors as E
from arctic_sdk._core import calls
from arctic_sdk._core.effects import joined
from arctic_sdk.spec.tables import methods as M

from .scripted import Clock, Run, call, caps_doc, done, make_state, resp, script

FAST = {"retry": {"initial_backoff": 0.1, "max_backoff": 1.0, "jitter": 0.0}}
NOT_EXECUTED = {"code": "not_executed", "message": "the gateway restarted before its worker got it",
                "details": {}}  # fmt: skip


def failed(error: dict[str, object], request_id: str = "r1") -> object:
    body = {"request_id": request_id, "status": "failed", "error": error, "events": [],
            "next_cursor": ""}  # fmt: skip
    return resp(200, body)


def test_a_keyed_call_is_resubmitted_under_its_key() -> None:
    clock, run = Clock(), Run()
    state = make_state(clock, config=FAST)
    answers = script(resp(200, caps_doc()), failed(NOT_EXECUTED), done({"ok": 1}, "r2"))
    assert call(state, M.STEP, {}, answers, clock, run) == {"ok": 1}
    first, again = run.requests[1], run.requests[2]
    assert run.paths()[1:] == ["POST /job-1/step", "POST /job-1/step"]
    assert first.headers["Idempotency-Key"] == again.headers["Idempotency-Key"]
    assert first.headers["X-Arctic-Seq"] == again.headers["X-Arctic-Seq"]
    assert json.loads(again.body or b"") == {}


def test_a_chunk_group_is_resubmitted_under_its_group_id() -> None:
    clock, run = Clock(), Run()
    state = make_state(clock, config=FAST)
    batch = {"kwargs": {"input_ids": np.arange(8, dtype=np.int64).reshape(2, 4)}}
    answers = script(resp(200, caps_doc()), failed(NOT_EXECUTED), done({"metrics": {}}, "r2"))
    call(state, M.FORWARD_BACKWARD, batch, answers, clock, run)
    groups = [
        dssst1.read_metadata(joined(r.body or b""))["request_chunk"]["chunk_group_id"]
        for r in run.requests[1:]
    ]
    assert len(groups) == 2 and groups[0] == groups[1]


def test_resubmissions_are_bounded_and_other_failures_raise() -> None:
    clock = Clock()
    state = make_state(clock, config=FAST)
    answers = [resp(200, caps_doc())] + [failed(NOT_EXECUTED)] * (calls.RESUBMITS + 1)
    with pytest.raises(E.ArcticError) as info:
        call(state, M.STEP, {}, script(*answers), clock)
    assert info.value.code == "not_executed"
    internal = {"code": "internal", "message": "boom", "details": {}}
    with pytest.raises(E.ArcticError) as info:
        call(state, M.STEP, {}, script(failed(internal)), clock)  # caps already known
    assert info.value.code == "internal"
