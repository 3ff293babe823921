"""Chunk groups, idempotency, sequencing, result delivery, polls and cancellation over HTTP."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import numpy as np
import pytest

import dssst1
from arctic_sdk.spec.tables import methods as M
from arctic_servers.protocol.config import ProtocolLimits
from conformance.fake import start_fake

from .raw import OCTET, TOKEN, Http, batch, chunks_of


def big_body(rows: int = 8, cols: int = 64) -> dict[str, Any]:
    ids = (np.arange(rows * cols, dtype=np.int64).reshape(rows, cols) % 250) + 3
    return {"kwargs": {"input_ids": ids}, "processing": {"post": ["compute_logprobs"]}}


async def fb_count(http: Http, job: str) -> int:
    log = (await http.state(job))["execution_log"]
    return sum(1 for e in log if e["op"] == "forward-backward")


async def test_chunk_group_replay_executes_once(http: Http, job: str) -> None:
    group = str(uuid.uuid4())
    chunks = chunks_of(M.FORWARD_BACKWARD, big_body(), max_bytes=1024, group=group)
    assert len(chunks) > 3
    answers = [await http.post_chunk(M.FORWARD_BACKWARD, job, c) for c in chunks]
    for i, a in enumerate(answers[:-1]):
        assert a.data == {
            "chunk_cached": True,
            "chunk_group_id": group,
            "chunk_idx": i,
            "chunks_received": i + 1,
            "total_chunks": len(chunks),
        }
    final = answers[-1]
    assert final.status == 200 and final.data["status"] == "completed"
    rid = final.data["request_id"]
    assert final.headers["X-Arctic-Request-Id"] == rid
    replay = [await http.post_chunk(M.FORWARD_BACKWARD, job, c) for c in chunks]
    assert all(r.data["request_id"] == rid for r in replay)
    assert replay[-1].data["result"] == final.data["result"]
    assert await fb_count(http, job) == 1
    # an identical resent chunk of an open group is accepted; a different one conflicts
    g2 = str(uuid.uuid4())
    c2 = chunks_of(M.FORWARD_BACKWARD, big_body(), max_bytes=1024, group=g2)
    assert (await http.post_chunk(M.FORWARD_BACKWARD, job, c2[0])).data["chunk_cached"]
    assert (await http.post_chunk(M.FORWARD_BACKWARD, job, c2[0])).data["chunk_cached"]
    other = chunks_of(M.FORWARD_BACKWARD, big_body(rows=9), max_bytes=1024, group=g2)
    resp = await http.post_chunk(M.FORWARD_BACKWARD, job, other[1])
    assert (resp.status, resp.code) == (409, "chunk_group_conflict")
    conflict = chunks_of(M.FORWARD_BACKWARD, big_body(rows=9), max_bytes=1024, group=group)
    resp = await http.post_chunk(M.FORWARD_BACKWARD, job, conflict[0])
    assert (resp.status, resp.code) == (409, "chunk_group_conflict")


async def test_unknown_group_needs_a_restart(http: Http, job: str) -> None:
    chunks = chunks_of(M.FORWARD_BACKWARD, big_body(), max_bytes=1024)
    resp = await http.post_chunk(M.FORWARD_BACKWARD, job, chunks[2])
    assert (resp.status, resp.code) == (409, "chunk_group_restart_required")
    assert resp.error["details"]["expected_start_chunk"] == 0
    wrong_op = chunks_of(M.GENERATE, big_body(), max_bytes=1 << 20)
    resp = await http.post_chunk(M.FORWARD_BACKWARD, job, wrong_op[0])
    assert resp.code == "invalid_argument"
    assert resp.error["details"]["field"] == "op.request_chunk.operation"
    result_chunk = dssst1.encode_chunks(dssst1.dumps({"a": 1}), kind="result", max_bytes=1 << 20)
    resp = await http.post_chunk(M.FORWARD_BACKWARD, job, result_chunk[0])
    assert resp.code == "chunk_kind_mismatch"


async def test_keyed_step_retry_executes_once(http: Http, job: str) -> None:
    key = {"Idempotency-Key": str(uuid.uuid4())}
    first = await http.call(M.STEP, {"learning_rate": 0.1}, job_id=job, headers=key)
    again = await http.call(M.STEP, {"learning_rate": 0.1}, job_id=job, headers=key)
    assert first.data["request_id"] == again.data["request_id"]
    assert first.data["result"] == again.data["result"]
    assert (await http.state(job))["applied_steps"] == 1
    clash = await http.call(M.STEP, {"learning_rate": 0.2}, job_id=job, headers=key)
    assert (clash.status, clash.code) == (409, "idempotency_key_conflict")
    await http.call(M.STEP, {}, job_id=job)
    await http.call(M.STEP, {}, job_id=job)  # no key: a second execution
    assert (await http.state(job))["applied_steps"] == 3


async def test_out_of_order_sequence_numbers_execute_in_order(http: Http, job: str) -> None:
    ids, _ = batch([[1, 2, 3]])

    async def send(seq: int) -> Any:
        h = {"X-Arctic-Seq": str(seq), "Idempotency-Key": f"k{seq}"}
        if seq % 2:
            return await http.call(M.STEP, {}, job_id=job, headers=h)
        return await http.dss(
            M.FORWARD_BACKWARD,
            job,
            {"kwargs": {"input_ids": ids}},
            headers={"X-Arctic-Seq": str(seq)},
        )

    tasks = []
    for seq in (4, 3, 2, 1):  # arrival order: 4, 3, 2, 1
        tasks.append(asyncio.create_task(send(seq)))
        await asyncio.sleep(0.03)
    answers = await asyncio.gather(*tasks)
    assert all(a.status == 200 and a.data["status"] == "completed" for a in answers)
    log = (await http.state(job))["execution_log"]
    assert [e["seq"] for e in log] == [1, 2, 3, 4]
    assert [e["op"] for e in log] == ["step", "forward-backward", "step", "forward-backward"]
    dup = await http.call(
        M.STEP, {}, job_id=job, headers={"X-Arctic-Seq": "1", "Idempotency-Key": "other"}
    )
    assert (dup.status, dup.code) == (409, "sequence_conflict")
    retry = await http.call(
        M.STEP, {}, job_id=job, headers={"X-Arctic-Seq": "1", "Idempotency-Key": "k1"}
    )
    assert retry.data["request_id"] == answers[3].data["request_id"]


@pytest.fixture
async def tiny() -> AsyncIterator[Http]:
    limits = ProtocolLimits(
        max_inline_result_bytes=256,
        result_chunk_bytes=600,
        default_max_events=2,
        sequence_gap_timeout_seconds=0.2,
    )
    f = await start_fake(token=TOKEN, admin=True, limits=limits)
    async with aiohttp.ClientSession() as s:
        yield Http(s, f)
    await f.close()


async def test_result_chunk_events_drain_with_a_cursor(tiny: Http) -> None:
    http = tiny
    job = await http.create_job()
    resp = await http.dss(M.FORWARD_BACKWARD, job, big_body())
    assert resp.status == 200 and "result" not in resp.data
    assert len(resp.data["events"]) == 2 and resp.data["next_cursor"] == "2"
    polls, cursor, events = 0, resp.data["next_cursor"], list(resp.data["events"])
    while cursor:
        page = await http.poll(job, resp.data["request_id"], cursor=cursor)
        events += page.data["events"]
        cursor = page.data["next_cursor"]
        polls += 1
    assert polls >= 2 and all(e["type"] == "result_chunk" for e in events)
    value = dssst1.loads(dssst1.assemble_result_events(events))
    assert value["outputs"]["logprobs_shifted"].shape == (8, 64)
    again = await http.poll(job, resp.data["request_id"], cursor="0", max_events="100")
    assert len(again.data["events"]) == len(events) and again.data["next_cursor"] == ""
    bad = await http.poll(job, resp.data["request_id"], cursor="-3")
    assert bad.code == "invalid_argument" and bad.error["details"]["field"] == "cursor"
    gap = await http.call(M.STEP, {}, job_id=job, headers={"X-Arctic-Seq": "5"})
    assert gap.data["status"] == "failed" and gap.data["error"]["code"] == "sequence_gap_timeout"


async def test_octet_results(http: Http, job: str) -> None:
    resp = await http.dss(
        M.FORWARD_BACKWARD, job, big_body(rows=2, cols=4), headers={"Accept": OCTET}
    )
    assert resp.status == 200 and resp.headers["Content-Type"].startswith(OCTET)
    status = resp.data
    assert status["status"] == "completed"
    assert status["result"]["outputs"]["logprobs_shifted"].shape == (2, 4)
    poll = await http.call(
        M.GET_REQUEST, job_id=job, request_id=status["request_id"], headers={"Accept": OCTET}
    )
    assert poll.data["result"]["loss"] == status["result"]["loss"]


async def test_polled_answers_and_cancel_request() -> None:
    f = await start_fake(token=TOKEN, admin=True, answer_mode="async")
    try:
        async with aiohttp.ClientSession() as s:
            http = Http(s, f)
            job = await http.create_job()
            await http.admin("POST", "/behaviour", {"latency_s": {"forward-backward": 5}})
            resp = await http.dss(M.FORWARD_BACKWARD, job, big_body(rows=1, cols=4))
            assert resp.status == 202 and set(resp.data) == {"request_id", "job_id"}
            rid = resp.data["request_id"]
            assert (await http.poll(job, rid)).data["status"] in ("pending", "running")
            cancel = await http.call(M.CANCEL_REQUEST, job_id=job, request_id=rid)
            assert cancel.data == {"request_id": rid, "cancelled": True, "status": "cancelled"}
            polled = (await http.poll(job, rid)).data
            assert polled["status"] == "cancelled"
            assert polled["error"]["code"] == "request_cancelled"
            await http.admin("POST", "/behaviour", {"latency_s": None})
            resp = await http.dss(M.FORWARD_BACKWARD, job, big_body(rows=1, cols=4))
            assert resp.status == 202
            result = await http.result(resp, job)
            assert result["outputs"]["logprobs_shifted"].shape == (1, 4)
            late = await http.call(M.CANCEL_REQUEST, job_id=job, request_id=resp.data["request_id"])
            assert late.data["cancelled"] is False and late.data["status"] == "completed"
            step = await http.call(M.STEP, {}, job_id=job)  # inline_preferred: answered inline
            assert step.status == 200 and step.data["status"] == "completed"
            await http.admin("POST", "/behaviour", {"latency_s": {"generate": 5}})
            resp = await http.dss(M.GENERATE, job, {"prompts": ["a"]})
            op = await http.run(
                M.OPERATION,
                job,
                {
                    "operation_type": "cancel-request",
                    "payload": {"request_id": resp.data["request_id"]},
                },
            )
            assert op["result"]["cancelled"] is True
            missing = await http.call(M.CANCEL_REQUEST, job_id=job, request_id="nope")
            assert (missing.status, missing.code) == (404, "request_not_found")
            assert (await http.poll(job, "nope")).code == "request_not_found"
    finally:
        await f.close()
