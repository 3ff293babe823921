"""LoRA pools on the gateway's real engines (PROTOCOL.md §3.6): the pool's trainer and sampler are
two worker hosts that outlive the gateway, shared by every pooled job.

- Two jobs (one with an lm_head adapter) share the pool's two workers; each syncs its adapter
  only, by file (a weight group refused by name: serving/lora_sync.py), and samples its own
  version.
- The kill storm on a pool: 10 kill -9 of the gateway at the named crash points while one
  driver per tenant keeps retrying sequenced forward-backward / step pairs (a backlog queued in
  some iterations), each restarted on the same state file; for EVERY tenant the kill matrix's
  invariants hold (every call answered with one request id, nothing lost, nothing run twice, a
  failed call never ran, steps applied == steps completed == the job's global step), the pool's
  workers are the same processes throughout, and after the storm each tenant's adapter is still
  there (its trainer log-probs bitwise unchanged across one more restart) and syncs and samples.
- A gateway killed while a job joins its pool (its attach sent, not answered): the restarted
  gateway finishes the join, once.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from arctic_sdk.spec.tables import methods as M

from .driver import Driver, Op
from .harness import Client, Gateway, fb_body
from .test_kill_matrix import PAIRS, SCENARIOS, _check, _run_ops
from .test_real_engines import ENGINES, MISSING, _engine_args

pytestmark = pytest.mark.slow
ITERATIONS = 10
TRAIN = {
    "job_type": "training",
    "model_name": "tiny",
    "training_config": {"optimizer": {"name": "adamw", "lr": 1e-2}, "lora": {"rank": 8}},
}
SAMPLE = {"job_type": "sampling", "model_name": "tiny"}


@pytest.fixture(scope="module")
def pool_gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    if not ENGINES:
        pytest.skip(MISSING)
    g = Gateway(
        tmp_path_factory.mktemp("gw-pool"),
        args=(*_engine_args(), "--gpus", "4", "--lora-pool", "*=4", "--sequence-gap-timeout", "30"),
    )
    g.start(timeout=120)
    try:
        yield g
    finally:
        g.cleanup()


def pool_view(c: Client, gw: Gateway) -> dict[str, Any]:
    r = c.request("GET", f"{gw.base_url}/_admin/pools")
    assert r.status == 200, r.data
    (pool,) = [p for p in r.data["pools"] if p["state"] == "ready"]
    return dict(pool)


def lora_job(c: Client, **lora: Any) -> str:
    train = {**TRAIN, "training_config": {**TRAIN["training_config"], "lora": {"rank": 8, **lora}}}
    job = c.create_job(train, SAMPLE)
    c.wait_job(job, timeout=900)
    return job


def result(c: Client, job: str, resp: Any) -> Any:
    return c.result(job, resp)


def logprobs(c: Client, job: str) -> bytes:
    """The trainer's log-probs of a fixed batch (what its adapter computes)."""
    body = fb_body(2, 32, seed=99)
    body["processing"] = {"post": ["compute_logprobs"]}
    res = result(c, job, c.dss(M.FORWARD, job, body))
    return bytes(np.asarray(res["outputs"]["logprobs_shifted"]).tobytes())


def test_jobs_share_the_pool_on_the_gateway(pool_gw: Gateway) -> None:
    c = Client(pool_gw.prefix_url, timeout=300)
    a, b = lora_job(c), lora_job(c, train_lm_head=True)
    try:
        pool = pool_view(c, pool_gw)
        assert sorted(pool["jobs"]) == sorted([a, b])
        caps = c.call(M.GET_CAPABILITIES).data["lora"]
        assert caps["shared_sampler"] and any(p["adapters"] == 2 for p in caps["pools"])
        for job, n in ((a, 28), (b, 30)):
            result(c, job, c.dss(M.FORWARD_BACKWARD, job, fb_body(2, 16, seed=1)))
            result(c, job, c.call(M.STEP, {}, job_id=job))
            group = c.call(M.SYNC_WEIGHTS, {"method": "collective"}, job_id=job)
            assert group.status == 400 and group.code == "unsupported_option", group.data
            sync = result(c, job, c.call(M.SYNC_WEIGHTS, {}, job_id=job))
            assert sync["num_tensors"] == n and sync["weight_version"] == 1
            assert sync["method"] == "shm" and sync["num_buckets"] == 1, sync  # local workers
            gen = {"prompts": [[5, 6, 7]], "sampling_params": {"max_tokens": 4}}
            g = result(c, job, c.dss(M.GENERATE, job, gen))
            assert g["weight_version"] == 1
    finally:
        for j in (a, b):
            c.call(M.CANCEL_JOB, job_id=j)
    deadline = time.monotonic() + 60
    while pool_view(c, pool_gw)["jobs"]:  # both adapters left; the pool stays warm
        assert time.monotonic() < deadline
        time.sleep(0.2)


def test_kill_storm_on_a_pool_loses_doubles_and_strands_nothing(pool_gw: Gateway) -> None:
    rng = random.Random(20261206)
    c = Client(pool_gw.prefix_url, timeout=300)
    jobs = [lora_job(c), lora_job(c, train_lm_head=True)]
    pids = {r: e["pid"] for r, e in pool_view(c, pool_gw)["engines"].items()}
    seq, completed, crashes, report = 1, dict.fromkeys(jobs, 0), 0, []
    for it in range(ITERATIONS):
        point, (lo, hi), backlog = SCENARIOS[it % len(SCENARIOS)]
        n = rng.randrange(lo, hi)
        pool_gw.kill9()
        pool_gw.start(crash_at=f"{point}:{n}", timeout=120)
        drivers = {j: Driver(Client(pool_gw.prefix_url, timeout=300), j, 600.0) for j in jobs}
        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
            futs = {j: pool.submit(_run_ops, d, seq, backlog) for j, d in drivers.items()}
            crashed = False
            while not all(f.done() for f in futs.values()):
                assert pool_gw.proc is not None
                if not crashed and pool_gw.proc.poll() is not None:
                    assert pool_gw.proc.returncode == 137, pool_gw.tail()
                    crashed = True
                    pool_gw.start(timeout=120)  # same state file, no crash point
                time.sleep(0.02)
            ops: dict[str, list[Op]] = {j: f.result() for j, f in futs.items()}
        crashes += crashed
        for job in jobs:
            replayed = {op.identity: drivers[job].replay(op) for op in ops[job]}
            stats = c.stats(pool_gw.base_url, job)[f"{job}:training:0"]
            steps, _failed = _check(ops[job], stats, replayed)
            completed[job] += steps
            assert stats["applied_steps"] == completed[job], (job, stats, ops[job])
            assert c.job(job)["global_step"] == completed[job]
            assert c.job(job)["state"] == "running"
        report.append(
            {"iteration": it, "crash_at": f"{point}:{n}", "crashed": crashed,
             "seconds": round(time.monotonic() - t0, 1),
             "failed_with_reason": sum(o.status == "failed" for v in ops.values() for o in v)}
        )  # fmt: skip
        seq += 2 * PAIRS
    print(json.dumps(report))
    (Path(pool_gw.root) / "pool_kill_storm.json").write_text(json.dumps(report, indent=1))
    assert crashes >= ITERATIONS - 2, report
    # the pool's workers never restarted; both adapters are there, unchanged by a restart
    pool = pool_view(c, pool_gw)
    assert {r: e["pid"] for r, e in pool["engines"].items()} == pids
    assert sorted(pool["jobs"]) == sorted(jobs)
    before = {j: logprobs(c, j) for j in jobs}
    pool_gw.terminate()
    pool_gw.start(timeout=120)
    assert {j: logprobs(c, j) for j in jobs} == before
    for j in jobs:
        sync = result(c, j, c.call(M.SYNC_WEIGHTS, {}, job_id=j))
        gen = {"prompts": [[5, 6, 7]], "sampling_params": {"max_tokens": 4}}
        g = result(c, j, c.dss(M.GENERATE, j, gen))
        assert g["weight_version"] == sync["weight_version"]
        c.call(M.CANCEL_JOB, job_id=j)


def test_a_kill_while_a_job_joins_its_pool(pool_gw: Gateway) -> None:
    c = Client(pool_gw.prefix_url, timeout=300)
    first = lora_job(c)  # the pool is warm
    pool_gw.kill9()
    pool_gw.start(crash_at="worker_dispatched:1", timeout=120)  # the join's attach is sent
    job = c.create_job({**TRAIN}, SAMPLE)
    assert pool_gw.proc is not None
    pool_gw.proc.wait(120)
    assert pool_gw.proc.returncode == 137, pool_gw.tail()
    pool_gw.start(timeout=120)
    c.wait_job(job, timeout=300)
    pool = pool_view(c, pool_gw)
    assert sorted(pool["jobs"]) == sorted([first, job])
    stats = c.stats(pool_gw.base_url, job)
    assert stats[f"{job}:training:0"]["global_step"] == 0
    res = c.result(job, c.dss(M.FORWARD_BACKWARD, job, fb_body(2, 16, seed=3)))
    assert np.isfinite(res["loss"])
    for j in (first, job):
        c.call(M.CANCEL_JOB, job_id=j)
