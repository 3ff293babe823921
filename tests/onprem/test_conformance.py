"""The conformance suite (`python -m conformance`) against the on-prem server, over HTTP and gRPC.

Every required case must pass (recommended ones are reported only). The cases' jobs run the
embedded tiny model (`conformance/job.json`); known failures are listed, with their reason, in
`conformance/known_failing.txt` (the runner fails on a listed case that passes, so the list
cannot go stale).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT, ServerInfo

pytestmark = pytest.mark.slow
HERE = Path(__file__).parent / "conformance"


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
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    counts = json.loads(out.read_text())["counts"] if out.exists() else {}
    print(f"\nconformance over {transport}: {counts}")
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
