"""Sub-jobs placed as Ray actors (fake workers) on a local Ray instance: 2 CPUs, loopback.

The gateway runs with `--ray-address`; each sub-job is a detached actor that starts the worker
host on its node. A kill -9 of the gateway leaves the actors and workers running; the restarted
gateway finds them again; cancelling the job stops them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from arctic_sdk._generated import methods as M
from arctic_servers.protocol.serve import free_port

from .harness import SAMPLE, TRAIN, Client, Gateway, fb_body
from .test_jobs import admin, pids_gone_wait

pytest.importorskip("ray")


def _tree(marker: str) -> set[int]:
    """Processes whose command line names `marker`, and all their descendants."""
    parents: dict[int, int] = {}
    roots: set[int] = set()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes()
        except OSError:
            continue
        parents[int(d.name)] = int(stat.rsplit(")", 1)[-1].split()[1])
        if marker.encode() in cmd:
            roots.add(int(d.name))
    out, grew = set(roots), True
    while grew:
        kids = {p for p, pp in parents.items() if pp in out} - out
        grew = bool(kids)
        out |= kids
    return out


def _kill_tree(marker: str) -> None:
    """Stop the Ray instance this test started: its processes are found by its temp dir."""
    pids = _tree(marker)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        time.sleep(1.0)


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[str]:
    """`ray start --head` on loopback with 2 CPUs, in its own temp dir (stopped by that dir)."""
    tmp = tempfile.mkdtemp(prefix="arcray")  # short: Ray's socket paths must stay < 108 bytes
    port, lo = free_port(), 23000 + os.getpid() % 2000 * 3
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    argv = [
        sys.executable, "-m", "ray.scripts.scripts", "start", "--head",
        "--node-ip-address", "127.0.0.1", "--port", str(port),
        "--num-cpus", "2", "--include-dashboard", "false", "--disable-usage-stats",
        "--temp-dir", tmp, "--min-worker-port", str(lo), "--max-worker-port", str(lo + 40),
    ]  # fmt: skip
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)
    try:
        assert out.returncode == 0, out.stdout + out.stderr
        yield f"127.0.0.1:{port}"
    finally:
        _kill_tree(tmp)
        shutil.rmtree(tmp, ignore_errors=True)


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
    assert sync["weight_version"] == 1 and sync["method"] == "safetensors"  # portable hand-off
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
