"""The job control plane over HTTP: states, sub-jobs, capacity, leases, labels, auth, bad input."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from arctic_sdk.spec.model import STANDARD_CONFIG_KEYS
from arctic_sdk.spec.tables import methods as M
from conformance.fake import JobDelays, RunningFake, start_fake

from .raw import TOKEN, Http

ROLES3 = [
    {"job_type": "training", "model_name": "m", "training_config": {"n_gpus": 2}},
    {"job_type": "sampling", "model_name": "m", "inference_config": {"n_gpus": 1}},
    {"job_type": "sampling", "model_name": "m"},
    {"job_type": "log_probability", "model_name": "m"},
]


async def test_capabilities_need_no_token(http: Http) -> None:
    http.token = None
    resp = await http.call(M.GET_CAPABILITIES)
    assert resp.status == 200
    caps = resp.data
    assert caps["server"] == "fake" and caps["spec_version"] == "arctic.v1"
    assert {m.name for m in M.METHODS} <= set(caps["routes"])
    assert set(caps["operation_types"]) == {
        "weight-sync",
        "reset-prefix-cache",
        "cancel-request",
        "tail-logs",
        "forward",
    }
    assert caps["features"]["grpc"] and caps["features"]["leases"]
    # the standard sub-job config keys, and `lora` (PROTOCOL.md §3.6): the fake's LoRA jobs
    assert caps["config_keys"]["training"] == sorted(STANDARD_CONFIG_KEYS["training"] | {"lora"})
    assert caps["lora"]["training"] and caps["lora"]["sampling"]
    assert caps["lora"]["max_rank"] == 512 and "q_proj" in caps["lora"]["target_modules"]
    assert caps["config_keys"]["log_prob"] == ["max_seq_len", "n_gpus", "vllm_config"]


async def test_auth_401_without_or_with_a_wrong_token(http: Http, job: str) -> None:
    for token in (None, "wrong"):
        http.token = token
        for resp in (
            await http.call(M.LIST_JOBS),
            await http.call(M.GET_JOB, job_id=job),
            await http.call(M.STEP, {}, job_id=job),
        ):
            assert resp.status == 401 and resp.code == "unauthenticated"
    assert (await http.admin("GET", "/faults")).status == 401


async def test_jobs_belong_to_their_token(fake: RunningFake) -> None:
    f = await start_fake(tokens=("a", "b"))
    try:
        async with aiohttp.ClientSession() as s:
            a, b = Http(s, f, "a"), Http(s, f, "b")
            job = await a.create_job()
            assert (await b.call(M.GET_JOB, job_id=job)).code == "job_not_found"
            assert (await b.call(M.STEP, {}, job_id=job)).status == 404
            assert (await b.call(M.LIST_JOBS)).data == {"jobs": []}
            assert [j["job_id"] for j in (await a.call(M.LIST_JOBS)).data["jobs"]] == [job]
    finally:
        await f.close()


async def test_sub_job_ids_states_and_history(http: Http) -> None:
    job = await http.create_job(ROLES3, labels={"team": "rl"}, comment="c", experiment_name="e")
    got = (await http.call(M.GET_JOB, job_id=job)).data["job"]
    assert got["state"] == "running"
    assert [s["sub_job_id"] for s in got["sub_jobs"]] == [
        f"{job}:training:0",
        f"{job}:sampling:0",
        f"{job}:sampling:1",
        f"{job}:log_prob:0",
    ]
    assert [s["job_type"] for s in got["sub_jobs"]][-1] == "log_prob"
    assert (got["labels"], got["comment"], got["experiment_name"]) == ({"team": "rl"}, "c", "e")
    history = [h["state"] for h in (await http.state(job))["history"]]
    assert history == ["pending", "placing", "initializing", "running"]
    cap = (await http.call(M.GET_CAPACITY)).data
    assert cap["in_use_gpus"] == 5 and cap["max_total_gpus"] == 64


async def test_state_progression_with_delays_and_job_not_running() -> None:
    f = await start_fake(token=TOKEN, admin=True, delays=JobDelays(0.05, 0.05, 0.05))
    try:
        async with aiohttp.ClientSession() as s:
            http = Http(s, f)
            job = await http.create_job()
            first = (await http.call(M.GET_JOB, job_id=job)).data["job"]["state"]
            assert first == "pending"
            resp = await http.call(M.STEP, {}, job_id=job)
            assert resp.status == 409 and resp.code == "job_not_running"
            assert resp.error["details"]["state"] in ("pending", "placing")
            seen = {first}
            while "running" not in seen:
                await asyncio.sleep(0.01)
                seen.add((await http.call(M.GET_JOB, job_id=job)).data["job"]["state"])
            assert {"placing", "initializing"} & seen
            states = [h["state"] for h in (await http.state(job))["history"]]
            assert states == ["pending", "placing", "initializing", "running"]
    finally:
        await f.close()


@pytest.fixture
async def small() -> AsyncIterator[Http]:
    f = await start_fake(token=TOKEN, admin=True, max_total_gpus=2)
    async with aiohttp.ClientSession() as s:
        yield Http(s, f)
    await f.close()


async def test_capacity_queues_and_cancel_frees(small: Http) -> None:
    http = small
    a = await http.create_job()
    b = await http.create_job()
    got = (await http.call(M.GET_JOB, job_id=b)).data["job"]
    assert got["state"] == "pending" and "capacity" in got["reason"]
    assert (await http.call(M.GET_CAPACITY)).data == {
        "has_reservation": True,
        "max_total_gpus": 2,
        "in_use_gpus": 2,
        "available_gpus": 0,
        "queued_jobs": 1,
    }
    resp = await http.call(M.CANCEL_JOB, job_id=a)
    assert resp.data["job"]["state"] == "cancelled"
    assert (await http.call(M.GET_JOB, job_id=b)).data["job"]["state"] == "running"
    again = await http.call(M.CANCEL_JOB, job_id=a)
    assert again.status == 409 and again.code == "job_terminal"
    assert (await http.call(M.STEP, {}, job_id=a)).code == "job_terminal"
    keyed = {"Idempotency-Key": "cancel-b"}
    first = await http.call(M.CANCEL_JOB, job_id=b, headers=keyed)
    assert (await http.call(M.CANCEL_JOB, job_id=b, headers=keyed)).data == first.data
    too_big = [{"job_type": "training", "model_name": "m", "training_config": {"n_gpus": 3}}]
    resp = await http.call(M.CREATE_JOB, {"sub_job_configs": too_big})
    assert resp.code == "invalid_argument"
    assert resp.error["details"]["field"] == "sub_job_configs[0].training_config.n_gpus"


async def test_list_filters(http: Http) -> None:
    a = await http.create_job(labels={"team": "rl", "run": "1"})
    b = await http.create_job(labels={"team": "rl", "run": "2"})
    await http.call(M.CANCEL_JOB, job_id=a)

    async def ids(query: list[tuple[str, str]]) -> list[str]:
        resp = await http.call(M.LIST_JOBS, query=query)
        assert resp.status == 200, resp.data
        return [j["job_id"] for j in resp.data["jobs"]]

    assert await ids([]) == [a, b]
    assert await ids([("state", "running")]) == [b]
    assert await ids([("state", "JOB_STATE_CANCELLED")]) == [a]
    assert await ids([("label", "team=rl"), ("label", "run=2")]) == [b]
    assert await ids([("label", "team=other")]) == []
    bad = await http.call(M.LIST_JOBS, query=[("label", "nokey")])
    assert bad.code == "invalid_argument" and bad.error["details"]["field"] == "label"
    bad = await http.call(M.LIST_JOBS, query=[("state", "bogus")])
    assert bad.status == 400 and bad.code == "invalid_argument"


async def test_lease_expires_and_renews(http: Http) -> None:
    job = await http.create_job(lease_seconds=1)
    got = (await http.call(M.GET_JOB, job_id=job)).data["job"]
    assert got["lease_expires_at"]
    renewed = await http.call(M.RENEW_JOB_LEASE, {"lease_seconds": 1}, job_id=job)
    assert renewed.status == 200 and renewed.data["lease_expires_at"] >= got["lease_expires_at"]
    await asyncio.sleep(1.3)
    got = (await http.call(M.GET_JOB, job_id=job)).data["job"]
    assert (got["state"], got["reason"]) == ("cancelled", "lease expired")
    assert (await http.call(M.GET_CAPACITY)).data["in_use_gpus"] == 0
    assert (await http.call(M.RENEW_JOB_LEASE, {}, job_id=job)).code == "job_terminal"
    other = await http.create_job(lease_seconds=3600)
    assert (await http.admin("POST", f"/jobs/{other}/expire-lease")).status == 200
    assert (await http.call(M.GET_JOB, job_id=other)).data["job"]["reason"] == "lease expired"
    bad = await http.call(M.RENEW_JOB_LEASE, {"lease_seconds": -1}, job_id=job)
    assert bad.code == "invalid_argument"


@pytest.mark.parametrize(
    ("configs", "code", "field"),
    [
        ([], "missing_field", "sub_job_configs"),
        ([{"model_name": "m"}], "missing_field", "sub_job_configs[0].job_type"),
        ([{"job_type": "training"}], "missing_field", "sub_job_configs[0].model_name"),
        (
            [{"job_type": "critic", "model_name": "m"}],
            "invalid_argument",
            "sub_job_configs[0].job_type",
        ),
        (
            [{"job_type": "training", "model_name": "m", "dtype": "int4"}],
            "invalid_argument",
            "sub_job_configs[0].dtype",
        ),
        (
            [{"job_type": "training", "model_name": "m", "training_config": {"n_gpu": 1, "lr": 2}}],
            "unsupported_option",
            "sub_job_configs[0].training_config.n_gpu",
        ),
        (
            [{"job_type": "sampling", "model_name": "m", "training_config": {"n_gpus": 1}}],
            "invalid_argument",
            "sub_job_configs[0].training_config",
        ),
        (
            [{"job_type": "training", "model_name": "m", "training_config": {"n_gpus": 0}}],
            "invalid_argument",
            "sub_job_configs[0].training_config.n_gpus",
        ),
        (
            [{"job_type": "training", "model_name": "m", "extra": 1}],
            "invalid_argument",
            "sub_job_configs[0].extra",
        ),
    ],
)
async def test_create_job_refuses_bad_configs(
    http: Http, configs: list[Any], code: str, field: str
) -> None:
    resp = await http.call(M.CREATE_JOB, {"sub_job_configs": configs})
    assert resp.status == 400, resp.data
    assert resp.code == code and resp.error["details"]["field"] == field
    if code == "unsupported_option":
        assert len(resp.error["details"]["options"]) == 2


async def test_create_job_bad_bodies(http: Http) -> None:
    url = http.fake.prefix_url + "/"
    resp = await http.request(
        "POST", url, data=b"{nope", headers={"Content-Type": "application/json"}
    )
    assert (resp.status, resp.code) == (400, "invalid_json")
    resp = await http.call(M.CREATE_JOB, {"sub_job_configs": [], "lease_seconds": "x"})
    assert resp.code == "invalid_argument" and resp.error["details"]["field"] == "lease_seconds"
    resp = await http.call(M.CREATE_JOB, {"sub_job_configs": list(TRAIN), "lease_seconds": 10**9})
    assert resp.code == "invalid_argument"
    key = {"Idempotency-Key": "create-1"}
    a = await http.call(M.CREATE_JOB, {"sub_job_configs": list(TRAIN)}, headers=key)
    b = await http.call(M.CREATE_JOB, {"sub_job_configs": list(TRAIN)}, headers=key)
    assert a.data == b.data
    c = await http.call(M.CREATE_JOB, {"sub_job_configs": list(TRAIN), "comment": "x"}, headers=key)
    assert (c.status, c.code) == (409, "idempotency_key_conflict")
    assert (await http.call(M.GET_JOB, job_id="nope")).code == "job_not_found"
    resp = await http.request("GET", http.fake.prefix_url + "/job-1/nonexistent")
    assert (resp.status, resp.code) == (404, "not_found")
    resp = await http.request("DELETE", http.fake.prefix_url + "/capacity")
    assert (resp.status, resp.code) == (405, "method_not_allowed")


TRAIN = ({"job_type": "training", "model_name": "m"},)


def test_an_engine_command_the_fake_engine_lacks_is_unimplemented() -> None:
    """The fake gateway forwards `engine` ops to the sub-job's fake engine by the op's name; an
    op whose command the engine has no method for is `unimplemented` naming the command."""
    from arctic_servers.engines.fake.config import sub_jobs_of
    from arctic_servers.engines.fake.state import Job
    from arctic_servers.rules.errors import ProtocolError
    from conformance.fake.servicer import engine_command

    subs = sub_jobs_of({"sub_job_configs": [{"job_type": "training", "model_name": "m"}]}, 8)
    job = Job("job-1", None, subs, {}, "", "", 0)
    job.start_engines(512)
    with pytest.raises(ProtocolError) as err:
        engine_command(job, subs[0], "toy_count", body={})
    assert err.value.code == "unimplemented" and "toy_count" in str(err.value)
    import numpy as np

    ids = np.array([[1, 2, 3]], np.int64)
    fwd = engine_command(job, subs[0], "forward", body={"kwargs": {"input_ids": ids}})
    assert fwd["metrics"]["global_step"] == 0
