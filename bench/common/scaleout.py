"""What the scale-out benchmarks share (`bench/weight_sync.py`, `bench/real_size.py`): the servers
they run (an on-prem server on this host; a gateway whose trainer and sampler sit on two Ray
nodes of a local cluster, `arctic_servers.gateway.ray_local`), the processes' memory (resident
set and its peak, reset before a measured call: /proc/PID/clear_refs), and the calls they time.

Peak memory is the kernel's high-water mark of a process's resident set (VmHWM): writing "5"
to /proc/PID/clear_refs resets it to the current resident set, so the peak after a call, less
the resident set before it, is the extra memory the call took at its worst.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from .bench_servers import _start, stop, uptime
from .proc_cpu import new_mark
from .sampling_paths import TOKEN

__all__ = ["Server", "proc_mem", "reset_peak", "servers", "uptime"]

GiB = 1 << 30


def _status(pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                out[k] = int(v.split()[0]) * 1024
    return out


def proc_mem(pid: int) -> dict[str, int]:
    """{"rss": bytes, "peak": bytes} of a live process (0 when it is gone)."""
    st = _status(pid)
    return {"rss": st.get("VmRSS", 0), "peak": st.get("VmHWM", 0)}


def reset_peak(pid: int) -> int:
    """Reset the process's peak to its resident set; that resident set."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    return proc_mem(pid)["rss"]


@dataclass
class Server:
    """One running server (on-prem, or a gateway over a Ray cluster) and its processes."""

    kind: str  # "onprem" | "gateway"
    info: dict[str, Any]
    proc: subprocess.Popen[bytes]
    tmp: Path
    nodes: int = 1
    pids: dict[str, int] = field(default_factory=dict)  # "server", then a role per worker

    @property
    def base_url(self) -> str:
        return str(self.info["base_url"])

    def client(self, **kw: Any) -> Any:
        from arctic_sdk import AsyncClient

        return AsyncClient(self.base_url, token=TOKEN, timeout=3600, request_timeout=3600, **kw)

    def workers(self, job: str) -> list[dict[str, Any]]:
        admin = self.info.get("admin_url") or f"{self.base_url}/_admin"  # (the gateway's)
        auth = {"Authorization": f"Bearer {TOKEN}"}
        r = requests.get(f"{admin}/jobs/{job}", headers=auth, timeout=60)
        r.raise_for_status()
        return list(r.json()["workers"])

    def track(self, job: str) -> dict[str, int]:
        """The pids whose memory the benchmark reads: the server and each of the job's workers
        (a role, or `sub_job_id` when several share one)."""
        pids = {"server": self.proc.pid}
        for w in self.workers(job):
            name = str(w.get("role") or str(w.get("sub_job_id", "")).split(":")[1])
            pids[name] = int(w["pid"])
        self.pids = pids
        return pids

    def reset_peaks(self) -> dict[str, int]:
        return {k: reset_peak(p) for k, p in self.pids.items()}

    def extra_peaks(self, before: dict[str, int]) -> dict[str, int]:
        """Each process's peak since `reset_peaks`, less its resident set then."""
        return {k: max(0, proc_mem(p)["peak"] - before.get(k, 0)) for k, p in self.pids.items()}

    def peaks(self) -> dict[str, int]:
        return {k: proc_mem(p)["peak"] for k, p in self.pids.items()}


def _argv(kind: str, tmp: Path, threads: int, extra: list[str]) -> list[str]:
    py = [sys.executable, "-m"]
    if kind == "onprem":
        return [*py, "arctic_servers.onprem", "serve", "--threads", str(threads),
                "--prewarm=", "--data-dir", f"{tmp}/d", "--admin", "--port", "0", "--no-grpc",
                *extra]  # fmt: skip
    return [*py, "arctic_servers.gateway", "--db", f"{tmp}/gw.sqlite", "--engine", "onprem",
            "--worker-threads", str(threads), "--answer-mode", "inline", "--data-dir",
            f"{tmp}/gw", "--admin", "--port", "0", "--no-grpc", "--gpus", "4", *extra]  # fmt: skip


@contextlib.contextmanager
def servers(
    kind: str,
    tmp: Path,
    *,
    threads: int = 1,
    two_nodes: bool = False,
    ray_gpus: int = 0,
    extra: list[str] = (),
) -> Iterator[Server]:
    """An on-prem server, or a gateway; `two_nodes`: the gateway over a local Ray cluster of
    two nodes, the trainer on one and the samplers on the other (`--ray-resources`);
    `ray_gpus`: over a one-node cluster with that many GPUs (each actor gets its own)."""
    tmp.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        args = list(extra)
        if kind == "gateway" and (two_nodes or ray_gpus):
            from arctic_servers.gateway.ray_local import local_ray_cluster

            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            os.environ["ARCTIC_GATEWAY_RAY_BIND"] = "127.0.0.1"
            if two_nodes:
                nodes = [
                    {"num_cpus": 2, "resources": {"trainer_node": 2}},
                    {"num_cpus": 2, "resources": {"sampler_node": 2}},
                ]
                args += ["--ray-resources", "training=trainer_node:1",
                         "--ray-resources", "sampling=sampler_node:1"]  # fmt: skip
            else:
                nodes = [{"num_cpus": 4, "num_gpus": ray_gpus}]
            address, _ = stack.enter_context(local_ray_cluster(nodes))
            args += ["--ray-address", address]
        proc, info = _start(_argv(kind, tmp, threads, args), tmp, kind, new_mark())
        try:
            yield Server(kind, info, proc, tmp, 2 if two_nodes else 1)
        finally:
            stop(proc)


def job_body(model: str, *, lora: dict[str, Any] | None = None, dtype: str = "float32",
             optimizer: str = "sgd") -> dict[str, Any]:  # fmt: skip
    """A training + sampling job on `model` (fp32, ZeRO-0: no optimizer copy of the weights;
    SGD by default: the sync benchmark needs the weights to move, not Adam's 4 bytes x 2 per
    parameter of state)."""
    training: dict[str, Any] = {
        "zero_stage": 0,
        "gradient_clipping": 1.0,
        "optimizer": {"name": optimizer, "lr": 1e-3, "weight_decay": 0.0},
    }
    if lora is not None:
        training["lora"] = lora
    return {
        "sub_job_configs": [
            {
                "job_type": "training",
                "model_name": model,
                "dtype": dtype,
                "training_config": training,
            },
            {"job_type": "sampling", "model_name": model, "dtype": dtype},
        ],
        "experiment_name": "bench-scaleout",
    }


async def timed(coro: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    res = await coro
    return res, time.perf_counter() - t0


def gib(n: float) -> str:
    return f"{n / GiB:.2f}"


def write_json(path: Path | None, doc: dict[str, Any]) -> None:
    if path is not None:
        path.write_text(json.dumps(doc, indent=1, default=str))
        print(f"wrote {path}")
