"""Bounded load test of the Cortex gateway on loopback, with fake workers.

    python bench/gateway_load.py            # 8 drivers x 50 requests (servers/GATEWAY.md)
    python bench/gateway_load.py --smoke    # 2 drivers x 6 requests; CI runs it (no thresholds)

It starts `python -m arctic_servers.gateway --engine fake` on a fresh SQLite file in a temporary
directory; each driver creates its own job (one training sub-job = one worker process) and sends
its requests one after another in its own sequence order — forward-backward (a DSSST1 chunk
group, [4, 128] int64) and keyed steps, alternately — waiting for each one's terminal answer
(202 + polls, or 200 inline). Latency is from the first byte sent to the terminal answer.
Afterwards every request must have ended `completed`, and each worker must have executed every
request id exactly once and applied exactly the job's steps ("every request answered once").
Prints one JSON line: p50 / p99 latency, throughput, and the counts. Loopback only, bounded
in count and time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "sdk"), str(ROOT / "servers")]

import dssst1  # noqa: E402
from arctic_sdk.spec.model import MethodInfo  # noqa: E402
from arctic_sdk.spec.tables import methods as M  # noqa: E402
from bench.common.fake_gateway import fake_gateway  # noqa: E402

TOKEN = "bench-token"
TERMINAL = ("completed", "failed", "cancelled")


class Driver:
    def __init__(self, session: aiohttp.ClientSession, base: str, n: int, idx: int) -> None:
        self.s = session
        self.base = base
        self.prefix = base + "/api/v2/databases/bench/schemas/bench/cortex-training"
        self.n = n
        self.idx = idx
        self.h = {"Authorization": f"Bearer {TOKEN}"}
        self.job = ""
        self.latencies: list[float] = []
        self.request_ids: list[str] = []
        self.steps = 0

    def url(self, method: MethodInfo) -> str:
        """The URL of a job-scoped op of this driver's job (the method table's route)."""
        return self.prefix + method.http_path.replace("{job_id}", self.job)

    async def create(self) -> None:
        body = {"sub_job_configs": [{"job_type": "training", "model_name": "fake"}]}
        async with self.s.post(self.prefix + "/", json=body, headers=self.h) as r:
            self.job = (await r.json())["job_id"]
        while True:
            async with self.s.get(f"{self.prefix}/{self.job}", headers=self.h) as r:
                job = (await r.json())["job"]
            if job["state"] == "running":
                return
            if job["state"] in ("failed", "cancelled", "terminated"):
                raise SystemExit(f"job {self.job}: {job['state']} {job['reason']}")
            await asyncio.sleep(0.05)

    async def _answer(self, r: aiohttp.ClientResponse) -> dict[str, Any]:
        if r.status not in (200, 202):
            raise SystemExit(f"driver {self.idx}: HTTP {r.status}: {await r.text()}")
        status: dict[str, Any] = await r.json()
        delay = 0.002
        while status.get("status") not in TERMINAL:
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 0.05)
            url = f"{self.prefix}/{self.job}/requests/{status['request_id']}"
            async with self.s.get(url, headers=self.h) as p:
                status = await p.json()
        return status

    async def run(self) -> None:
        rng = np.random.default_rng(self.idx)
        for i in range(1, self.n + 1):
            headers = dict(self.h, **{"X-Arctic-Seq": str(i)})
            t0 = time.perf_counter()
            if i % 2:
                value = {"kwargs": {"input_ids": rng.integers(3, 250, (4, 128), dtype=np.int64)}}
                chunks = dssst1.encode_chunks(
                    dssst1.dumps(value),
                    kind="request",
                    max_bytes=1 << 20,
                    operation=M.FORWARD_BACKWARD.name,
                    chunk_group_id=str(uuid.uuid4()),
                )
                headers["Content-Type"] = "application/octet-stream"
                url = self.url(M.FORWARD_BACKWARD)
                async with self.s.post(url, data=bytes(chunks[-1]), headers=headers) as r:
                    status = await self._answer(r)
            else:
                headers["Idempotency-Key"] = str(uuid.uuid4())
                url = self.url(M.STEP)
                async with self.s.post(url, json={}, headers=headers) as r:
                    status = await self._answer(r)
                self.steps += 1
            self.latencies.append(time.perf_counter() - t0)
            if status["status"] != "completed":
                raise SystemExit(f"driver {self.idx} request {i}: {status}")
            self.request_ids.append(status["request_id"])

    async def verify(self) -> None:
        async with self.s.get(f"{self.base}/_admin/jobs/{self.job}/stats", headers=self.h) as r:
            stats = (await r.json())["workers"][f"{self.job}:training:0"]
        executed = stats["executed"]
        if sorted(executed) != sorted(self.request_ids) or set(executed.values()) != {1}:
            raise SystemExit(f"driver {self.idx}: not every request ran exactly once: {stats}")
        if stats["applied_steps"] != self.steps:
            raise SystemExit(f"driver {self.idx}: {stats['applied_steps']} steps != {self.steps}")
        async with self.s.post(f"{self.prefix}/{self.job}:cancel", headers=self.h) as r:
            await r.read()


async def load(base: str, drivers: int, requests: int) -> dict[str, Any]:
    conn = aiohttp.TCPConnector(limit=4 * drivers)
    async with aiohttp.ClientSession(connector=conn) as session:
        ds = [Driver(session, base, requests, i) for i in range(drivers)]
        await asyncio.gather(*(d.create() for d in ds))
        t0 = time.perf_counter()
        await asyncio.gather(*(d.run() for d in ds))
        wall = time.perf_counter() - t0
        await asyncio.gather(*(d.verify() for d in ds))
    lat = np.asarray([x for d in ds for x in d.latencies]) * 1000
    return {
        "drivers": drivers,
        "requests_per_driver": requests,
        "requests": int(lat.size),
        "answered_once": True,
        "p50_ms": round(float(np.percentile(lat, 50)), 2),
        "p99_ms": round(float(np.percentile(lat, 99)), 2),
        "max_ms": round(float(lat.max()), 2),
        "throughput_rps": round(lat.size / wall, 1),
        "wall_s": round(wall, 2),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="2 drivers x 6 requests")
    ap.add_argument("--drivers", type=int, default=8)
    ap.add_argument("--requests", type=int, default=50)
    args = ap.parse_args(argv)
    drivers, n = (2, 6) if args.smoke else (args.drivers, args.requests)
    with (
        tempfile.TemporaryDirectory(prefix="gw-load-") as d,
        fake_gateway(
            Path(d), TOKEN, ["--gpus", "64", "--admin", "--max-inflight-per-token", "0"], 60
        ) as base,
    ):
        result = asyncio.run(asyncio.wait_for(load(base, drivers, n), 600))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
