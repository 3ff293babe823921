"""Command line of the hostile-input runner; exit status 1 when any attack found a hole."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from .attacks import ATTACKS, Target, run_all


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m conformance.hostile", description=__doc__)
    ap.add_argument("--target", required=True, help="the server's prefix URL")
    ap.add_argument("--grpc", default="", help="host:port of its gRPC endpoint ('' = HTTP only)")
    ap.add_argument("--token", required=True, help="a token of the server")
    ap.add_argument("--alt-token", required=True, help="a second token (the attacker)")
    ap.add_argument("--job-config", type=Path, help="CreateJob body of the jobs (JSON file)")
    ap.add_argument("--server-pid", type=int, default=0, help="a local server's pid (memory)")
    ap.add_argument("--openai", default="", help="the root URL of its OpenAI routes")
    ap.add_argument("--only", action="append", choices=sorted(ATTACKS), help="attack classes")
    args = ap.parse_args(argv)
    job = {
        "sub_job_configs": [
            {"job_type": "training", "model_name": "fake-model"},
            {"job_type": "sampling", "model_name": "fake-model"},
        ]
    }
    if args.job_config:
        job = json.loads(args.job_config.read_text())
    target = Target(
        args.target, args.token, args.alt_token, job, args.grpc, args.server_pid, args.openai
    )
    holes = 0
    for f in run_all(target, args.only):
        holes += not f.ok
        print(
            f"{'ok  ' if f.ok else 'HOLE'} {f.transport:5} {f.attack}"
            + (f": {f.problem}" if f.problem else ""),
            flush=True,
        )
    print(f"{holes} holes" if holes else "no holes found")
    return 1 if holes else 0


if __name__ == "__main__":
    sys.exit(main())
