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

import numpy as np
import pytest

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
    sync = await http.run(M.SYNC_WEIGHTS, job, {})
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
