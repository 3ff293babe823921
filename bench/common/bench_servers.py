"""The concurrency benchmark's servers: start one (on-prem or gateway, marked for `proc_cpu`),
stop it, and read its sampling worker's busy-period lines (`bench/concurrency.py`)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .proc_cpu import MARK_VAR, new_mark
from .sampling_paths import TOKEN


def uptime() -> str:
    """The load averages (1, 5, 15 min), as `uptime` prints them."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def _start(
    argv: list[str], tmp: Path, name: str, mark: str
) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    ready = tmp / f"{name}.ready.json"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(sys.path[:3]),
        "ARCTIC_GATEWAY_TOKENS": TOKEN,
        MARK_VAR: mark,  # its workers inherit it: their CPU is read by it (proc_cpu.py)
    }
    env.pop("PYTHONWARNINGS", None)
    with (tmp / f"{name}.log").open("wb") as log:
        proc = subprocess.Popen(
            [*argv, "--ready-file", str(ready)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 180
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError((tmp / f"{name}.log").read_text(errors="replace")[-3000:])
        time.sleep(0.05)
    return proc, json.loads(ready.read_text())


def start(
    server: str, tmp: Path, threads: int, db_dir: Path | None = None, mark: str = ""
) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    if server == "onprem":
        args = f"arctic_servers.onprem serve --threads {threads} --prewarm= --data-dir {tmp}/d"
    else:
        args = (
            f"arctic_servers.gateway --db {db_dir or tmp}/gw.sqlite --engine onprem "
            f"--worker-threads {threads} --answer-mode inline --data-dir {tmp}/gw"
        )
    argv = [sys.executable, "-m", *args.split(), "--port", "0", "--grpc-port", "0"]
    return _start(argv, tmp, server, mark or new_mark())


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, 9)  # workers left in its session


async def engine_log(client: Any, cursor: int) -> tuple[list[str], int]:
    """The sampling worker's log lines from `cursor` (tail-logs), and the next cursor."""
    lines: list[str] = []
    while True:
        res = await client.operation(
            operation_type="tail-logs",
            sub_job_type="sampling",
            payload={"cursor": cursor + len(lines), "limit": 1000},
        )
        page = res.get("result", res)
        lines += [str(e) for e in page["entries"]]
        if page["eof"] or not page["entries"]:
            return lines, cursor + len(lines)


def busy_periods(lines: list[str]) -> list[tuple[int, int, int]]:
    """(calls, engine steps, most requests in the engine at once) of each busy-period line."""
    from arctic_servers.engines.vllm.engine_batch import IDLE_MARK

    pat = re.compile(IDLE_MARK + r" (\d+) calls .* in (\d+) engine steps, .* at most (\d+) ")
    return [(int(m[1]), int(m[2]), int(m[3])) for ln in lines if (m := pat.search(ln))]
