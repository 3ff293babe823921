"""A real Prometheus (Debian's `prometheus` package) scrapes a gateway running a short workload,
with the operator token the gateway's /metrics needs, and its HTTP API answers queries over the
families of servers/METRICS.md with the counts the workload made (issue 35).

Skipped with the reason where the package is not installed, except under CI (`CI` set), where
`tools/test.sh` installs it and a missing binary fails the test."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

import dssst1
from arctic_sdk import Client, rollouts
from arctic_servers.serving.serve import free_port

from .harness import Gateway

PROMETHEUS = shutil.which("prometheus")
OPERATOR = "operator-token-1"
JOB = {
    "sub_job_configs": [
        {"job_type": "training", "model_name": "fake-model"},
        {"job_type": "sampling", "model_name": "fake-model"},
    ]
}


def _binary() -> str:
    if PROMETHEUS is None:
        if os.environ.get("CI"):
            pytest.fail("prometheus is not installed: tools/test.sh installs Debian's package")
        pytest.skip("Debian's prometheus package is not installed (apt-get install prometheus)")
    return PROMETHEUS


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[Gateway]:
    ops = tmp_path / "operators"
    ops.write_text(OPERATOR + "\n")
    (tmp_path / "gw").mkdir()
    g = Gateway(tmp_path / "gw", args=("--metrics-token-file", str(ops), "--answer-mode", "inline"))
    g.start()
    try:
        yield g
    finally:
        g.cleanup()


@pytest.fixture
def prometheus(tmp_path: Path, gateway: Gateway) -> Iterator[str]:
    binary = _binary()
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        f"""
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: gateway
    scrape_interval: 1s
    metrics_path: /metrics
    authorization:
      type: Bearer
      credentials: {OPERATOR}
    static_configs:
      - targets: ["127.0.0.1:{gateway.port}"]
"""
    )
    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if requests.get(url + "/-/ready", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "prometheus did not get ready"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def query(url: str, expr: str) -> list[dict[str, Any]]:
    r = requests.get(url + "/api/v1/query", params={"query": expr}, timeout=10)
    body = r.json()
    assert r.status_code == 200 and body["status"] == "success", (expr, body)
    return list(body["data"]["result"])


def scalar(url: str, expr: str) -> float:
    result = query(url, expr)
    assert len(result) == 1, (expr, result)
    return float(result[0]["value"][1])


def until(url: str, expr: str, expected: float, timeout: float = 60.0) -> None:
    """Wait until Prometheus has scraped what the workload did."""
    deadline = time.monotonic() + timeout
    got: Any = None
    while time.monotonic() < deadline:
        result = query(url, expr)
        got = [float(r["value"][1]) for r in result]
        if got == [expected]:
            return
        time.sleep(0.5)
    raise AssertionError(f"{expr}: {got}, expected {expected}")


def test_prometheus_scrapes_the_gateway_and_answers_the_workloads_counts(
    gateway: Gateway, prometheus: str
) -> None:
    with Client(gateway.base_url, token="pat-1", transport="http") as client:
        client.create_job(JOB)
        client.wait_until_running(timeout=120)
        job_id = client.job_id
        assert job_id is not None
        out = client.generate(prompts=["a", "b"], sampling_params={"n": 2, "max_tokens": 5})
        frame = rollouts.forward_backward_frame(
            rollouts.from_generate(out), np.zeros(4, np.float32), loss_fn="grpo"
        )
        client.forward_backward(frame)
        client.forward_backward(frame)
        client.step(learning_rate=1e-3)
        sync = client.sync_weights()
    # two forward-backwards the gateway refuses: another job id, and no token
    for headers in ({"Authorization": "Bearer pat-1"}, {}):
        r = requests.post(
            gateway.prefix_url + "/no-such-job/forward-backward",
            data=dssst1.dumps(frame),
            headers={"Content-Type": "application/octet-stream", **headers},
            timeout=10,
        )
        assert r.status_code in (401, 404), r.text

    fb = 'op="forward-backward"'
    until(prometheus, f'arctic_requests_total{{{fb},code="ok"}}', 2)
    assert scalar(prometheus, 'up{job="gateway"}') == 1
    # how many forward-backwards failed in the last minute, and with which code (here: refused
    # at the door), with the query of servers/METRICS.md
    x = f'arctic_calls_total{{{fb},code!="ok"}}'
    failed = query(prometheus, f"sum by (code) ({x} - ({x} offset 1m or {x} * 0))")
    assert {r["metric"]["code"]: float(r["value"][1]) for r in failed} == {
        "job_not_found": 1.0,
        "unauthenticated": 1.0,
    }
    assert scalar(prometheus, f"sum(arctic_request_queue_wait_seconds_count{{{fb}}})") == 2
    assert scalar(prometheus, 'sum(arctic_requests_total{op="generate"})') == 1
    # the last sync's seconds and bytes, as the sync answered them
    jid = f'job_id="{job_id}"'
    assert scalar(prometheus, f"arctic_job_last_weight_sync_bytes{{{jid}}}") == sync["num_bytes"]
    seconds = scalar(prometheus, f"arctic_job_last_weight_sync_seconds{{{jid}}}")
    assert seconds == pytest.approx(sync["seconds"], abs=1e-6)
    assert scalar(prometheus, f"arctic_job_weight_version{{{jid}}}") == sync["weight_version"]
    assert scalar(prometheus, f"arctic_job_tokens_sampled_total{{{jid}}}") == 2 * 2 * 5
    assert scalar(prometheus, f'arctic_job_state{{{jid},state="running"}}') == 1
    assert scalar(prometheus, f"sum(arctic_job_engine_busy_seconds_total{{{jid}}})") > 0
    assert scalar(prometheus, 'sum(arctic_gateway_worker_hosts{state="connected"})') == 2
    assert scalar(prometheus, 'arctic_gateway_worker_events_total{event="launched"}') == 2
    assert scalar(prometheus, "arctic_chunk_open_bytes") == 0
    # a 404 of a path no route serves is counted under the route "unmatched"
    requests.get(gateway.base_url + "/nowhere", timeout=10)
    until(prometheus, 'sum(arctic_http_responses_total{route="unmatched",status="404"})', 1)
