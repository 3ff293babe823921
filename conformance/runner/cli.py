"""`python -m conformance --target URL ...`: select cases, run them, report, exit.

Exit status: 0 when every required case passed (recommended failures are reported only);
1 when a required case failed, a case errored, or a known-failing entry is stale (its case passed,
or it names no case); 2 when nothing ran (no case selected or applicable, or setup failed).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TextIO

import yaml  # type: ignore[import-untyped,unused-ignore]

from .engine import REFUSED_NOTE, CaseResult, CaseRun
from .model import Case, load_cases, matches
from .report import Report, print_report, write_json, write_junit
from .session import RunConfig, Session, SetupError
from .values import CaseDataError


def read_known_failing(path: Path) -> list[str]:
    """One case id or glob per line; `#` starts a comment."""
    out = []
    for line in path.read_text().splitlines():
        entry = line.split("#", 1)[0].strip()
        if entry:
            out.append(entry)
    return out


def select(cases: Sequence[Case], only: Sequence[str], skip: Sequence[str]) -> list[Case]:
    picked = [c for c in cases if not only or matches(c.id, only)]
    return [c for c in picked if not matches(c.id, skip)]


def run_suite(
    cfg: RunConfig,
    cases: Sequence[Case],
    *,
    known_failing: Sequence[str] = (),
    all_ids: Sequence[str] | None = None,
    on_result: Any = None,
    fail_fast: bool = False,
    notice: Any = None,
) -> Report:
    """Run `cases` against `cfg.target` (cases in order; the shared job is created once).

    `on_result(result, index, total)` is called as each case finishes; `fail_fast` stops after
    the first result that fails the run (the cases left are counted in `report.not_run`);
    `notice(text)` shows progress while the run waits (a pending job's reason)."""
    session = Session(cfg, notice)
    report = Report(cfg.transport, session.prefix, [])
    known = [k for k in known_failing]
    ids = list(all_ids) if all_ids is not None else [c.id for c in cases]
    report.stale_entries = [k for k in known if not any(matches(i, [k]) for i in ids)]
    try:
        session.start()
    except SetupError as exc:
        report.setup_error = str(exc)
        session.close()
        return report
    report.capabilities = session.capabilities
    with ThreadPoolExecutor(max_workers=4, thread_name_prefix="conformance") as pool:
        try:
            for index, case in enumerate(cases, 1):
                result = CaseRun(session, case, pool).run()
                result = _known(result, known)
                report.results.append(result)
                if on_result is not None:
                    on_result(result, index, len(cases))
                if fail_fast and report.blocking():
                    report.not_run = len(cases) - index
                    break
        finally:
            report.cleanup_problems = session.cleanup()
            session.close()
    return report


def _known(result: CaseResult, known: Sequence[str]) -> CaseResult:
    if not known or not matches(result.case.id, known):
        return result
    if result.outcome in ("fail", "error"):
        result.outcome = "xfail"
    elif result.outcome == "pass":
        result.outcome = "xpass"
        result.difference = "listed as known-failing, but it passed: remove the stale entry"
    return result


EPILOG = """\
the fake gateway (the reference server) runs with:
  python -m conformance serve [--token T] [--port 0] ...   (python -m conformance serve --help)
it prints its prefix URL, to pass as --target.

Each case is printed to stderr as it finishes; the table and the failures follow at the end.
"""


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m conformance",
        description="Run the arctic.v1 conformance suite against a server (conformance/README.md).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--target",
        help="the server's prefix URL, {base}/api/v2/databases/DB/schemas/S/ENDPOINT "
        "(a bare http://host:port gets a default prefix); required unless --list",
    )
    ap.add_argument("--transport", choices=("http", "grpc"), default="http")
    ap.add_argument(
        "--grpc-target",
        help="HOST:PORT of the gRPC endpoint (default: the "
        "capabilities' grpc_port on the target's host)",
    )
    ap.add_argument("--token", help="a PAT the server accepts (enables the auth cases)")
    ap.add_argument("--alt-token", help="a second accepted PAT (jobs are per token)")
    ap.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="PATTERN",
        help="run only matching case ids (glob; a plain id also matches as a prefix)",
    )
    ap.add_argument("--skip", action="append", default=[], metavar="PATTERN")
    ap.add_argument(
        "--known-failing",
        type=Path,
        metavar="FILE",
        help="case ids / globs that must fail (one a line, # comments)",
    )
    ap.add_argument("--junit", type=Path, metavar="OUT.xml")
    ap.add_argument("--json", type=Path, metavar="OUT.json")
    ap.add_argument(
        "--job-config",
        type=Path,
        metavar="FILE",
        help="CreateJob body (JSON or YAML) of the jobs the suite creates",
    )
    ap.add_argument("--job-id", help="run the shared-job cases in this existing job")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per call and per poll")
    ap.add_argument(
        "--job-timeout",
        type=float,
        default=600.0,
        help="seconds a created job may take to reach running",
    )
    ap.add_argument(
        "--max-wait",
        type=float,
        default=10.0,
        help="the longest server timer a case may wait for (sequence gap timeout)",
    )
    ap.add_argument(
        "--no-admin", action="store_true", help="never use the fake gateway's /_admin API"
    )
    ap.add_argument("--cases", type=Path, help="a directory of case files (default: built in)")
    ap.add_argument(
        "--vectors",
        type=Path,
        help="the golden vectors (default: the installed copy, or tests/vectors of a checkout)",
    )
    ap.add_argument(
        "--fail-fast",
        action="store_true",
        help="stop at the first case that fails the run (required failure, error, stale entry)",
    )
    ap.add_argument("--list", action="store_true", help="list the selected cases and exit")
    ap.add_argument("-v", "--verbose", action="store_true", help="also list skipped cases")
    return ap


def config_from(args: argparse.Namespace) -> RunConfig:
    job_config = None
    if args.job_config is not None:
        job_config = yaml.safe_load(args.job_config.read_text())
    return RunConfig(
        target=args.target,
        transport=args.transport,
        token=args.token,
        alt_token=args.alt_token,
        grpc_target=args.grpc_target,
        job_id=args.job_id,
        job_config=job_config,
        admin=False if args.no_admin else None,
        timeout=args.timeout,
        job_timeout=args.job_timeout,
        max_wait=args.max_wait,
    )


def progress_printer(stream: TextIO, verbose: bool = False) -> Any:
    """An `on_result` that prints one line per finished case (skipped ones with -v only)."""

    def show(result: CaseResult, index: int, total: int) -> None:
        if result.outcome == "skip" and not verbose:
            return
        width = len(str(total))
        line = f"[{index:>{width}}/{total}] {result.outcome:<5} {result.case.id} "
        line += f"({result.duration:.2f} s)"
        if result.outcome != "pass" and result.difference:
            line += f": {_short(result.difference)}"
        refused = [n for n in result.notes if n.startswith(REFUSED_NOTE)]
        if result.outcome == "pass" and refused:  # an `or_refuses` case the server refused
            line += f": {_short(refused[0])}"
        stream.write(line + "\n")
        stream.flush()

    return show


def _short(text: str, width: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def main(
    argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    ap = parser()
    args = ap.parse_args(argv)
    if not args.target and not args.list:
        ap.error("the following arguments are required: --target")
    try:
        cases = load_cases(args.cases, args.vectors)
    except CaseDataError as exc:
        out.write(f"case data error: {exc}\n")
        return 2
    selected = select(cases, args.only, args.skip)
    if args.list:
        for c in selected:
            out.write(f"{c.id}\t{c.tier}\t{','.join(c.transports)}\t{c.title}\n")
        return 0
    known = read_known_failing(args.known_failing) if args.known_failing else []
    report = run_suite(
        config_from(args),
        selected,
        known_failing=known,
        all_ids=[c.id for c in cases],
        on_result=progress_printer(err, args.verbose),
        fail_fast=args.fail_fast,
        notice=lambda text: print(f"  … {text}", file=err, flush=True),
    )
    print_report(report, out, verbose=args.verbose)
    if args.junit:
        write_junit(report, args.junit)
    if args.json:
        write_json(report, args.json)
    return report.exit_code()


def dump(report: Report) -> str:
    from .report import as_json

    return json.dumps(as_json(report), indent=2)
