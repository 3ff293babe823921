"""The gateway with the real on-prem engines (DeepSpeed trainer, vLLM sampler, the tiny model):
a job end to end, and a kill -9 of the gateway while a long generate runs, which the vLLM worker
completes and the restarted gateway collects.

Minutes of CPU, so opt-in: `ARCTIC_ENGINES_PYTHON=/work/venv-engines/bin/python pytest
tests/gateway/test_real_engines.py` (the interpreter of the engines' venv, ENGINE_NOTES.md).
With `ARCTIC_GATEWAY_RAY_ADDRESS` set too, the same runs with the sub-jobs as Ray actors.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from arctic_sdk._generated import methods as M

from .harness import Client, Gateway
from .test_jobs import admin, pids_gone_wait

PYTHON = os.environ.get("ARCTIC_ENGINES_PYTHON", "")
RAY = os.environ.get("ARCTIC_GATEWAY_RAY_ADDRESS", "")
pytestmark = pytest.mark.skipif(
    not PYTHON or not Path(PYTHON).exists(), reason="set ARCTIC_ENGINES_PYTHON (engines venv)"
)
TINY = [{"job_type": "training", "model_name": "tiny"}, {"job_type": "sampling", "model_name": ""}]


@pytest.fixture
def real_gw(tmp_path: Path) -> Iterator[Gateway]:
    args = ["--engine", "onprem", "--worker-python", PYTHON, "--worker-threads", "1"]
    if RAY:
        args += ["--ray-address", RAY]
    g = Gateway(tmp_path, args=tuple(args))
    try:
        yield g
    finally:
        g.cleanup()


def test_real_engines_job_and_kill9_restart(real_gw: Gateway) -> None:
    real_gw.start(timeout=120)
    c = Client(real_gw.prefix_url, timeout=300)
    job = c.create_job(*TINY)
    c.wait_job(job, timeout=900)
    ids = np.random.default_rng(0).integers(3, 500, (2, 16), dtype=np.int64)
    fb = c.result(job, c.dss(M.FORWARD_BACKWARD, job, {"kwargs": {"input_ids": ids}}))
    assert np.isfinite(fb["loss"]) and fb["metrics"]["num_tokens"] == 30
    step = c.call(M.STEP, {}, job_id=job, headers={"Idempotency-Key": "s1"})
    assert c.result(job, step)["metrics"]["global_step"] == 1
    assert c.result(job, c.call(M.SYNC_WEIGHTS, {}, job_id=job))["weight_version"] == 1
    workers = admin(c, real_gw, job)["workers"]
    assert {w["backend"] for w in workers} == {"ray" if RAY else "local"}
    assert {w["info"]["engine"] for w in workers} == {"deepspeed", "vllm"}
    pids = [w["pid"] for w in workers]

    long = {"prompts": ["hello"] * 8, "sampling_params": {"max_tokens": 600, "ignore_eos": True}}
    r = c.dss(M.GENERATE, job, long)
    assert r.status == 202
    time.sleep(0.5)
    real_gw.kill9()  # vLLM goes on generating
    restored = real_gw.start(timeout=120)["restored"]
    assert restored["jobs"]["running"] == 1
    assert [w["pid"] for w in admin(c, real_gw, job)["workers"]] == pids
    gen = c.result(job, r)
    assert [len(s["token_ids"]) for res in gen["results"] for s in res["samples"]] == [600] * 8
    replay = c.call(M.STEP, {}, job_id=job, headers={"Idempotency-Key": "s1"})
    assert replay.data["request_id"] == step.data["request_id"]
    assert c.result(job, c.call(M.STEP, {}, job_id=job))["metrics"]["global_step"] == 2
    assert c.call(M.CANCEL_JOB, job_id=job).status == 200
    pids_gone_wait(pids, timeout=60)  # the workers (and Ray actors) stopped before the test ends
    deadline = time.monotonic() + 60
    while c.call(M.GET_CAPACITY).data["in_use_gpus"]:
        assert time.monotonic() < deadline, "the job's GPUs were not freed"
        time.sleep(0.2)
