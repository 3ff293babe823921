"""Sub-jobs placed as Ray actors (fake workers) on a local Ray instance: 2 CPUs, loopback.

The gateway runs with `--ray-address`; each sub-job is a detached actor that starts the worker
host on its node. A kill -9 of the gateway leaves the actors and workers running; the restarted
gateway finds them again; cancelling the job stops them. The Ray instance is this module's own
(`rayhead.local_ray_head`), stopped at the end with none of its processes left.

Ray comes with the `ray` extra (in `dev`, so CI has it). Without it this module is skipped,
except under CI (`CI` set), where it fails.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from arctic_sdk.spec.tables import methods as M

from .harness import SAMPLE, TRAIN, Client, Gateway, fb_body
from .rayhead import (
    TWO_NODES,
    kill_node,
    local_ray_cluster,
    local_ray_head,
    require_ray,
    two_node_args,
)
from .test_jobs import admin, pids_gone_wait


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[str]:
    require_ray()
    with local_ray_head(num_cpus=2) as address:
        yield address


@pytest.fixture
def ray_gw(ray_cluster: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Gateway]:
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.setenv("ARCTIC_GATEWAY_RAY_BIND", "127.0.0.1")
    g = Gateway(tmp_path, args=("--ray-address", ray_cluster, "--gpus", "2"))
    try:
        yield g
    finally:
        g.cleanup()


def test_sub_jobs_as_ray_actors_survive_a_gateway_restart(ray_gw: Gateway) -> None:
    ray_gw.start(timeout=120)
    c = Client(ray_gw.prefix_url)
    job = c.create_job(TRAIN, SAMPLE)
    c.wait_job(job, timeout=120)
    workers = admin(c, ray_gw, job)["workers"]
    assert {w["backend"] for w in workers} == {"ray"}
    pids = [w["pid"] for w in workers]
    assert c.result(job, c.dss(M.FORWARD_BACKWARD, job, fb_body()))["metrics"]["num_tokens"] == 14
    assert c.result(job, c.call(M.STEP, {}, job_id=job))["metrics"]["global_step"] == 1
    sync = c.result(job, c.call(M.SYNC_WEIGHTS, {}, job_id=job))
    # both actors on the one Ray node: the file under its /dev/shm (fake workers take no
    # process group; across nodes it would be the bytes through the gateway, safetensors)
    assert sync["weight_version"] == 1 and sync["method"] == "shm"
    gen = {"prompts": ["hi"], "sampling_params": {"max_tokens": 3, "seed": 7}}
    assert c.result(job, c.dss(M.GENERATE, job, gen))["weight_version"] == 1

    ray_gw.kill9()
    restored = ray_gw.start(timeout=120)["restored"]
    assert restored["jobs"]["running"] == 1
    assert [w["pid"] for w in admin(c, ray_gw, job)["workers"]] == pids
    assert c.result(job, c.call(M.STEP, {}, job_id=job))["metrics"]["global_step"] == 2
    stats = c.stats(ray_gw.base_url, job)
    assert stats[f"{job}:training:0"]["applied_steps"] == 2
    assert stats[f"{job}:sampling:0"]["model_step"] == 1

    assert c.call(M.CANCEL_JOB, job_id=job).status == 200
    pids_gone_wait(pids)
    deadline = time.monotonic() + 30
    while c.call(M.GET_CAPACITY).data["in_use_gpus"]:
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_two_nodes_by_resources_and_a_lost_node_fails_its_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two Ray nodes on this machine, each with a custom resource; `--ray-resources` puts the
    trainer on one and the sampler on the other. Killing the sampler's node (every process of
    it at once, as a host is lost) fails the job, naming the lost node, and frees its GPUs."""
    require_ray()
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.setenv("ARCTIC_GATEWAY_RAY_BIND", "127.0.0.1")
    with local_ray_cluster(TWO_NODES) as (address, procs):
        g = Gateway(tmp_path, args=two_node_args(address))
        try:
            g.start(timeout=120)
            c = Client(g.prefix_url)
            job = c.create_job(TRAIN, SAMPLE)
            c.wait_job(job, timeout=120)
            workers = {w["sub_job_id"]: w for w in admin(c, g, job)["workers"]}
            trainer, sampler = workers[f"{job}:training:0"], workers[f"{job}:sampling:0"]
            assert trainer["node_id"] and sampler["node_id"]
            assert trainer["node_id"] != sampler["node_id"]
            sync = c.result(job, c.call(M.SYNC_WEIGHTS, {}, job_id=job))
            # two hosts, and fake workers take no process group: the bytes through the gateway
            assert sync["method"] == "safetensors" and sync["weight_version"] == 1
            r = c.call(M.SYNC_WEIGHTS, {"method": "shm"}, job_id=job)
            assert r.status == 400 and r.data["error"]["code"] == "unsupported_option", r.data
            assert "one host" in r.data["error"]["message"]

            kill_node(procs[1])
            t0 = time.monotonic()
            failed = c.wait_job(job, "failed", timeout=120)
            print(f"\nlost node: the job failed {time.monotonic() - t0:.1f} s later: "
                  f"{failed['reason']}")  # fmt: skip
            assert "Ray node" in failed["reason"] and "lost" in failed["reason"]
            assert f"{job}:sampling:0" in failed["reason"]
            deadline = time.monotonic() + 60
            while c.call(M.GET_CAPACITY).data["in_use_gpus"]:
                assert time.monotonic() < deadline, "the job's GPUs were not freed"
                time.sleep(0.2)
            pids_gone_wait([trainer["pid"]], timeout=60)  # the trainer on the live node stopped
        finally:
            g.cleanup()
