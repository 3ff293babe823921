"""The on-prem server's proofs (issue 8 §4), on real engines, fp32 on both sides.

- After `sync-weights`, the sampler's log-probs (from generate) and the trainer's (from forward)
  agree on >= 256 sampled tokens within max |Δ| <= 1e-3; before the sync they differ by >= 1e-2.
- SFT loss on a fixed batch falls over a few steps.
- Killing the vLLM worker in the middle of a generate fails that call and the next one with a typed
  error within 30 s, and GetJob shows the sub-job failed with a reason.

(save → fresh sub-job → load, export, and the split-batch equivalence are in test_checkpoints.py.)
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import time
from typing import Any

import numpy as np
import pytest
import requests

from arctic_sdk.spec.tables import methods as M

from .conftest import ServerInfo, create_job
from .helpers import CHAT, ROWS, TEXTS, pad, sampled, sft_body, trainer_vs_sampler
from .raw import CallError, Http

pytestmark = pytest.mark.slow


async def test_sync_weights_makes_sampler_and_trainer_agree(http: Http, shared_job: str) -> None:
    job = shared_job
    # move the trainer away from the sampler
    for _ in range(2):
        await http.run(M.FORWARD_BACKWARD, job, sft_body())
        await http.run(M.STEP, job, {})
    prompts: list[object] = [CHAT.format(t) for t in TEXTS] + [list(r) for r in ROWS]
    params = {
        "n": 4,
        "max_tokens": 16,
        "ignore_eos": True,
        "logprobs": 0,
        "seed": 1234,
        "temperature": 1.0,
    }

    async def compare() -> tuple[np.ndarray, int]:
        gen = await http.run(M.GENERATE, job, {"prompts": prompts, "sampling_params": params})
        rows, plens, lps = sampled(gen)
        ids, mask = pad(rows, left=True)
        fwd = await http.run(M.FORWARD, job, {"kwargs": {"input_ids": ids, "attention_mask": mask}})
        return trainer_vs_sampler(
            fwd["outputs"]["logprobs_shifted"], rows, plens, lps, left=True
        ), gen["weight_version"]

    before, v0 = await compare()
    sync = await http.run(M.SYNC_WEIGHTS, job, {"method": "shm"})  # (collective: its own tests)
    after, v1 = await compare()
    print(
        f"\nsync proof: {after.size} tokens; before sync max|Δ| {before.max():.4g} "
        f"(mean {before.mean():.3g}); after sync max|Δ| {after.max():.3g} "
        f"(mean {after.mean():.3g}); sync {sync['method']} {sync['num_tensors']} tensors "
        f"{sync['num_bytes']} B in {sync['seconds'] * 1e3:.1f} ms"
    )
    assert after.size >= 256 and before.size >= 256
    assert after.max() <= 1e-3
    assert before.max() >= 1e-2
    assert sync["weight_version"] == v0 + 1 == v1
    assert sync["method"] == "shm" and sync["num_tensors"] > 0


async def test_sft_loss_falls(http: Http, shared_job: str) -> None:
    body = sft_body(ROWS)
    losses = []
    for _ in range(5):
        fb = await http.run(M.FORWARD_BACKWARD, shared_job, body)
        st = await http.run(M.STEP, shared_job, {})
        losses.append(fb["loss"])
        assert st["metrics"]["loss"] == pytest.approx(fb["loss"], rel=1e-6)
        assert st["metrics"]["grad_norm"] > 0
    print(f"\nSFT losses: {[round(x, 4) for x in losses]}")
    assert all(b < a for a, b in itertools.pairwise(losses)), losses
    assert losses[-1] < 0.8 * losses[0]


async def test_killing_the_sampler_mid_generate_fails_fast(http: Http, onprem: ServerInfo) -> None:
    job = create_job(onprem, {"sub_job_configs": [{"job_type": "sampling"}]})
    pid = next(w["pid"] for w in onprem.admin(job)["workers"] if w["role"] == "sampling")
    long_gen = {
        "prompts": [CHAT.format(t) for t in TEXTS] * 2,
        "sampling_params": {"n": 8, "max_tokens": 900, "ignore_eos": True, "seed": 1},
    }
    task = asyncio.create_task(http.run(M.GENERATE, job, long_gen))
    await asyncio.sleep(1.5)
    assert not task.done(), "the generate finished before the kill: make it longer"
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(CallError) as inflight:
        await asyncio.wait_for(task, 30)
    t_inflight = time.monotonic() - t0
    with pytest.raises(CallError) as nxt:
        await asyncio.wait_for(http.run(M.GENERATE, job, {"prompts": ["hello"]}), 30)
    t_next = time.monotonic() - t0
    state = await http.get_job(job)
    sub = state["sub_jobs"][0]
    print(
        f"\nkill: in-flight generate failed after {t_inflight:.2f} s ({inflight.value.code}); "
        f"next call failed after {t_next:.2f} s ({nxt.value.code}); "
        f"job {state['state']}: {state['reason'][:160]}"
    )
    assert inflight.value.code == "sub_job_failed"
    assert inflight.value.body["details"]["sub_job_id"] == f"{job}:sampling:0"
    assert "SIGKILL" in inflight.value.body["details"]["reason"]
    assert nxt.value.code in ("job_terminal", "sub_job_failed")
    assert t_next < 30
    assert state["state"] == "failed"
    assert sub["state"] == "failed" and "SIGKILL" in sub["reason"], sub


def _wait_terminal(onprem: ServerInfo, job: str, within: float) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while True:
        state = requests.get(f"{onprem.prefix_url}/{job}", timeout=30).json()["job"]
        if state["state"] in ("failed", "cancelled", "terminated", "running"):
            return dict(state)
        assert time.monotonic() < deadline, f"job still {state['state']}: {onprem.log_tail()}"
        time.sleep(0.1)


def test_a_sampler_that_fails_to_start_fails_its_job_by_name(onprem: ServerInfo) -> None:
    """A sub-job whose engine cannot start (an engine argument vLLM refuses) next to a trainer:
    the job ends `failed` naming the sub-job and vLLM's error."""
    bad = {"no_such_engine_argument": 1}
    body = {
        "sub_job_configs": [
            {
                "job_type": "training",
                "dtype": "float32",
                "training_config": {"zero_stage": 1, "optimizer": {"name": "adamw", "lr": 1e-3}},
            },
            {"job_type": "sampling", "dtype": "float32", "inference_config": {"vllm_config": bad}},
        ]
    }
    r = requests.post(onprem.prefix_url + "/", json=body, timeout=60)
    assert r.status_code == 200, r.text
    job = str(r.json()["job_id"])
    state = _wait_terminal(onprem, job, 240)
    assert state["state"] == "failed", state
    assert f"{job}:sampling:0" in state["reason"], state["reason"]
    assert "no_such_engine_argument" in state["reason"], state["reason"]
    subs = {s["sub_job_id"]: s for s in state["sub_jobs"]}
    assert subs[f"{job}:sampling:0"]["state"] == "failed"
    assert "no_such_engine_argument" in subs[f"{job}:sampling:0"]["reason"]
    assert subs[f"{job}:training:0"]["state"] in ("terminated", "failed")


def test_a_sampler_killed_while_starting_fails_its_job(onprem: ServerInfo) -> None:
    """The sampler's worker is killed while its engine starts: the job ends `failed` at once
    (SIGKILL named), not left `initializing`. (The worker's exit marked the sub-job failed,
    then the job's start moved it to failed again, which raised inside the start task: the job
    stayed `initializing` for good and the server logged an unretrieved task exception.)"""
    r = requests.post(
        onprem.prefix_url + "/", json={"sub_job_configs": [{"job_type": "sampling"}]}, timeout=60
    )
    assert r.status_code == 200, r.text
    job = str(r.json()["job_id"])
    deadline = time.monotonic() + 120
    pid = None
    while pid is None:
        assert time.monotonic() < deadline, onprem.log_tail()
        info = onprem.admin(job)
        assert info["state"] in ("pending", "placing", "initializing"), "started before the kill"
        pid = next((w.get("pid") for w in info.get("workers", []) if w.get("pid")), None)
        time.sleep(0.02)
    os.kill(int(pid), signal.SIGKILL)
    t0 = time.monotonic()
    state = _wait_terminal(onprem, job, 60)
    print(f"\nkilled while starting: job {state['state']} after {time.monotonic() - t0:.2f} s")
    assert state["state"] == "failed", state
    assert "SIGKILL" in state["reason"], state["reason"]
    assert state["sub_jobs"][0]["state"] == "failed"
    assert "Task exception was never retrieved" not in onprem.log_tail(2000)
