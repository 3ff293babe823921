"""Retries, at-most-once execution and ordering under injected faults (HTTP and gRPC).

The fake's fault injection (`/_admin/faults`) acts on the wire, so these run over HTTP and gRPC;
the in-process variants check the fault-free behaviour of the same calls.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from arctic_sdk import BadRequestError, InvalidArgumentError

from .conftest import Env
from .test_client_ops import batch


async def test_503_then_success(env: Env) -> None:
    client = env.client()
    job = await env.job(client)
    env.arm(route="step", kind="fail", status=503, count=1)
    out = await env.run(client.step())
    assert out["metrics"]["global_step"] == 1
    assert env.fired() == 1 and env.job_state(job)["applied_steps"] == 1


async def test_execute_then_drop_on_step_applies_once(env: Env) -> None:
    client = env.client()
    job = await env.job(client)
    env.arm(route="step", kind="drop_after_execute", count=2)
    acknowledged = [await env.run(client.step()) for _ in range(3)]
    assert [a["metrics"]["global_step"] for a in acknowledged] == [1, 2, 3]
    assert env.fired() == 2
    assert env.job_state(job)["applied_steps"] == len(acknowledged)


async def test_execute_then_drop_on_the_last_fwd_bwd_chunk(env: Env) -> None:
    client = env.client()
    job = await env.job(client)
    env.arm(route="forward-backward", kind="drop_after_execute", count=1)
    out = await env.run(client.forward_backward(batch()))
    assert out["metrics"]["num_tokens"] > 0
    assert env.fired() == 1 and len(env.executed(job, "forward-backward")) == 1


async def test_close_mid_body_is_retried_once_executed(env: Env) -> None:
    client = env.client()
    job = await env.job(client)
    env.arm(route="step", kind="close_mid_body", count=1)
    await env.run(client.step())
    assert env.job_state(job)["applied_steps"] == 1


async def test_429_with_retry_after(env: Env) -> None:
    client = env.client()
    await env.job(client)
    env.arm(route="step", kind="fail", status=429, retry_after_s=1, count=1)
    started = time.monotonic()
    await env.run(client.step())
    assert time.monotonic() - started >= 0.9  # waited as told, not the 0.02 s backoff


async def test_chunk_group_restart_replays_from_chunk_0(env: Env) -> None:
    client = env.client()
    job = await env.job(client)
    body = {
        "error": {
            "code": "chunk_group_restart_required",
            "message": "state lost",
            "details": {"expected_start_chunk": 0},
        }
    }
    env.arm(route="forward-backward", kind="fail", status=409, body=body, count=1)
    out = await env.run(client.forward_backward(batch()))
    assert out["metrics"]["num_tokens"] > 0
    assert env.fired() == 1 and len(env.executed(job, "forward-backward")) == 1


async def test_bad_input_is_rejected_before_anything_is_sent(env: Env) -> None:
    client = env.client()
    await env.job(client)
    env.arm(route="*", kind="fail", status=500, count=1)  # would catch any request
    with pytest.raises(InvalidArgumentError, match="dtype"):
        await env.run(client.forward_backward(kwargs={"input_ids": np.zeros((2, 3), np.float32)}))
    with pytest.raises(InvalidArgumentError, match="unknown field"):
        await env.run(client.step(learning_rte=0.1))
    with pytest.raises(InvalidArgumentError):
        client.submit_forward_backward(kwargs={"input_ids": "not a tensor"})
    assert env.fired() == 0


async def test_100_pipelined_calls_execute_in_submission_order(env: Env) -> None:
    client = env.client(max_in_flight=128)
    job = await env.job(client)
    if env.faults:  # hold all 100, then release them newest first
        env.arm(route="step", kind="reorder", count=100, delay_s=3.0, gap_s=0.001)
        env.arm(route="forward-backward", kind="delay", delay_s=0.2, count=1)
    first = client.submit_forward_backward(batch())
    futures = [client.submit_step() for _ in range(100)]
    await env.result(first)
    results = [await env.result(f) for f in futures]
    assert [r["metrics"]["global_step"] for r in results] == list(range(1, 101))
    log = env.job_state(job)["execution_log"]
    seqs = [e["seq"] for e in log if e["op"] in ("step", "forward-backward")]
    assert seqs == list(range(1, 102))
    assert results[0]["metrics"]["num_tokens"] > 0  # the step saw the fwd-bwd's gradients
    if env.faults:
        assert env.fired() == 101  # every step was held and released out of order


async def test_large_upload_is_chunked(env: Env) -> None:
    client = env.client()
    job = await env.job(client)
    ids = (np.arange(2 * 300_000, dtype=np.int64).reshape(2, 300_000) % 250) + 3  # 4.6 MiB
    out = await env.run(client.forward_backward(kwargs={"input_ids": ids}))
    assert out["metrics"]["num_tokens"] > 0
    assert len(env.executed(job, "forward-backward")) == 1


async def test_a_refused_call_does_not_stall_the_next(env: Env) -> None:
    client = env.client()
    job = await env.job(client)
    with pytest.raises(BadRequestError):  # refused by the server's own checks: it never ran
        await env.run(client.step(learning_rate=-1.0))
    started = time.monotonic()
    out = await env.run(client.step())  # its sequence number was reused: no gap to wait out
    assert out["metrics"]["global_step"] == 1 and time.monotonic() - started < 5
    assert [e["seq"] for e in env.executed(job, "step")] == [1]
