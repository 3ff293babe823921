"""The conformance suite (`python -m conformance`) against the on-prem server, over HTTP and gRPC.

Every required case must pass (recommended ones are reported only). The cases' jobs run the
embedded tiny model (`conformance/job.json`); known failures are listed, with their reason, in
`conformance/known_failing.txt` (the runner fails on a listed case that passes, so the list
cannot go stale).

HTTP runs every case, the `openai/*` group on the OpenAI routes included (about 10 s of the
engines: forced tool calls through vLLM's structured outputs, sessions, `max_tokens` rules and
the fields the server refuses by name). gRPC runs every case on the shared job, and of the
cases that create jobs of their own (each a real DeepSpeed trainer and vLLM sampler: ~20 s of
CPU here, most of this test's time) only `GRPC_OWN_JOB_CASES`: the job control plane's RPCs
over gRPC on these engines. The others' job logic is the protocol core's, which both
transports share; they run over gRPC against the gateway's and the fake's servers
(tests/gateway/test_conformance.py, tests/conformance) and over HTTP here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from conformance.runner.model import load_cases

from .conftest import LIMIT_ARGS, ROOT, ServerInfo, start_server, stop_server

pytestmark = pytest.mark.slow
HERE = Path(__file__).parent / "conformance"
OWN_JOB_CASES = sorted(
    c.id for c in load_cases() if c.job == "fresh" or any(s.kind == "create_job" for s in c.steps)
)
# create, get, list and cancel over gRPC; a sequenced call on a fresh gRPC-created job
GRPC_OWN_JOB_CASES = ("jobs/lifecycle/states-in-order", "sequencing/out-of-order-arrival")


@pytest.fixture(scope="module")
def onprem(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerInfo]:
    """A server of this module's own (the conftest's is the session's): the suite needs nothing
    of the shared one, and under pytest-xdist this module runs on a worker of its own
    (tests/conftest.py), where a session server would stay resident to the end of the run."""
    srv = start_server(tmp_path_factory.mktemp("onprem-conformance"), *LIMIT_ARGS)
    try:
        yield srv
    finally:
        stop_server(srv)


def test_grpc_own_job_subset_names_cases_that_exist() -> None:
    assert set(GRPC_OWN_JOB_CASES) <= set(OWN_JOB_CASES), GRPC_OWN_JOB_CASES
    assert 5 <= len(OWN_JOB_CASES) <= 25, OWN_JOB_CASES


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_conformance_suite(onprem: ServerInfo, transport: str, tmp_path: Path) -> None:
    out = tmp_path / f"conformance-{transport}.json"
    env = dict(os.environ)
    env.pop("PYTHONWARNINGS", None)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "conformance",
            "--target",
            onprem.prefix_url,
            "--transport",
            transport,
            "--job-config",
            str(HERE / "job.json"),
            "--known-failing",
            str(HERE / "known_failing.txt"),
            "--json",
            str(out),
            *(
                a
                for case in OWN_JOB_CASES
                if transport == "grpc" and case not in GRPC_OWN_JOB_CASES
                for a in ("--skip", case)
            ),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    report = json.loads(out.read_text()) if out.exists() else {}
    print(f"\nconformance over {transport}: {report.get('counts')}")
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    if transport == "http":  # the OpenAI routes (features.openai) ran on the real engines
        openai = {c["id"]: c["outcome"] for c in report["cases"] if c["id"].startswith("openai/")}
        # the server runs without tokens here: the case about another token's session skips
        assert openai.pop("openai/sessions/other-token-not-found") == "skip", openai
        assert len(openai) >= 20 and set(openai.values()) == {"pass"}, openai
