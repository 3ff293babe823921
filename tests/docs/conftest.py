"""The fake-engine gateway the docs' `server` snippets run against, and the session's report of
the blocks that were not run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from arctic_sdk import Client

TOKEN = "my-pat"  # the token the docs' snippets use
NOT_RUN: dict[str, str] = {}  # block id -> reason, filled by test_snippets


@dataclass(frozen=True)
class DocServer:
    base_url: str  # http://127.0.0.1:PORT

    @property
    def host_port(self) -> str:
        return self.base_url.split("://", 1)[1]


@pytest.fixture(scope="session")
def doc_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DocServer]:
    """`python -m arctic_servers.gateway --engine fake` on free ports, token `my-pat`; every job
    still running at the end is cancelled (its worker processes outlive the gateway)."""
    d = tmp_path_factory.mktemp("doc-gateway")
    (d / "tokens.txt").write_text(TOKEN + "\n")
    ready = d / "ready.json"
    log = (d / "gateway.log").open("w")
    argv = [sys.executable, "-m", "arctic_servers.gateway", "--engine", "fake"]
    argv += ["--db", str(d / "gw.db"), "--tokens-file", str(d / "tokens.txt"), "--port", "0"]
    argv += ["--grpc-port", "0", "--data-dir", str(d / "data"), "--ready-file", str(ready)]
    proc = subprocess.Popen(argv, cwd=d, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while not (ready.exists() and ready.read_text().strip()):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"the docs' gateway did not start:\n{(d / 'gateway.log').read_text()}"
                )
            time.sleep(0.2)
        server = DocServer(json.loads(ready.read_text())["base_url"])
        yield server
        with Client(server.base_url, token=TOKEN) as client:
            for job in client.list_jobs().get("jobs", []):
                if job.get("state") not in ("cancelled", "failed", "terminated"):
                    client.cancel_job(job_id=job["job_id"])
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if NOT_RUN:
        terminalreporter.section("doc snippets not run (marked `not run`)")
        for block, reason in sorted(NOT_RUN.items()):
            terminalreporter.line(f"{block}: {reason}")


def snippet_env() -> dict[str, str]:
    env = dict(os.environ)
    env["TINKER_TELEMETRY"] = "0"
    env.pop("PYTHONPATH", None)  # the installed package, as a user has it
    return env


def scratch(tmp_path: Path) -> Path:
    d = tmp_path / "scratch"
    d.mkdir()
    return d
