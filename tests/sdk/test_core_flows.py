"""The sans-I/O core with scripted answers: retries, polls, chunk groups, fallbacks, ordering."""

from __future__ import annotations

import json

import numpy as np
import pytest

import dssst1
from arctic_sdk import CallOptions
from arctic_sdk import errors as E
from arctic_sdk._core.effects import ConnectionFailure, HttpRequest, joined
from arctic_sdk._core.sequence import SeqAllocator
from arctic_sdk.spec.tables import methods as M

from .scripted import TOKEN, Clock, Run, call, caps_doc, done, drive, make_state, resp, script

BATCH = {"kwargs": {"input_ids": np.arange(8, dtype=np.int64).reshape(2, 4)}}
FAST = {"retry": {"initial_backoff": 0.1, "max_backoff": 1.0, "jitter": 0.0}}


def caps(**kw: object) -> object:
    return resp(200, caps_doc(**kw))


def test_step_inline_with_key_seq_and_auth_headers() -> None:
    clock, run = Clock(), Run()
    state = make_state(clock)
    out = call(
        state,
        M.STEP,
        {"learning_rate": 0.1},
        script(caps(), done({"metrics": {"grad_norm": 1.0}})),
        clock,
        run,
    )
    assert out == {"metrics": {"grad_norm": 1.0}}
    assert run.paths() == ["GET /capabilities", "POST /job-1/step"]
    h = run.requests[1].headers
    assert h["Authorization"] == f"Bearer {TOKEN}"
    assert h["X-Snowflake-Authorization-Token-Type"] == "PROGRAMMATIC_ACCESS_TOKEN"
    assert h["X-Arctic-Seq"] == "1" and len(h["Idempotency-Key"]) == 32
    assert json.loads(run.requests[1].body or b"") == {"learning_rate": 0.1}
    assert run.sleeps == []


def test_503_then_success_reuses_key_and_seq() -> None:
    clock, run = Clock(), Run()
    state = make_state(clock, config=FAST)
    out = call(
        state,
        M.STEP,
        {},
        script(
            caps(), resp(503, {"error": {"code": "unavailable", "message": "x"}}), done({"ok": 1})
        ),
        clock,
        run,
    )
    assert out == {"ok": 1}
    a, b = run.requests[1], run.requests[2]
    assert a.headers["Idempotency-Key"] == b.headers["Idempotency-Key"]
    assert a.headers["X-Arctic-Seq"] == b.headers["X-Arctic-Seq"] == "1"
    assert run.sleeps == [0.1]


def test_429_honours_retry_after() -> None:
    clock, run = Clock(), Run()
    state = make_state(clock, config=FAST)
    limited = resp(
        429, {"error": {"code": "rate_limited", "message": "slow"}}, {"retry-after": "7"}
    )
    call(state, M.STEP, {}, script(caps(), limited, done({})), clock, run)
    assert run.sleeps == [7.0]


def test_retry_after_past_the_deadline_raises_rate_limit() -> None:
    clock = Clock()
    state = make_state(clock, config=FAST)
    limited = resp(
        429, {"error": {"code": "rate_limited", "message": "slow"}}, {"retry-after": "99"}
    )
    with pytest.raises(E.RateLimitError) as info:
        call(state, M.STEP, {}, script(caps(), limited), clock, options=CallOptions(timeout=5))
    assert info.value.retry_after == 99.0


def test_retries_are_bounded_by_attempts() -> None:
    clock, run = Clock(), Run()
    state = make_state(clock, config=FAST, max_retries=2)
    err = resp(503, {"error": {"code": "unavailable", "message": "down"}})
    with pytest.raises(E.ServiceUnavailableError):
        call(state, M.STEP, {}, script(caps(), err, err, err), clock, run)
    assert len(run.requests) == 4 and run.sleeps == [0.1, 0.2]


def test_non_retryable_errors_raise_at_once() -> None:
    clock, run = Clock(), Run()
    state = make_state(clock, config=FAST)
    bad = resp(400, {"error": {"code": "invalid_argument", "message": "learning_rate: -1"}})
    with pytest.raises(E.BadRequestError, match="learning_rate"):
        call(state, M.STEP, {}, script(caps(), bad), clock, run)
    assert run.sleeps == []


@pytest.mark.parametrize("idempotent", [True, False])
def test_lost_answer_of_a_mutating_call(idempotent: bool) -> None:
    clock, run = Clock(), Run()
    state = make_state(clock, config=FAST)
    lost = ConnectionFailure(None, "connection reset after the body was sent")
    answers = [caps(idempotency=idempotent), lost]
    if idempotent:
        answers.append(done({"metrics": {}}))
        assert call(state, M.STEP, {}, script(*answers), clock, run) == {"metrics": {}}
    else:
        with pytest.raises(E.OutcomeUnknownError, match="may or may not have executed"):
            call(state, M.STEP, {}, script(*answers), clock, run)
        assert len(run.requests) == 2  # never resent


def test_never_delivered_is_retried_even_without_idempotency() -> None:
    clock = Clock()
    state = make_state(clock, config=FAST)
    refused = ConnectionFailure(False, "connection refused")
    out = call(state, M.STEP, {}, script(caps(idempotency=False), refused, done(1)), clock)
    assert out == 1


def test_connection_errors_exhausted_become_connection_error() -> None:
    clock = Clock()
    state = make_state(clock, config=FAST, max_retries=1)
    state.contact.reached = True  # the server answered before: the retry budget applies
    refused = ConnectionFailure(False, "connection refused")
    with pytest.raises(E.ArcticConnectionError, match="after 2 attempts"):
        call(state, M.GET_JOB, {}, script(refused, refused), clock)


def test_a_wrong_url_fails_in_seconds_naming_the_address(caplog: pytest.LogCaptureFixture) -> None:
    """Connection refused on first contact: first_contact_retries (2) retries, ~0.3 s of backoff
    here, not the 10 retries and ~60 s of an established connection's budget."""
    clock, run = Clock(), Run()
    state = make_state(clock, config=FAST)
    refused = ConnectionFailure(False, "connection error: [Errno 111] Connection refused")
    with (
        caplog.at_level("WARNING", logger="arctic_sdk"),
        pytest.raises(E.ArcticConnectionError) as err,
    ):
        call(state, M.STEP, {}, script(refused, refused, refused, refused), clock, run)
    assert "cannot reach the server at http://test ([Errno 111] Connection refused)" in str(
        err.value
    )
    assert err.value.details["address"] == "http://test" and err.value.details["attempts"] == 3
    assert len(run.requests) == 3 and run.sleeps == [0.1, 0.2]
    # each retry is logged at WARNING: what, after what, how long, how much deadline is left
    retries = [r for r in caplog.records if r.getMessage().startswith("retrying")]
    assert [r.levelname for r in retries] == ["WARNING", "WARNING"]
    assert "get-capabilities in 0.10 s after ArcticConnectionError" in retries[0].getMessage()
    assert "attempt 2 of 11" in retries[0].getMessage()
    assert "of the call's deadline left" in retries[0].getMessage()


def test_an_established_connection_keeps_its_retry_budget() -> None:
    """Once the server has answered, refused connections (a restart) get all max_retries."""
    clock, run = Clock(), Run()
    state = make_state(clock, config=FAST, max_retries=5)
    refused = ConnectionFailure(False, "connection refused")
    out = call(state, M.STEP, {}, script(caps(), *[refused] * 5, done({"ok": 1})), clock, run)
    assert out == {"ok": 1} and len(run.requests) == 7


def test_a_job_not_running_yet_is_waited_for_with_its_state_shown(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, run = Clock(), Run()
    state = make_state(clock, config=FAST)
    not_running = resp(
        409,
        {
            "error": {
                "code": "job_not_running",
                "message": "job job-1 is initializing",
                "details": {"state": "initializing"},
            }
        },
    )
    job = {"job": {"job_id": "job-1", "state": "initializing"}}
    running = {"job": {"job_id": "job-1", "state": "running"}}
    answers = script(caps(), not_running, resp(200, job), resp(200, running), done({"ok": 2}))
    with caplog.at_level("WARNING", logger="arctic_sdk"):
        assert call(state, M.STEP, {}, answers, clock, run) == {"ok": 2}
    assert run.paths() == [
        "GET /capabilities",
        "POST /job-1/step",
        "GET /job-1",
        "GET /job-1",
        "POST /job-1/step",
    ]
    assert any("job job-1 is initializing; waiting" in r.getMessage() for r in caplog.records)


def test_a_job_that_ends_while_waited_for_raises_job_terminal() -> None:
    clock = Clock()
    state = make_state(clock, config=FAST)
    not_running = resp(
        409, {"error": {"code": "job_not_running", "message": "x", "details": {"state": "pending"}}}
    )
    failed = {"job": {"job_id": "job-1", "state": "failed", "reason": "sub-job died"}}
    with pytest.raises(E.JobTerminalError, match="sub-job died"):
        call(state, M.STEP, {}, script(caps(), not_running, resp(200, failed)), clock)


def test_poll_backoff_cursor_draining_and_events() -> None:
    clock, run = Clock(), Run()
    state = make_state(clock)
    value = {"loss": 1.5, "outputs": {"logprobs_shifted": np.ones((2, 256), np.float32)}}
    frame = dssst1.dumps(value)
    chunks = dssst1.encode_chunks(frame, kind="result", max_bytes=600)
    events = [dssst1.result_chunk_event(c) for c in chunks]
    assert len(events) >= 4
    rid = "r7"

    def status(state_: str, evs: list[object], cursor: str) -> object:
        return resp(
            200, {"request_id": rid, "status": state_, "events": evs, "next_cursor": cursor}
        )

    answers = [caps(), resp(202, {"request_id": rid, "job_id": "job-1"})]
    answers += [status("pending", [], ""), status("running", [], ""), status("running", [], "")]
    answers += [status("completed", events[:2], "2"), status("completed", events[2:], "")]
    out = call(state, M.FORWARD_BACKWARD, BATCH, script(*answers), clock, run)
    np.testing.assert_array_equal(
        out["outputs"]["logprobs_shifted"], value["outputs"]["logprobs_shifted"]
    )
    assert run.sleeps == [0.5, 0.625, 0.78125, 0.9765625]  # no sleep while draining
    assert run.requests[-1].url.endswith(f"/requests/{rid}?cursor=2")


def test_poll_backoff_is_capped() -> None:
    clock, run = Clock(), Run()
    state = make_state(clock)
    pending = resp(200, {"request_id": "r", "status": "running"})
    answers = [caps(), resp(202, {"request_id": "r"})] + [pending] * 20 + [done({"x": 1}, "r")]
    call(state, M.STEP, {}, script(*answers), clock, run)
    assert max(run.sleeps) == 6.0 and run.sleeps[-1] == 6.0


def test_corrupt_result_event_is_detected() -> None:
    clock = Clock()
    state = make_state(clock)
    frame = dssst1.dumps({"x": np.zeros(3)})
    event = dssst1.result_chunk_event(dssst1.encode_chunks(frame, kind="result", max_bytes=4096)[0])
    event["payload_sha256"] = "0" * 64
    bad = resp(200, {"request_id": "r", "status": "completed", "events": [event]})
    with pytest.raises(E.ServerError, match="corrupt"):
        call(state, M.FORWARD_BACKWARD, BATCH, script(caps(), bad), clock)


def test_inline_envelope_result_and_deployed_status_synonyms() -> None:
    clock = Clock()
    state = make_state(clock)
    env = dssst1.inline_envelope(dssst1.dumps({"loss": np.float32(2.0)}))
    ok = resp(200, {"request_id": "r", "status": "REQUEST_STATE_SUCCEEDED", "result": env})
    assert call(state, M.FORWARD_BACKWARD, BATCH, script(caps(), ok), clock)["loss"] == 2.0


def test_failed_and_cancelled_requests() -> None:
    clock = Clock()
    state = make_state(clock)
    failed = resp(
        200,
        {
            "request_id": "r3",
            "status": "failed",
            "error": {"code": "sub_job_failed", "message": "engine died"},
        },
    )
    with pytest.raises(E.InternalServerError) as info:
        call(state, M.STEP, {}, script(caps(), failed), clock)
    assert isinstance(info.value, E.RequestFailedError) and info.value.request_id == "r3"
    cancelled = resp(200, {"request_id": "r4", "status": "canceled"})
    with pytest.raises(E.RequestCancelledError):
        call(state, M.STEP, {}, script(cancelled), clock)


def test_poll_deadline_raises_timeout_with_request_id() -> None:
    clock = Clock()
    state = make_state(clock)
    pending = resp(200, {"request_id": "r5", "status": "running"})
    with pytest.raises(E.ArcticTimeoutError) as info:
        call(
            state,
            M.STEP,
            {},
            script(caps(), *[pending] * 10),
            clock,
            options=CallOptions(timeout=2.0),
        )
    assert info.value.request_id == "r5" and isinstance(info.value, TimeoutError)


def _chunk_indices(run: Run) -> list[int]:
    out = []
    for r in run.requests:
        if r.url.endswith("/forward-backward"):
            out.append(dssst1.read_metadata(joined(r.body))["request_chunk"]["chunk_idx"])
    return out


def test_chunk_group_restart_replays_once_from_chunk_0() -> None:
    clock, run = Clock(), Run()
    state = make_state(clock)
    big = {"kwargs": {"input_ids": np.arange(4000, dtype=np.int64).reshape(4, 1000)}}
    cached = resp(200, {"chunk_cached": True})
    restart = resp(409, {"error": {"code": "chunk_group_restart_required", "message": "lost"}})
    answers = (
        [caps(limits={"max_chunk_bytes": 8192, "max_body_bytes": 8192}), cached, cached, restart]
        + [cached] * 3
        + [done({"loss": 1.0})]
    )
    assert call(state, M.FORWARD_BACKWARD, big, script(*answers), clock, run) == {"loss": 1.0}
    assert _chunk_indices(run) == [0, 1, 2, 0, 1, 2, 3]
    groups = {
        dssst1.read_metadata(joined(r.body))["request_chunk"]["chunk_group_id"]
        for r in run.requests
        if r.body
    }
    assert len(groups) == 1
    # a second restart is not replayed again
    run2 = Run()
    answers = [cached, restart, cached, restart]
    with pytest.raises(E.ChunkGroupRestartRequiredError):
        call(state, M.FORWARD_BACKWARD, big, script(*answers), clock, run2)
    assert _chunk_indices(run2) == [0, 1, 0, 1]


def test_lost_answer_of_the_last_chunk_resends_only_that_chunk() -> None:
    clock, run = Clock(), Run()
    state = make_state(clock, config=FAST)
    big = {"kwargs": {"input_ids": np.arange(2000, dtype=np.int64).reshape(2, 1000)}}
    cached = resp(200, {"chunk_cached": True})
    lost = ConnectionFailure(None, "reset after the server executed")
    answers = [caps(limits={"max_chunk_bytes": 8192}), cached, cached, lost, done({"loss": 2.0})]
    assert call(state, M.FORWARD_BACKWARD, big, script(*answers), clock, run) == {"loss": 2.0}
    assert _chunk_indices(run) == [0, 1, 2, 2]
    assert joined(run.requests[3].body) == joined(run.requests[4].body)  # identical chunk


def test_chunk_group_conflict_is_not_retried() -> None:
    clock = Clock()
    state = make_state(clock)
    conflict = resp(409, {"error": {"code": "chunk_group_conflict", "message": "other frame"}})
    with pytest.raises(E.ChunkGroupConflictError):
        call(state, M.FORWARD_BACKWARD, BATCH, script(caps(), conflict), clock)


def test_intermediate_chunks_are_resent_even_without_idempotency() -> None:
    clock, run = Clock(), Run()
    state = make_state(clock, config=FAST)
    big = {"kwargs": {"input_ids": np.arange(2000, dtype=np.int64).reshape(2, 1000)}}
    lost = ConnectionFailure(None, "reset")
    cached = resp(200, {"chunk_cached": True})
    answers = [
        caps(idempotency=False, limits={"max_chunk_bytes": 8192}),
        lost,
        cached,
        cached,
        lost,
    ]
    with pytest.raises(E.OutcomeUnknownError):  # the last chunk's answer is lost: not resent
        call(state, M.FORWARD_BACKWARD, big, script(*answers), clock, run)
    assert _chunk_indices(run) == [0, 0, 1, 2]


def test_bad_input_is_refused_before_anything_is_sent() -> None:
    clock, run = Clock(), Run()
    state = make_state(clock)
    nothing = script()
    cases = [
        (M.STEP, {"learning_rte": 0.1}, "unknown field"),
        (M.FORWARD_BACKWARD, {"kwargs": {"input_ids": np.zeros((2, 3), np.float32)}}, "dtype"),
        (
            M.FORWARD_BACKWARD,
            {
                "kwargs": {
                    "input_ids": np.zeros((2, 3), np.int64),
                    "attention_mask": np.ones((2, 4), np.int64),
                }
            },
            "dimension",
        ),
        (M.FORWARD_BACKWARD, {"context": {}}, "kwargs"),
        (M.GENERATE, {"prompts": ["a"], "sampling_params": {"n": "two"}}, "integer"),
        (
            M.FORWARD_BACKWARD,
            {"kwargs": {"input_ids": np.zeros((1, 1), np.int64)}, "x": object()},
            "unknown field",
        ),
    ]
    for method, body, needle in cases:
        with pytest.raises(E.InvalidArgumentError, match=needle):
            call(state, method, body, nothing, clock, run)
    state.job_id = None
    with pytest.raises(E.InvalidArgumentError, match="no job_id"):
        call(state, M.STEP, {}, nothing, clock, run)
    assert run.requests == []


def test_fallbacks_against_a_server_without_capabilities() -> None:
    clock, run = Clock(), Run()
    state = make_state(clock)
    no_route = resp(404, {"detail": "Not Found"})
    fwd = dssst1.inline_envelope(dssst1.dumps({"loss": 0.5}))
    out = call(state, M.FORWARD, BATCH, script(no_route, done({"result": fwd})), clock, run)
    assert out == {"loss": 0.5}
    op = json.loads(run.requests[1].body or b"")
    assert run.paths()[1] == "POST /job-1/operation"
    assert op["operation_type"] == "forward" and op["sub_job_type"] == "training"
    assert op["payload"]["wire_format"] == "DSSST1"
    assert "X-Arctic-Seq" not in run.requests[1].headers  # deployed: no sequencing
    # sleep/wake: answered locally
    assert call(state, M.SLEEP_INFERENCE, {}, script(), clock, run)["applied"] is False
    # sync-weights: weight-sync then reset-prefix-cache
    run2 = Run()
    call(
        state,
        M.SYNC_WEIGHTS,
        {},
        script(done({"result": {"weight_version": 3}}), done({})),
        clock,
        run2,
    )
    kinds = [json.loads(r.body or b"")["operation_type"] for r in run2.requests]
    assert kinds == ["weight-sync", "reset-prefix-cache"]
    with pytest.raises(E.UnimplementedError):
        call(state, M.LIST_CHECKPOINTS, {}, script(), clock)


def test_sequence_numbers_follow_submission_order_including_fallbacks() -> None:
    clock = Clock()
    state = make_state(clock)
    from arctic_sdk._core.calls import call_flow, prepare

    preps = [
        prepare(state, m, {}, None)
        for m in (M.STEP, M.SYNC_WEIGHTS, M.WAKE_INFERENCE, M.STEP, M.GET_JOB)
    ]
    # run the last-submitted mutating call first: numbers still follow submission order
    drive(
        call_flow(state, preps[3]),
        script(caps(routes=["step", "operation", "get-job"]), done({})),
        clock,
    )
    assert [p.slot.numbers if p.slot else None for p in preps] == [[1], [2, 3], [], [4], None]


def test_attached_clients_do_not_number_jobs_they_did_not_create() -> None:
    clock, run = Clock(), Run()
    state = make_state(clock, job_id="job-1")
    call(
        state, M.STEP, {}, script(caps(), done({})), clock, run, options=CallOptions(job_id="job-2")
    )
    assert "X-Arctic-Seq" not in run.requests[1].headers  # job-2 was not created here
    everywhere = make_state(clock, sequencing=True)
    run2 = Run()
    call(
        everywhere,
        M.STEP,
        {},
        script(caps(), done({})),
        clock,
        run2,
        options=CallOptions(job_id="job-2"),
    )
    assert run2.requests[1].headers["X-Arctic-Seq"] == "1"


def test_seq_allocator_is_per_job() -> None:
    alloc = SeqAllocator({"a": 5})
    s1, s2, s3 = alloc.reserve("a", M.STEP), alloc.reserve("b", M.STEP), alloc.reserve("a", M.STEP)
    alloc.resolve(lambda m: 1)
    assert (s1.numbers, s2.numbers, s3.numbers) == ([5], [1], [6])
    assert alloc.snapshot() == {"a": 7, "b": 2}


def test_get_request_and_download_and_control_plane_routes() -> None:
    clock, run = Clock(), Run()
    state = make_state(clock)
    call(state, M.GET_JOB, {}, script(resp(200, {"job": {"state": "running"}})), clock, run)
    call(
        state,
        M.LIST_JOBS,
        {"state": "running", "label": ["a=1", "b=2"]},
        script(resp(200, {"jobs": []})),
        clock,
        run,
    )
    raw = call(
        state,
        M.DOWNLOAD_CHECKPOINT_FILE,
        {"checkpoint_id": "c1", "filename": "m.bin"},
        script(caps(), resp(200, b"\x00\x01", {"content-type": "application/octet-stream"})),
        clock,
        run,
    )
    assert raw == b"\x00\x01"
    call(state, M.CANCEL_JOB, {"job_id": "job-9"}, script(resp(200, {"job": {}})), clock, run)
    assert run.paths() == [
        "GET /job-1",
        "GET /?state=running&label=a%3D1&label=b%3D2",
        "GET /capabilities",
        "GET /job-1/checkpoints/c1/files/m.bin",
        "POST /job-9:cancel",
    ]


def test_octet_results_are_requested_and_decoded() -> None:
    clock, run = Clock(), Run()
    state = make_state(clock)
    value = {"request_id": "r", "status": "completed", "result": {"x": np.arange(3)}}
    octet = resp(200, dssst1.dumps(value), {"content-type": "application/octet-stream"})
    out = call(
        state, M.FORWARD_BACKWARD, BATCH, script(caps(octet_results=True), octet), clock, run
    )
    np.testing.assert_array_equal(out["x"], np.arange(3))
    assert run.requests[1].headers["Accept"].startswith("application/octet-stream")


def test_upload_progress_effects_for_large_bodies() -> None:
    clock, run = Clock(), Run()
    state = make_state(clock)
    big = {"kwargs": {"input_ids": np.zeros((8, 600_000), np.int64)}}  # ~38 MiB
    call(
        state,
        M.FORWARD_BACKWARD,
        big,
        lambda req: caps_resp if req.url.endswith("/capabilities") else done({"loss": 0.0}),
        clock,
        run,
    )
    kinds = [(p.event, p.key.split(":")[0]) for p in run.progress]
    assert kinds[0] == ("start", "upload") and ("close", "upload") in kinds


caps_resp = resp(200, caps_doc())


def test_pat_is_never_in_requests_logs_or_errors(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    caplog.set_level(logging.DEBUG)
    clock = Clock()
    state = make_state(clock, config=FAST)
    echo = resp(401, {"error": {"code": "unauthenticated", "message": f"bad token {TOKEN}"}})
    with pytest.raises(E.AuthenticationError) as info:
        call(state, M.STEP, {}, script(caps(), echo), clock)
    assert TOKEN not in str(info.value) + repr(info.value.body)
    assert TOKEN not in repr(state.config) and TOKEN not in caplog.text
    assert TOKEN not in str(state.config.model_dump())


def test_http_request_repr_does_not_matter_but_headers_are_not_logged() -> None:
    req = HttpRequest("GET", "http://x", {"Authorization": "Bearer s"}, None, M.GET_JOB)
    assert req.method == "GET"
