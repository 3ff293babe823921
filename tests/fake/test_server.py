"""Starting the fake: `python -m conformance serve`, `BackgroundFake` for synchronous code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import requests

from arctic_sdk.spec.tables import methods as M
from conformance.__main__ import main
from conformance.fake import BackgroundFake

from .raw import TOKEN

ROOT = Path(__file__).resolve().parents[2]


def test_background_fake_serves_synchronous_clients() -> None:
    with BackgroundFake(token=TOKEN, admin=True) as fake:
        h = {"Authorization": f"Bearer {TOKEN}"}
        caps = requests.get(fake.prefix_url + "/capabilities", timeout=10).json()
        assert caps["features"]["grpc_port"] == fake.server.grpc_port
        body = {"sub_job_configs": [{"job_type": "training", "model_name": "m"}]}
        job = requests.post(fake.prefix_url + "/", json=body, headers=h, timeout=10).json()
        url = fake.prefix_url + M.STEP.http_path.replace("{job_id}", job["job_id"])
        assert requests.post(url, json={}, headers=h, timeout=10).status_code == 200
        assert requests.post(url, json={}, timeout=10).status_code == 401
        state = fake.call(fake.servicer.job_state, job["job_id"])
        assert state["applied_steps"] == 1


def test_cli_serve_prints_its_urls() -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(ROOT), str(ROOT / "sdk"), str(ROOT / "servers"), os.environ.get("PYTHONPATH", "")]
        ),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "conformance", "serve", "--port", "0", "--token", TOKEN, "--admin"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith("fake gateway: http http://127.0.0.1:"), first
        prefix = proc.stdout.readline().split()[-1]
        assert prefix.endswith("/cortex-training")
        assert proc.stdout.readline().split()[0] == "grpc"
        caps = requests.get(prefix + "/capabilities", timeout=10).json()
        assert caps["server"] == "fake"
        assert requests.get(prefix + "/", timeout=10).status_code == 401
    finally:
        proc.terminate()
        proc.communicate(timeout=10)
    assert proc.returncode == 0


def test_serve_refuses_bad_delays() -> None:
    assert main(["serve", "--delays", "1,x"]) == 2
