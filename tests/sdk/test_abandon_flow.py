"""The abandon path of the sans-I/O core with scripted answers (`_core.abandon`): what an
abandoned call sends, in which order, within which bound, and what its exception says."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from arctic_sdk._core.abandon import CANCEL_BOUND_S
from arctic_sdk._core.calls import call_flow, prepare
from arctic_sdk._core.effects import HttpRequest, Send, Sleep
from arctic_sdk.spec.tables import methods as M

from .scripted import Clock, Responder, Run, caps_doc, make_state, resp, script

ERR503 = {"error": {"code": "unavailable", "message": "down"}}


def drive_until(
    flow: Any, respond: Responder, run: Run, clock: Clock, abandon: Callable[[Any], bool]
) -> BaseException:
    """Drive `flow`; at the first effect `abandon` picks, throw Ctrl-C into it instead of
    performing it (as the sync driver does), then drive the cleanup; the exception it raises."""
    value: Any = None
    thrown = False
    while True:
        try:
            if not thrown and run.effects and abandon(run.effects[-1]):
                thrown = True
                effect = flow.throw(KeyboardInterrupt())
            else:
                effect = flow.send(value)
        except StopIteration:
            raise AssertionError("the abandoned call returned") from None
        except KeyboardInterrupt as exc:
            return exc
        value = None
        run.effects.append(effect)
        if isinstance(effect, Send):
            run.requests.append(effect.request)
            if not thrown and abandon(effect):
                continue  # abandoned while this request was on the wire: no answer
            value = respond(effect.request)
        elif isinstance(effect, Sleep):
            clock.now += effect.seconds


def _is(path: str) -> Callable[[Any], bool]:
    def pick(effect: Any) -> bool:
        return isinstance(effect, Send) and effect.request.url.endswith(path)

    return pick


def _sleeping(effect: Any) -> bool:
    return isinstance(effect, Sleep)


def _abandon(respond: Responder, pick: Callable[[Any], bool], **caps: Any) -> tuple[Run, Any]:
    clock, run = Clock(), Run()
    state = make_state(clock)
    prep = prepare(state, M.STEP, {"learning_rate": 0.1}, None)
    exc = drive_until(
        call_flow(state, prep), script(resp(200, caps_doc(**caps)), *_as_list(respond)), run,
        clock, pick,
    )  # fmt: skip
    return run, exc


def _as_list(respond: Any) -> list[Any]:
    return list(respond) if isinstance(respond, tuple) else [respond]


def _notes(exc: BaseException) -> str:
    return "\n".join(getattr(exc, "__notes__", []))


def test_polled_request_is_cancelled_by_id() -> None:
    run, exc = _abandon(
        (
            resp(202, {"request_id": "r1", "job_id": "job-1"}),
            resp(200, {"request_id": "r1", "cancelled": True, "status": "cancelled"}),
        ),
        _sleeping,
    )
    assert isinstance(exc, KeyboardInterrupt)
    assert run.paths() == [
        "GET /capabilities",
        "POST /job-1/step",
        "POST /job-1/requests/r1:cancel",
    ]
    cancel = run.requests[-1]
    assert cancel.timeout is not None and cancel.timeout <= CANCEL_BOUND_S
    assert getattr(exc, "request_id", None) == "r1"
    assert "step abandoned; request r1 (job job-1) was cancelled on the server" in _notes(exc)


def test_held_submission_is_replayed_with_respond_async_then_cancelled() -> None:
    run, exc = _abandon(
        (
            resp(202, {"request_id": "r9", "job_id": "job-1"}),
            resp(200, {"request_id": "r9", "cancelled": True, "status": "cancelled"}),
        ),
        _is("/job-1/step"),
    )
    assert run.paths() == [
        "GET /capabilities",
        "POST /job-1/step",
        "POST /job-1/step",
        "POST /job-1/requests/r9:cancel",
    ]
    first, replay = run.requests[1], run.requests[2]
    assert "Prefer" not in first.headers and replay.headers["Prefer"] == "respond-async"
    # the same identity: a replay, never a second run
    assert replay.headers["Idempotency-Key"] == first.headers["Idempotency-Key"]
    assert replay.headers["X-Arctic-Seq"] == first.headers["X-Arctic-Seq"]
    assert json.loads(replay.body or b"") == json.loads(first.body or b"")
    assert getattr(exc, "request_id", None) == "r9"


def test_a_replay_that_finds_the_request_ended_sends_no_cancel() -> None:
    ended = {"request_id": "r9", "status": "completed", "result": {}, "events": []}
    run, exc = _abandon(resp(200, ended), _is("/job-1/step"))
    assert run.paths()[-1] == "POST /job-1/step"
    assert "had already ended (completed)" in _notes(exc)


def test_without_idempotency_nothing_is_replayed() -> None:
    run, exc = _abandon((), _is("/job-1/step"), idempotency=False)
    assert run.paths() == ["GET /capabilities", "POST /job-1/step"]
    assert "may still run" in _notes(exc) and not hasattr(exc, "request_id")


def test_a_refused_cancel_is_not_retried_and_says_how_to_cancel_later() -> None:
    run, exc = _abandon(
        (resp(202, {"request_id": "r1", "job_id": "job-1"}), resp(503, ERR503)), _sleeping
    )
    assert run.paths()[-1] == "POST /job-1/requests/r1:cancel"
    assert len([p for p in run.paths() if p.endswith(":cancel")]) == 1
    notes = _notes(exc)
    assert "could not be cancelled" in notes and "client.cancel_request" in notes, notes
    assert getattr(exc, "request_id", None) == "r1"


def test_a_server_without_the_route_gets_the_cancel_operation() -> None:
    routes = [m.name for m in M.METHODS if m is not M.CANCEL_REQUEST]
    op_done = {"request_id": "o1", "status": "completed", "result": {"cancelled": True}}
    run, exc = _abandon(
        (resp(202, {"request_id": "r1", "job_id": "job-1"}), resp(200, op_done)),
        _sleeping,
        routes=routes,
        operation_types=["cancel-request"],
    )
    assert run.paths()[-1] == "POST /job-1/operation"
    envelope = json.loads(run.requests[-1].body or b"")
    assert envelope["operation_type"] == "cancel-request"
    assert envelope["payload"] == {"request_id": "r1"}
    assert getattr(exc, "request_id", None) == "r1"


def test_abandoned_before_sending_sends_nothing_and_frees_its_sequence_number() -> None:
    clock, run = Clock(), Run()
    state = make_state(clock)
    prep = prepare(state, M.STEP, {}, None)
    exc = drive_until(
        call_flow(state, prep), script(resp(200, caps_doc())), run, clock, _is("/capabilities")
    )
    assert run.paths() == ["GET /capabilities"] and not _notes(exc)
    # the next call takes number 1 again: no gap the server would wait out
    nxt = prepare(state, M.STEP, {}, None)
    seen: list[HttpRequest] = []

    def answer(req: HttpRequest) -> Any:
        seen.append(req)
        if req.url.endswith("/capabilities"):
            return resp(200, caps_doc())
        return resp(200, {"request_id": "r2", "status": "completed", "result": {}})

    flow = call_flow(state, nxt)
    value: Any = None
    for _ in range(10):
        try:
            effect = flow.send(value)
        except StopIteration:
            break
        value = answer(effect.request) if isinstance(effect, Send) else None
    assert [r.headers.get("X-Arctic-Seq") for r in seen if r.url.endswith("/step")] == ["1"]


@pytest.mark.parametrize("pick", [_sleeping, _is("/job-1/step")], ids=["polled", "held"])
def test_a_second_ctrl_c_while_cancelling_leaves_at_once(pick: Callable[[Any], bool]) -> None:
    """The driver's rule, seen from the flow: an interrupt thrown into the cleanup goes out."""
    clock = Clock()
    state = make_state(clock)
    flow = call_flow(state, prepare(state, M.STEP, {}, None))
    respond = script(resp(200, caps_doc()), resp(202, {"request_id": "r1", "job_id": "job-1"}))
    value: Any = None
    thrown = 0
    with pytest.raises(KeyboardInterrupt):
        while True:
            effect = flow.throw(KeyboardInterrupt()) if thrown == 1 else flow.send(value)
            if thrown == 1:
                thrown = 2
                assert isinstance(effect, Send)  # the cleanup's first request
                flow.throw(KeyboardInterrupt())  # Ctrl-C again, while it is on the wire
                raise AssertionError("the second interrupt was swallowed")
            value = None
            if pick(effect) and not thrown:
                thrown = 1
                continue
            if isinstance(effect, Send):
                value = respond(effect.request)
