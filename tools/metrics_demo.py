"""The run servers/METRICS.md shows: a gateway (fake workers) under a short workload, its /metrics,
and a real Prometheus answering the questions of issue 35 from it.

    python tools/metrics_demo.py [--out DIR]

The workload: a job (trainer + sampler), a generate, forward-backwards (two run, the second
queued behind the first; one refused for a field its loss does not read, one for a job that does
not exist, one cancelled while it ran: the fake workers take 3 s a forward-backward), a step and
a weight sync. Then it prints the /metrics lines that answer each question
and, when Debian's `prometheus` is installed, the answers of its HTTP API (it scrapes every
second with the operator token). Everything runs under DIR (default: a temporary directory).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "servers"), str(ROOT / "sdk"), str(ROOT)]

import dssst1  # noqa: E402
from arctic_sdk import AsyncClient, rollouts  # noqa: E402
from arctic_servers.serving.serve import free_port  # noqa: E402

OPERATOR = "operator-secret"
JOB = {
    "sub_job_configs": [
        {"job_type": "training", "model_name": "fake-model"},
        {"job_type": "sampling", "model_name": "fake-model"},
    ]
}


def last_minute(x: str) -> str:
    """How much counter `x` grew in the last minute, a series new in that minute from 0
    (`increase()` misses the first increment of a series it had never seen)."""
    return f"({x} - ({x} offset 1m or {x} * 0))"


FB_REFUSED = 'arctic_calls_total{op="forward-backward",code!="ok"}'
FB_ENDED = 'arctic_requests_total{op="forward-backward",code!="ok"}'
WAIT = "arctic_request_queue_wait_seconds"
FB_BUCKETS = WAIT + '_bucket{op="forward-backward"}'
QUESTIONS = {
    "forward-backwards that failed in the last minute, by code (refused at the door)":
        f"sum by (code) {last_minute(FB_REFUSED)}",
    "forward-backwards that ran and did not complete in the last minute, by code":
        f"sum by (code) {last_minute(FB_ENDED)}",
    "mean queue wait of the last minute, by op (seconds)":
        f"sum by (op) {last_minute(WAIT + '_sum')} / sum by (op) {last_minute(WAIT + '_count')}",
    "p90 queue wait of the last minute, forward-backward (seconds)":
        f"histogram_quantile(0.9, sum by (le) {last_minute(FB_BUCKETS)})",
    "the last weight sync: seconds": "arctic_job_last_weight_sync_seconds",
    "the last weight sync: bytes": "arctic_job_last_weight_sync_bytes",
}  # fmt: skip


async def workload(base_url: str) -> None:
    async with AsyncClient(base_url, token="pat-1") as client:
        await client.create_job(JOB)
        await client.wait_until_running(timeout=120)
        out = await client.generate(prompts=["a", "b"], sampling_params={"n": 2, "max_tokens": 8})
        frame = rollouts.forward_backward_frame(
            rollouts.from_generate(out), np.linspace(-1, 1, 4, dtype=np.float32), loss_fn="grpo"
        )
        # two forward-backwards submitted together: the second waits for the first (queue)
        runs = [client.submit_forward_backward(frame), client.submit_forward_backward(frame)]
        await asyncio.gather(*runs)
        url = f"{base_url}/api/v2/databases/d/schemas/s/cortex-training"
        headers = {"Authorization": "Bearer pat-1", "Content-Type": "application/octet-stream"}

        def post(job: str, body: Any) -> requests.Response:
            return requests.post(
                f"{url}/{job}/forward-backward", data=dssst1.dumps(body), headers=headers
            )

        # refused at the door: a field cross_entropy does not read; a job that does not exist
        bad = dict(frame, processing={"loss_fn": "cross_entropy"})
        for r in (post(str(client.job_id), bad), post("no-such-job", frame)):
            print(f"refused: HTTP {r.status_code} [{r.json()['error']['code']}]"
                  f" X-Request-Id {r.headers['X-Request-Id']}")  # fmt: skip
        # accepted (202), then cancelled while it runs
        r = post(str(client.job_id), frame)
        rid = r.json()["request_id"]
        await client.cancel_request(request_id=rid)
        print(f"cancelled: request {rid} (HTTP {r.status_code} when submitted)")
        await client.step(learning_rate=1e-3)
        sync = await client.sync_weights()
        print(f"sync_weights: {sync}")


async def end_job(base_url: str) -> None:
    async with AsyncClient(base_url, token="pat-1") as client:
        for job in (await client.list_jobs())["jobs"]:
            if job["state"] == "running":
                await client.cancel_job(job_id=job["job_id"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="arctic-metrics-"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokens").write_text("pat-1\n")
    (out / "operators").write_text(OPERATOR + "\n")
    port = free_port()
    gw = subprocess.Popen(
        [sys.executable, "-m", "arctic_servers.gateway", "--db", str(out / "state.db"),
         "--tokens-file", str(out / "tokens"), "--metrics-token-file", str(out / "operators"),
         "--port", str(port), "--engine", "fake", "--answer-mode", "async", "--no-grpc",
         "--fake-latency", "forward_backward=3", "--ready-file", str(out / "ready.json")],
        stdout=(out / "gateway.log").open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    prom = None
    base = f"http://127.0.0.1:{port}"
    try:
        while not (out / "ready.json").exists():
            assert gw.poll() is None, (out / "gateway.log").read_text()
            time.sleep(0.05)
        binary = shutil.which("prometheus")
        if binary:
            pport = free_port()
            (out / "prometheus.yml").write_text(
                "scrape_configs:\n  - job_name: gateway\n    scrape_interval: 1s\n"
                f"    authorization: {{credentials: {OPERATOR}}}\n"
                f"    static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n"
            )
            prom = subprocess.Popen(
                [binary, f"--config.file={out / 'prometheus.yml'}",
                 f"--storage.tsdb.path={out / 'tsdb'}", f"--web.listen-address=127.0.0.1:{pport}"],
                stdout=(out / "prometheus.log").open("wb"), stderr=subprocess.STDOUT,
            )  # fmt: skip
        asyncio.run(workload(base))
        time.sleep(3)  # a few scrapes after the workload
        text = requests.get(
            base + "/metrics", headers={"Authorization": f"Bearer {OPERATOR}"}, timeout=10
        ).text
        (out / "metrics.txt").write_text(text)
        print(f"\n$ curl -H 'Authorization: Bearer ...' {base}/metrics   ({out / 'metrics.txt'})")
        keep = ("forward-backward", "arctic_job_last", "arctic_job_weight", "arctic_jobs{")
        for line in text.splitlines():
            if any(k in line for k in keep) and "_bucket" not in line and "http_" not in line:
                print(line)
        if prom is not None:
            print(f"\nPrometheus {binary} (scraping every 1 s), /api/v1/query:")
            for what, expr in QUESTIONS.items():
                r = requests.get(
                    f"http://127.0.0.1:{pport}/api/v1/query", params={"query": expr}, timeout=10
                ).json()
                print(f"\n# {what}\n{expr}")
                for row in r["data"]["result"]:
                    labels = {k: v for k, v in row["metric"].items() if k not in ("instance",)}
                    print(f"  {labels} => {row['value'][1]}")
        return 0
    finally:
        if gw.poll() is None:
            asyncio.run(end_job(base))  # the gateway stops the job's worker hosts
            time.sleep(2)
        for p in (prom, gw):
            if p is not None:
                p.terminate()
                p.wait(30)


if __name__ == "__main__":
    sys.exit(main())
