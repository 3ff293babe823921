"""Every fault kind fires and is counted, over HTTP and gRPC; the rest of the admin API."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import grpc
import pytest

from arctic_sdk.spec.pb.arctic.v1 import jobs_pb2 as J
from arctic_sdk.spec.tables import methods as M
from conformance.fake import start_fake

from .raw import Grpc, GrpcError, Http


async def arm(http: Http, **spec: Any) -> dict[str, Any]:
    resp = await http.admin("POST", "/faults", spec)
    assert resp.status == 200, resp.data
    data: dict[str, Any] = resp.data
    return data


async def fired(http: Http) -> dict[str, int]:
    data: dict[str, int] = (await http.admin("GET", "/faults")).data["fired"]
    return data


async def applied(http: Http, job: str) -> int:
    return int((await http.state(job))["applied_steps"])


async def test_fail_answers_the_status_and_body(http: Http, job: str) -> None:
    fault = await arm(http, route="step", kind="fail", count=2, status=503, retry_after_s=2)
    for _ in range(2):
        resp = await http.call(M.STEP, {}, job_id=job)
        assert (resp.status, resp.code, resp.headers["Retry-After"]) == (503, "unavailable", "2")
        assert resp.error["details"]["fault_id"] == fault["id"]
    assert (await http.call(M.STEP, {}, job_id=job)).status == 200
    await arm(http, route="forward-backward", kind="fail", status=500, body={"detail": "boom"})
    resp = await http.dss(M.FORWARD_BACKWARD, job, {"kwargs": {"input_ids": [[1, 2]]}})
    assert (resp.status, resp.data) == (500, {"detail": "boom"})
    assert await applied(http, job) == 1
    listed = (await http.admin("GET", "/faults")).data
    assert [f["fired"] for f in listed["faults"]] == [2, 1]
    assert listed["fired"]["fail"] == 3 and len(listed["log"]) == 3


async def test_delay(http: Http, job: str) -> None:
    await arm(http, route="get-job", kind="delay", delay_s=0.3)
    t0 = time.monotonic()
    assert (await http.call(M.GET_JOB, job_id=job)).status == 200
    assert time.monotonic() - t0 >= 0.3
    assert (await fired(http))["delay"] == 1


async def test_drop_after_execute_then_keyed_retry_executes_once(http: Http, job: str) -> None:
    await arm(http, route="step", kind="drop_after_execute")
    key = {"Idempotency-Key": "drop-1"}
    with pytest.raises(aiohttp.ServerDisconnectedError):
        await http.call(M.STEP, {}, job_id=job, headers=key)
    assert await applied(http, job) == 1
    retry = await http.call(M.STEP, {}, job_id=job, headers=key)
    assert retry.status == 200 and retry.data["result"]["metrics"]["global_step"] == 1
    assert await applied(http, job) == 1
    assert (await fired(http))["drop_after_execute"] == 1


async def test_close_mid_body(http: Http, job: str) -> None:
    await arm(http, route="forward-backward", kind="close_mid_body")
    with pytest.raises(aiohttp.ClientPayloadError):
        await http.dss(M.FORWARD_BACKWARD, job, {"kwargs": {"input_ids": [[1, 2, 3]]}})
    log = (await http.state(job))["execution_log"]
    assert [e["op"] for e in log] == ["forward-backward"]
    assert (await fired(http))["close_mid_body"] == 1


async def test_reorder_releases_newest_first_and_seq_restores_order(http: Http, job: str) -> None:
    async def burst(headers: list[dict[str, str]]) -> None:
        tasks = []
        for h in headers:
            tasks.append(asyncio.create_task(http.call(M.STEP, {}, job_id=job, headers=h)))
            await asyncio.sleep(0.02)
        assert all(r.status == 200 for r in await asyncio.gather(*tasks))

    await arm(http, route="step", kind="reorder", count=3)
    await burst([{"Idempotency-Key": f"r{i}"} for i in (1, 2, 3)])
    log = (await http.state(job))["execution_log"]
    assert [e["idempotency_key"] for e in log] == ["r3", "r2", "r1"]
    await arm(http, route="step", kind="reorder", count=3)
    await burst([{"Idempotency-Key": f"s{i}", "X-Arctic-Seq": str(i)} for i in (1, 2, 3)])
    log = (await http.state(job))["execution_log"][3:]
    assert [e["seq"] for e in log] == [1, 2, 3]
    assert (await fired(http))["reorder"] == 6


async def test_reorder_timeout_releases_a_partial_batch(http: Http, job: str) -> None:
    await arm(http, route="step", kind="reorder", count=5, delay_s=0.1)
    t0 = time.monotonic()
    assert (await http.call(M.STEP, {}, job_id=job)).status == 200
    assert 0.1 <= time.monotonic() - t0 < 2


async def test_faults_over_grpc(http: Http, rpc: Grpc, job: str) -> None:
    await arm(http, route="step", kind="fail", status=503, transport="grpc")
    assert (await http.call(M.STEP, {}, job_id=job)).status == 200  # HTTP is not hit
    with pytest.raises(GrpcError) as e:
        await rpc.frames(M.STEP, job, {})
    assert e.value.status == grpc.StatusCode.UNAVAILABLE and e.value.code == "unavailable"
    await arm(http, route="step", kind="drop_after_execute", transport="grpc")
    with pytest.raises(GrpcError) as e:
        await rpc.frames(M.STEP, job, {}, idempotency_key="g1")
    assert e.value.status == grpc.StatusCode.UNAVAILABLE
    assert await applied(http, job) == 2
    again = await rpc.frames(M.STEP, job, {}, idempotency_key="g1")
    assert again["result"]["metrics"]["global_step"] == 2 and await applied(http, job) == 2
    await arm(http, route="forward-backward", kind="close_mid_body", transport="grpc")
    with pytest.raises(GrpcError) as e:
        await rpc.frames(M.FORWARD_BACKWARD, job, {"kwargs": {"input_ids": [[1, 2]]}})
    assert e.value.status == grpc.StatusCode.UNAVAILABLE
    await arm(http, route="create-job", kind="drop_after_execute", transport="grpc")
    req = J.CreateJobRequest(
        sub_job_configs=[J.SubJobConfig(job_type=J.SUB_JOB_TYPE_TRAINING, model_name="m")]
    )
    with pytest.raises(GrpcError):
        await rpc.unary(M.CREATE_JOB, req, J.CreateJobResponse)
    assert len((await http.call(M.LIST_JOBS)).data["jobs"]) == 2  # it was created
    await arm(http, route="get-request", kind="delay", delay_s=0.2, transport="grpc")
    t0 = time.monotonic()
    await rpc.get_request(job, again["request_id"])
    assert time.monotonic() - t0 >= 0.2
    await arm(http, route="get-job", kind="fail", status=404, transport="grpc")
    with pytest.raises(GrpcError) as e:
        await rpc.unary(M.GET_JOB, J.GetJobRequest(job_id=job), J.GetJobResponse)
    assert e.value.status == grpc.StatusCode.NOT_FOUND
    await arm(http, route="step", kind="reorder", count=2, transport="grpc")
    outs = await asyncio.gather(
        rpc.frames(M.STEP, job, {}, idempotency_key="o1"),
        rpc.frames(M.STEP, job, {}, idempotency_key="o2"),
    )
    assert all(o["status"] == "completed" for o in outs)
    counts = await fired(http)
    assert counts == {
        "fail": 2,
        "delay": 1,
        "drop_after_execute": 2,
        "close_mid_body": 1,
        "reorder": 2,
    }


async def test_admin_api(http: Http, job: str) -> None:
    for spec, field in (
        ({"route": "step", "kind": "explode"}, "kind"),
        ({"route": "nope", "kind": "fail"}, "route"),
        ({"route": "step", "kind": "fail", "count": 0}, "count"),
        ({"route": "step", "kind": "fail", "status": 200}, "status"),
        ({"route": "step", "kind": "delay", "delay_s": -1}, "delay_s"),
        ({"route": "step", "kind": "fail", "transport": "smoke"}, "transport"),
        ({"route": "step", "kind": "fail", "color": 1}, "color"),
    ):
        resp = await http.admin("POST", "/faults", spec)
        assert resp.status == 400 and resp.error["details"]["field"] == field, resp.data
    f = await arm(http, route="fwd-bwd", kind="fail")
    assert f["route"] == "forward-backward" and f["remaining"] == 1
    assert (await http.admin("DELETE", f"/faults/{f['id']}")).status == 200
    assert (await http.admin("DELETE", "/faults/99")).status == 404
    await arm(http, route="*", kind="fail", status=429)
    assert (await http.call(M.GET_CAPACITY)).code == "rate_limited"
    await http.admin("DELETE", "/faults")
    assert (await http.admin("GET", "/faults")).data["faults"] == []
    behaviour = await http.admin("POST", "/behaviour", {"latency_s": {"step": 0.01}})
    assert behaviour.data == {"latency_s": {"step": 0.01}}
    ended = await http.admin("POST", f"/jobs/{job}/end", {"state": "failed", "reason": "oom"})
    assert ended.data["state"] == "failed"
    resp = await http.call(M.STEP, {}, job_id=job)
    assert (resp.status, resp.code) == (409, "job_terminal")
    assert resp.error["details"]["reason"] == "oom"
    assert (await http.admin("GET", "/jobs")).data["jobs"][0]["state"] == "failed"
    assert (await http.admin("POST", "/reset")).data == {"reset": True}
    assert (await http.call(M.GET_JOB, job_id=job)).code == "job_not_found"
    assert (await http.admin("GET", "/behaviour")).data == {}
    assert await http.create_job() != job  # ids are never reused
    assert (await http.admin("GET", "/jobs/nope/state")).code == "job_not_found"


async def test_admin_is_off_by_default() -> None:
    f = await start_fake()
    try:
        async with aiohttp.ClientSession() as s:
            http = Http(s, f, token=None)
            resp = await http.admin("GET", "/faults")
            assert (resp.status, resp.code) == (404, "not_found")
            job = await http.create_job()
            assert (await http.call(M.GET_JOB, job_id=job)).status == 200  # no auth configured
    finally:
        await f.close()
