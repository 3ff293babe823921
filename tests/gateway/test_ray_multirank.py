"""A multi-rank (W = 2) DeepSpeed trainer behind the gateway: local processes, and Ray actors.

- Local backend: the worker host is rank 0 and starts rank 1 itself; forward-backward + step;
  `kill -9` of rank 1 fails the call in flight with `sub_job_failed` naming the rank, and the job.
- Ray (when `ray` is importable): a local Ray head on loopback with 2 CPUs; the sub-job is placed
  as two actors, one per rank (`arctic-worker:{sub_job}` runs rank 0's worker host, and
  `arctic-worker:{sub_job}:rank1` the follower, with MASTER_ADDR/PORT from rank 0's actor); the
  same forward-backward + step give the same loss and grad_norm as the local W = 2 run.

CPU, gloo, fp32, the embedded tiny model. NCCL, GPUs and vLLM tensor parallel are not exercised.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from arctic_sdk.spec.tables import methods as M

from .harness import Client, Gateway
from .rayhead import local_ray_head
from .test_jobs import admin, pids_gone_wait

ENGINES = all(importlib.util.find_spec(m) is not None for m in ("torch", "deepspeed"))
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not ENGINES, reason="the DeepSpeed engine is not installed"),
]
TRAIN_W2 = {
    "job_type": "training",
    "model_name": "tiny",
    "dtype": "float32",
    "training_config": {
        "n_gpus": 2,
        "zero_stage": 1,
        "optimizer": {"name": "adamw", "lr": 1e-3, "weight_decay": 0.0},
    },
}
IDS = np.random.default_rng(0).integers(3, 500, (3, 16), dtype=np.int64)  # B = 3, W = 2
RESULTS: dict[str, dict[str, Any]] = {}
LOCAL = ("--engine", "onprem", "--worker-threads", "1")


def run_w2(gw: Gateway, backend: str) -> dict[str, Any]:
    """Create the W = 2 job, forward-backward + step, check its placement, cancel it."""
    c = Client(gw.prefix_url, timeout=300)
    job = c.create_job(TRAIN_W2)
    c.wait_job(job, timeout=600)
    workers = admin(c, gw, job)["workers"]
    assert [w["backend"] for w in workers] == [backend]
    info = workers[0]["info"]
    assert info["world_size"] == 2 and info["backend"] == "gloo"
    fb = c.result(job, c.dss(M.FORWARD_BACKWARD, job, {"kwargs": {"input_ids": IDS}}))
    st = c.result(job, c.call(M.STEP, {}, job_id=job))
    assert fb["metrics"]["num_tokens"] == 3 * 15
    assert st["metrics"]["global_step"] == 1 and st["metrics"]["grad_norm"] > 0
    rank1 = int(info["rank_pids"][1])
    parent = int(Path(f"/proc/{rank1}/stat").read_text().rsplit(")", 1)[-1].split()[1])
    out = {
        "loss": fb["loss"],
        "grad_norm": st["metrics"]["grad_norm"],
        "workers": workers,
        "rank1_parent": parent,
    }
    assert c.call(M.CANCEL_JOB, job_id=job).status == 200
    pids_gone_wait([int(p) for p in info["rank_pids"]], timeout=60)
    return out


@pytest.fixture(scope="module")
def local_gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    g = Gateway(tmp_path_factory.mktemp("gw-local"), args=LOCAL)
    try:
        g.start(timeout=120)
        yield g
    finally:
        g.cleanup()


def test_local_backend_runs_two_ranks(local_gw: Gateway) -> None:
    RESULTS["local"] = run_w2(local_gw, "local")
    # local backend: rank 0's worker host started rank 1 itself
    assert RESULTS["local"]["rank1_parent"] == RESULTS["local"]["workers"][0]["pid"]
    print(f"\nlocal W=2: loss {RESULTS['local']['loss']:.6f}, "
          f"grad_norm {RESULTS['local']['grad_norm']:.6f}")  # fmt: skip


def test_local_kill9_of_rank1_fails_the_sub_job(local_gw: Gateway) -> None:
    c = Client(local_gw.prefix_url, timeout=300)
    job = c.create_job(TRAIN_W2)
    c.wait_job(job, timeout=600)
    info = admin(c, local_gw, job)["workers"][0]["info"]
    big = np.random.default_rng(1).integers(3, 500, (64, 512), dtype=np.int64)
    box: dict[str, Any] = {}
    sender = threading.Thread(
        target=lambda: box.update(r=c.dss(M.FORWARD_BACKWARD, job, {"kwargs": {"input_ids": big}}))
    )
    sender.start()
    time.sleep(1.0)
    t0 = time.monotonic()
    os.kill(int(info["rank_pids"][1]), signal.SIGKILL)
    sender.join(60)
    status = c.wait(job, box["r"], timeout=30)
    t_call = time.monotonic() - t0
    assert status["status"] == "failed", status
    err = status["error"]
    assert err["code"] == "sub_job_failed" and "rank 1 of 2" in err["message"], err
    j = c.wait_job(job, "failed", timeout=30)
    t_job = time.monotonic() - t0
    print(f"\ngateway, kill -9 of rank 1: call failed after {t_call:.2f} s ({err['code']}), "
          f"job failed after {t_job:.2f} s: {j['reason'][:160]}")  # fmt: skip
    assert "rank 1 of 2" in j["reason"] and t_call < 15
    # the job's reason is the lost rank, not the worker's bare exit status and log tail
    assert "lost rank 1 of 2" in j["reason"] and "exited with code" not in j["reason"], j
    pids_gone_wait([int(p) for p in info["rank_pids"]], timeout=60)


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[str]:
    """A local Ray head on loopback with 2 CPUs, stopped with all its processes (rayhead.py)."""
    pytest.importorskip("ray")
    with local_ray_head(num_cpus=2) as address:
        yield address


def test_ray_places_one_actor_per_rank(
    ray_cluster: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.setenv("ARCTIC_GATEWAY_RAY_BIND", "127.0.0.1")
    g = Gateway(tmp_path, args=(*LOCAL, "--ray-address", ray_cluster, "--gpus", "2"))
    try:
        g.start(timeout=120)
        RESULTS["ray"] = run_w2(g, "ray")
    finally:
        g.cleanup()
    # rank 1 is not rank 0's child: its own actor started it
    assert RESULTS["ray"]["rank1_parent"] != RESULTS["ray"]["workers"][0]["pid"]
    local = RESULTS.get("local")
    if local is None:  # run alone: the local reference first
        g2 = Gateway(tmp_path / "local", args=LOCAL)
        try:
            g2.start(timeout=120)
            local = RESULTS["local"] = run_w2(g2, "local")
        finally:
            g2.cleanup()
    rel = abs(RESULTS["ray"]["loss"] - local["loss"]) / abs(local["loss"])
    rel_gn = abs(RESULTS["ray"]["grad_norm"] - local["grad_norm"]) / local["grad_norm"]
    print(f"\nRay W=2 vs local W=2: loss rel {rel:.2g}, grad_norm rel {rel_gn:.2g}")
    assert rel <= 1e-6 and rel_gn <= 1e-5
