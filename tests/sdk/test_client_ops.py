"""Every op over every transport (HTTP, gRPC, in process), sync and async, against the fake."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from arctic_sdk import (
    ArcticTimeoutError,
    AuthenticationError,
    CallOptions,
    ConflictError,
    NotFoundError,
)
from arctic_servers.protocol.config import ProtocolLimits
from conformance.fake import BackgroundFake, FakeServicer

from .conftest import FAST, JOB, TOKEN, Env

SMALL_LIMITS = ProtocolLimits(
    max_inline_result_bytes=512,
    result_chunk_bytes=700,
    default_max_events=2,
    max_chunk_bytes=4096,
    max_body_bytes=4096,
)


def batch(rows: int = 2, cols: int = 8) -> dict[str, object]:
    ids = (np.arange(rows * cols, dtype=np.int64).reshape(rows, cols) * 7) % 250 + 3
    mask = np.ones((rows, cols), np.int64)
    adv = np.linspace(-1, 1, rows * cols, dtype=np.float32).reshape(rows, cols)
    return {
        "kwargs": {"input_ids": ids, "attention_mask": mask},
        "context": {"advantages": adv, "loss_mask": mask},
        "processing": {"post": ["compute_logprobs"], "loss_fn": "importance_sampling"},
    }


async def test_job_lifecycle(env: Env) -> None:
    client = env.client()
    created = await env.run(
        client.create_job({**JOB, "labels": {"suite": "sdk"}, "lease_seconds": 3600})
    )
    job_id = created["job_id"]
    assert client.job_id == job_id  # the first job a client creates becomes its job
    job = await env.run(client.wait_until_running())
    assert job["state"] == "running" and {s["job_type"] for s in job["sub_jobs"]} >= {"training"}
    got = await env.run(client.get_job())
    assert got["job"]["job_id"] == job_id
    listed = await env.run(client.list_jobs(label=["suite=sdk"], state="running"))
    assert job_id in [j["job_id"] for j in listed["jobs"]]
    capacity = await env.run(client.get_capacity())
    assert capacity["max_total_gpus"] >= capacity["in_use_gpus"] >= 1
    caps = await env.run(client.get_capabilities())
    assert caps["spec_version"] == "arctic.v1"
    renewed = await env.run(client.renew_job_lease(lease_seconds=3600))
    assert renewed["lease_expires_at"]
    # reconnect by job id: a second client attaches, it does not create
    other = env.client(job_id=job_id)
    assert (await env.run(other.get_job()))["job"]["state"] == "running"
    cancelled = await env.run(other.cancel_job())
    assert cancelled["job"]["state"] == "cancelled"
    with pytest.raises(ConflictError) as info:
        await env.run(client.step())
    assert info.value.code == "job_terminal"


async def test_training_ops(env: Env) -> None:
    client = env.client()
    await env.job(client)
    fb = await env.run(client.forward_backward(batch()))
    assert fb["metrics"]["num_tokens"] > 0
    assert fb["outputs"]["logprobs_shifted"].shape == (2, 8)
    fwd = await env.run(client.forward(batch()))
    np.testing.assert_allclose(
        fwd["outputs"]["logprobs_shifted"], fb["outputs"]["logprobs_shifted"]
    )
    lp = await env.run(client.log_probs(input_ids=batch()["kwargs"]["input_ids"]))  # type: ignore[index]
    assert lp["outputs"]["logprobs_shifted"].shape == (2, 8)
    step = await env.run(client.step(learning_rate=1e-4))
    assert step["metrics"]["global_step"] == 1 and step["metrics"]["lr"] == 1e-4
    assert env.job_state(client.job_id)["applied_steps"] == 1


async def test_sampling_weights_and_lifecycle(env: Env) -> None:
    client = env.client()
    await env.job(client)
    gen = await env.run(
        client.generate(
            prompts=["hello", [104, 105]], sampling_params={"n": 2, "max_tokens": 5, "seed": 1}
        )
    )
    assert len(gen["results"]) == 2 and len(gen["results"][0]["samples"]) == 2
    assert all(len(s["token_ids"]) <= 5 for r in gen["results"] for s in r["samples"])
    synced = await env.run(client.sync_weights())
    assert synced["weight_version"] == 1
    assert (await env.run(client.reset_prefix_cache()))["reset"] is True
    logs = await env.run(client.operation(operation_type="tail-logs", payload={"limit": 5}))
    assert "result" in logs
    for op in (
        client.sleep_inference,
        client.wake_inference,
        client.sleep_training,
        client.wake_training,
    ):
        out = await env.run(op())
        assert out["applied"] is False and out["reason"]


async def test_checkpoints(env: Env) -> None:
    client = env.client()
    await env.job(client)
    await env.run(client.forward_backward(batch()))
    await env.run(client.step())
    saved = await env.run(client.save_checkpoint(checkpoint_id="ck1"))
    assert saved["checkpoint"]["checkpoint_id"] == "ck1"
    listed = await env.run(client.list_checkpoints())
    assert [c["checkpoint_id"] for c in listed["checkpoints"]] == ["ck1"]
    exported = await env.run(client.export_checkpoint(checkpoint_id="ck1"))
    f = exported["files"][0]
    data = await env.run(
        client.download_checkpoint_file(checkpoint_id="ck1", filename=f["filename"])
    )
    assert isinstance(data, bytes) and len(data) == f["size_bytes"]
    if f.get("sha256"):
        assert hashlib.sha256(data).hexdigest() == f["sha256"]
    loaded = await env.run(client.load_checkpoint(checkpoint_id="ck1"))
    assert loaded["checkpoint"]["checkpoint_id"] == "ck1"
    assert (await env.run(client.delete_checkpoint(checkpoint_id="ck1")))["deleted"] is True
    with pytest.raises(NotFoundError):
        await env.run(client.export_checkpoint(checkpoint_id="ck1"))


async def test_timeout_get_request_and_cancel_request(env: Env) -> None:
    client = env.client()
    await env.job(client)
    env.behaviour(latency_s={"step": 3.0})
    with pytest.raises(ArcticTimeoutError) as info:
        await env.run(client.step(options=CallOptions(timeout=0.8)))
    rid = info.value.request_id
    assert rid
    status = await env.run(client.get_request(request_id=rid))
    assert status["status"] in ("pending", "running")
    out = await env.run(client.cancel_request(request_id=rid))
    assert out["cancelled"] is True
    assert (await env.run(client.get_request(request_id=rid)))["status"] == "cancelled"
    env.behaviour(latency_s={})
    assert env.job_state(client.job_id)["applied_steps"] == 0


async def test_auth_failure(env: Env) -> None:
    wrong = "tok-WRONG-123456"
    client = env.client(token=wrong)
    with pytest.raises(AuthenticationError) as info:
        await env.run(client.create_job(sub_job_configs=[{"job_type": "training"}]))
    assert info.value.code == "unauthenticated" and not info.value.retryable
    assert wrong not in str(info.value) and TOKEN not in str(info.value)
    anonymous = env.client(token=None)
    with pytest.raises(AuthenticationError):
        await env.run(anonymous.list_jobs())


@pytest.fixture(scope="module")
def small_fake() -> Iterator[BackgroundFake]:
    """Results past 512 bytes travel as result_chunk events, 2 per poll, and uploads are
    chunked at 4 KiB: cursor draining and multi-chunk groups on every call."""
    with BackgroundFake(
        token=TOKEN, answer_mode="async", octet_results=False, limits=SMALL_LIMITS
    ) as f:
        yield f


async def test_cursor_draining_of_large_results(
    sync: bool, transport: str, small_fake: BackgroundFake
) -> None:
    env = Env(sync, transport, small_fake)
    kw: dict[str, Any] = {}
    if transport == "inproc":
        from arctic_servers.protocol.config import ProtocolConfig

        env.servicer = FakeServicer(auth=True)
        protocol = ProtocolConfig(
            tokens=frozenset({TOKEN}), answer_mode="async", octet_results=False, limits=SMALL_LIMITS
        )
        kw["config"] = {**FAST, "inproc": {"protocol": protocol}}
    client = env.client(**kw)
    try:
        await env.job(client)
        big = batch(rows=4, cols=96)
        fb = await env.run(client.forward_backward(big))
        fwd = await env.run(client.forward(big))
        assert fb["outputs"]["logprobs_shifted"].shape == (4, 96)
        np.testing.assert_allclose(
            fb["outputs"]["logprobs_shifted"], fwd["outputs"]["logprobs_shifted"]
        )
    finally:
        await env.run(client.close())
