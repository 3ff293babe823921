"""Every route over raw gRPC: the control plane as typed unary RPCs, the data plane as frames."""

from __future__ import annotations

import uuid
from typing import Any

import grpc
import numpy as np
import pytest
from google.protobuf import struct_pb2

from arctic_sdk.spec.pb.arctic.v1 import jobs_pb2 as J
from arctic_sdk.spec.tables import methods as M
from arctic_servers.engines.fake import numerics as nx

from .raw import Grpc, GrpcError, Http, chunks_of
from .test_numerics import lp_ref


def _cfg(role: Any, **conf: float) -> J.SubJobConfig:
    c = J.SubJobConfig(job_type=role, model_name="m")
    if conf:
        s = struct_pb2.Struct()
        s.update(conf)
        (c.training_config if role == J.SUB_JOB_TYPE_TRAINING else c.inference_config).CopyFrom(s)
    return c


async def create(rpc: Grpc, **kw: object) -> str:
    req = J.CreateJobRequest(
        sub_job_configs=[_cfg(J.SUB_JOB_TYPE_TRAINING, n_gpus=2), _cfg(J.SUB_JOB_TYPE_SAMPLING)],
        **kw,  # type: ignore[arg-type]
    )
    resp = await rpc.unary(M.CREATE_JOB, req, J.CreateJobResponse)
    return str(resp.job_id)


async def test_control_plane_over_grpc(rpc: Grpc) -> None:
    caps = await rpc.unary(
        M.GET_CAPABILITIES, J.GetCapabilitiesRequest(), J.GetCapabilitiesResponse
    )
    assert caps.server == "fake" and "forward-backward" in caps.routes
    job = await create(rpc, labels={"k": "v"}, lease_seconds=60)
    got = (await rpc.unary(M.GET_JOB, J.GetJobRequest(job_id=job), J.GetJobResponse)).job
    assert got.state == J.JOB_STATE_RUNNING and got.lease_expires_at
    assert [s.sub_job_id for s in got.sub_jobs] == [f"{job}:training:0", f"{job}:sampling:0"]
    listed = await rpc.unary(M.LIST_JOBS, J.ListJobsRequest(label=["k=v"]), J.ListJobsResponse)
    assert [j.job_id for j in listed.jobs] == [job]
    cap = await rpc.unary(M.GET_CAPACITY, J.GetCapacityRequest(), J.GetCapacityResponse)
    assert cap.in_use_gpus == 3
    lease = await rpc.unary(
        M.RENEW_JOB_LEASE, J.RenewJobLeaseRequest(job_id=job), J.RenewJobLeaseResponse
    )
    assert lease.lease_expires_at
    done = await rpc.unary(M.CANCEL_JOB, J.CancelJobRequest(job_id=job), J.CancelJobResponse)
    assert done.job.state == J.JOB_STATE_CANCELLED
    with pytest.raises(GrpcError) as e:
        await rpc.unary(M.CANCEL_JOB, J.CancelJobRequest(job_id=job), J.CancelJobResponse)
    assert e.value.status == grpc.StatusCode.FAILED_PRECONDITION and e.value.code == "job_terminal"
    with pytest.raises(GrpcError) as e:
        await rpc.unary(M.GET_JOB, J.GetJobRequest(job_id="nope"), J.GetJobResponse)
    assert e.value.status == grpc.StatusCode.NOT_FOUND and e.value.code == "job_not_found"
    bad = J.CreateJobRequest(sub_job_configs=[_cfg(J.SUB_JOB_TYPE_TRAINING, n_gpus=0)])
    with pytest.raises(GrpcError) as e:
        await rpc.unary(M.CREATE_JOB, bad, J.CreateJobResponse)
    assert e.value.status == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.body["error"]["details"]["field"] == "sub_job_configs[0].training_config.n_gpus"
    rpc.token = None
    with pytest.raises(GrpcError) as e:
        await rpc.unary(M.LIST_JOBS, J.ListJobsRequest(), J.ListJobsResponse)
    assert e.value.status == grpc.StatusCode.UNAUTHENTICATED and e.value.code == "unauthenticated"
    rpc.token = "wrong"
    with pytest.raises(GrpcError) as e:
        await rpc.frames(M.STEP, job, {})
    assert e.value.code == "unauthenticated"


async def test_data_plane_over_grpc(rpc: Grpc) -> None:
    job = await create(rpc)
    ids = np.array([[4, 5, 6, 7]])
    fb = {"kwargs": {"input_ids": ids}, "processing": {"post": ["compute_logprobs"]}}
    res = await rpc.result(M.FORWARD_BACKWARD, job, fb, max_bytes=512)
    assert res["outputs"]["logprobs_shifted"][0, 0] == lp_ref(5, 1, 4, 0)
    fwd = await rpc.result(M.FORWARD, job, fb)
    assert np.array_equal(fwd["outputs"]["logprobs_shifted"], res["outputs"]["logprobs_shifted"])
    lps = await rpc.result(M.LOG_PROBS, job, {"input_ids": ids, "entropy": True})
    assert lps["outputs"]["entropy"].shape == (1, 4)
    step = await rpc.result(M.STEP, job, {"learning_rate": 0.5}, idempotency_key="s1")
    assert step["metrics"]["global_step"] == 1
    again = await rpc.result(M.STEP, job, {"learning_rate": 0.5}, idempotency_key="s1")
    assert again == step
    sync = await rpc.result(M.SYNC_WEIGHTS, job, {})
    assert sync["weight_version"] == 1
    gen = await rpc.result(
        M.GENERATE, job, {"prompts": [[1, 2]], "sampling_params": {"seed": 3, "max_tokens": 4}}
    )
    assert gen["results"][0]["samples"][0]["token_ids"] == nx.token_stream(3, 0, 1, [1, 2], 4)
    assert await rpc.result(M.RESET_PREFIX_CACHE, job, {}) == {"reset": True}
    op = await rpc.result(M.OPERATION, job, {"operation_type": "tail-logs"})
    assert op["result"]["eof"] is True
    saved = await rpc.result(M.SAVE_CHECKPOINT, job, {"checkpoint_id": "c1"})
    assert saved["checkpoint"]["global_steps"] == 1
    assert await rpc.result(M.LOAD_CHECKPOINT, job, {"checkpoint_id": "c1"})
    listed = await rpc.result(M.LIST_CHECKPOINTS, job, {})
    assert [c["checkpoint_id"] for c in listed["checkpoints"]] == ["c1"]
    exported = await rpc.result(M.EXPORT_CHECKPOINT, job, {"checkpoint_id": "c1"})
    files = {f["filename"]: f for f in exported["files"]}
    raw = await rpc.frames(
        M.DOWNLOAD_CHECKPOINT_FILE, job, {"checkpoint_id": "c1", "filename": "config.json"}
    )
    assert raw["offset"] == 0 and len(bytes(raw["data"])) == files["config.json"]["size_bytes"]
    assert await rpc.result(M.DELETE_CHECKPOINT, job, {"checkpoint_id": "c1"}) == {"deleted": True}
    noop = {"applied": False, "reason": "fake gateway: nothing to offload"}
    for m in (M.SLEEP_INFERENCE, M.WAKE_INFERENCE, M.SLEEP_TRAINING, M.WAKE_TRAINING):
        assert await rpc.result(m, job, {}) == noop
    status = await rpc.frames(M.STEP, job, {})
    polled = await rpc.get_request(job, status["request_id"])
    assert polled["status"] == "completed" and polled["result"] == status["result"]
    cancel = await rpc.unary(
        M.CANCEL_REQUEST,
        J.CancelRequestRequest(job_id=job, request_id=status["request_id"]),
        J.CancelRequestResponse,
    )
    assert cancel.cancelled is False and cancel.status == J.REQUEST_STATE_COMPLETED


async def test_grpc_errors_and_replay(rpc: Grpc, http: Http) -> None:
    job = await create(rpc)
    cases = [
        (M.FORWARD_BACKWARD, {"kwargs": {"input_ids": np.array([[1.5]])}}, "dtype_mismatch"),
        (
            M.FORWARD_BACKWARD,
            {"kwargs": {"input_ids": np.array([[1, 2]])}, "processing": {"loss_fn": "nope"}},
            "invalid_argument",
        ),
        (M.GENERATE, {"prompts": []}, "invalid_argument"),
        (M.OPERATION, {"operation_type": "explode"}, "unknown_operation_type"),
        (M.STEP, {"learning_rate": -1}, "invalid_argument"),  # 0 is valid: an lr = 0 control
        (M.SYNC_WEIGHTS, {"method": "x"}, "invalid_argument"),
    ]
    for method, body, code in cases:
        with pytest.raises(GrpcError) as e:
            await rpc.frames(method, job, body)
        assert e.value.status == grpc.StatusCode.INVALID_ARGUMENT and e.value.code == code
    with pytest.raises(GrpcError) as e:
        await rpc.frames(M.STEP, "", {})
    assert e.value.code == "missing_field"
    with pytest.raises(GrpcError) as e:
        await rpc.frames(M.STEP, "job-999", {})
    assert e.value.status == grpc.StatusCode.NOT_FOUND
    with pytest.raises(GrpcError) as e:
        await rpc.get_request(job, "nope")
    assert e.value.code == "request_not_found"
    group = str(uuid.uuid4())
    body = {"kwargs": {"input_ids": np.arange(200).reshape(4, 50) + 3}}
    chunks = chunks_of(M.FORWARD_BACKWARD, body, max_bytes=512, group=group)
    first = await rpc.frames(M.FORWARD_BACKWARD, job, None, chunks=chunks)
    second = await rpc.frames(M.FORWARD_BACKWARD, job, None, chunks=chunks)
    assert first["request_id"] == second["request_id"]
    log = (await http.state(job))["execution_log"]
    assert [e["op"] for e in log].count("forward-backward") == 1
    assert log[0]["transport"] == "grpc"
    replay = await rpc.frames(M.FORWARD_BACKWARD, job, None, chunks=chunks[1:2])
    assert replay["request_id"] == first["request_id"]
    fresh = chunks_of(M.FORWARD_BACKWARD, body, max_bytes=512)
    with pytest.raises(GrpcError) as e:
        await rpc.frames(M.FORWARD_BACKWARD, job, None, chunks=fresh[1:2])
    assert e.value.status == grpc.StatusCode.FAILED_PRECONDITION
    assert e.value.code == "chunk_group_restart_required"


FRAMES = [m for m in M.METHODS if m.grpc_shape.value == "frames"]


@pytest.mark.parametrize("method", FRAMES, ids=[m.name for m in FRAMES])
async def test_every_data_plane_route_refuses_unknown_fields(
    method: Any, rpc: Grpc, http: Http
) -> None:
    job = await create(rpc)
    with pytest.raises(GrpcError) as e:
        await rpc.frames(method, job, {"bogus_field": 1})
    assert e.value.status == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.code in ("invalid_argument", "missing_field")
    if method.body.value == "dssst1":
        resp = await http.dss(method, job, {"bogus_field": 1})
    elif method.body.value == "json":
        resp = await http.call(method, {"bogus_field": 1}, job_id=job)
    else:  # body-less routes: their path parameters are the whole body
        return
    assert resp.status == 400 and resp.code in ("invalid_argument", "missing_field"), resp.data
    assert (await http.state(job))["execution_log"] == []


async def test_replayed_step_group_over_grpc_applies_once(rpc: Grpc, http: Http) -> None:
    job = await create(rpc)
    chunks = chunks_of(M.STEP, {"learning_rate": 0.5})
    first = await rpc.frames(M.STEP, job, None, chunks=chunks)
    second = await rpc.frames(M.STEP, job, None, chunks=chunks)
    assert first == second
    assert (await http.state(job))["applied_steps"] == 1
