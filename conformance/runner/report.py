"""Reporting a run: the console table, failure details, JUnit XML and JSON.

Outcomes: `pass`, `fail` (a required case: the run fails; a recommended one: reported only),
`skip` (a feature or transport the server does not have), `error` (the case could not run: no
job, bad case data; counts as a failure), `xfail` (listed as known-failing and failed, as
expected), `xpass` (listed as known-failing but passed: a stale entry, the run fails).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from .engine import REFUSED_NOTE, CaseResult

FAILING = ("fail", "error", "xpass")


@dataclass
class Report:
    transport: str
    target: str
    results: list[CaseResult]
    stale_entries: list[str] = field(default_factory=list)  # known-failing lines naming no case
    cleanup_problems: list[str] = field(default_factory=list)
    setup_error: str | None = None
    capabilities: dict[str, Any] = field(default_factory=dict)
    not_run: int = 0  # cases left when --fail-fast stopped the run

    @property
    def ran(self) -> list[CaseResult]:
        return [r for r in self.results if r.outcome != "skip"]

    def blocking(self) -> list[CaseResult]:
        """Results that fail the run."""
        out = []
        for r in self.results:
            if (
                r.outcome == "xpass"
                or r.outcome == "error"
                or (r.outcome == "fail" and r.case.tier == "required")
            ):
                out.append(r)
        return out

    def exit_code(self) -> int:
        if self.setup_error is not None or not self.ran:
            return 2
        return 1 if self.blocking() or self.stale_entries else 0

    def failed_ids(self) -> set[str]:
        """Cases that did not pass (fail, error, xfail), whatever their tier."""
        return {r.case.id for r in self.results if r.outcome in ("fail", "error", "xfail")}

    def counts(self) -> Counter[str]:
        return Counter(r.outcome for r in self.results)


def _cell(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _shown(r: CaseResult) -> str:
    """The table's last column: the first difference, or why a passed case was refused."""
    refused = [n for n in r.notes if n.startswith(REFUSED_NOTE)]
    return r.difference or (refused[0] if r.outcome == "pass" and refused else "")


def print_report(report: Report, out: TextIO, *, verbose: bool = False) -> None:
    rows = report.results if verbose else [r for r in report.results if r.outcome != "skip"]
    w = max([len(r.case.id) for r in rows] + [4])
    out.write(f"arctic.v1 conformance: {report.target} over {report.transport}\n")
    if report.setup_error:
        out.write(f"SETUP ERROR: {report.setup_error}\n")
    out.write(f"{'case':<{w}}  {'tier':<11}  {'outcome':<7}  first difference\n")
    out.write(f"{'-' * w}  {'-' * 11}  {'-' * 7}  {'-' * 40}\n")
    for r in rows:
        out.write(f"{r.case.id:<{w}}  {r.case.tier:<11}  {r.outcome:<7}  {_cell(_shown(r), 110)}\n")
    problems = [r for r in report.results if r.outcome in ("fail", "error", "xpass")]
    if problems:
        out.write("\nFailures:\n")
    for r in problems:
        where = f" (step {r.step})" if r.step else ""
        out.write(f"\n{r.outcome.upper()} {r.case.id} [{r.case.tier}]{where}: {r.case.title}\n")
        if r.case.spec:
            out.write(f"  spec:     {r.case.spec}\n")
        out.write(f"  differs:  {r.difference}\n")
        if r.detail:
            out.write(r.detail.rstrip() + "\n")
    for entry in report.stale_entries:
        out.write(f"\nSTALE known-failing entry {entry!r}: it names no case of the suite\n")
    for problem in report.cleanup_problems:
        out.write(f"\nCLEANUP: {problem}\n")
    c = report.counts()
    out.write(
        f"\n{len(report.results)} cases: {c['pass']} passed, {c['fail']} failed, "
        f"{c['error']} errors, {c['xfail']} known failures, {c['xpass']} stale known "
        f"failures, {c['skip']} skipped\n"
    )
    if report.not_run:
        out.write(f"stopped at the first failure (--fail-fast): {report.not_run} cases not run\n")
    if not report.ran and not report.setup_error:
        out.write("no case ran: the run fails\n")


def junit_xml(report: Report) -> ET.ElementTree:
    root = ET.Element("testsuites", name="arctic.v1 conformance")
    by_area: dict[str, list[CaseResult]] = {}
    for r in report.results:
        by_area.setdefault(r.case.area, []).append(r)
    for area, results in by_area.items():
        c = Counter(r.outcome for r in results)
        suite = ET.SubElement(
            root,
            "testsuite",
            {
                "name": f"{report.transport}.{area}",
                "tests": str(len(results)),
                "failures": str(c["fail"] + c["xpass"]),
                "errors": str(c["error"]),
                "skipped": str(c["skip"] + c["xfail"]),
                "time": f"{sum(r.duration for r in results):.3f}",
            },
        )
        for r in results:
            tc = ET.SubElement(
                suite,
                "testcase",
                {
                    "classname": f"conformance.{report.transport}.{area}",
                    "name": r.case.id,
                    "time": f"{r.duration:.3f}",
                },
            )
            ET.SubElement(tc, "properties").extend(
                [
                    ET.Element("property", name="tier", value=r.case.tier),
                    ET.Element("property", name="outcome", value=r.outcome),
                ]
            )
            text = f"{r.difference}\n{r.detail}".strip()
            if r.outcome in ("fail", "xpass"):
                ET.SubElement(tc, "failure", message=r.difference[:500]).text = text
            elif r.outcome == "error":
                ET.SubElement(tc, "error", message=r.difference[:500]).text = text
            elif r.outcome in ("skip", "xfail"):
                reason = r.difference if r.outcome == "skip" else f"known failing: {r.difference}"
                ET.SubElement(tc, "skipped", message=reason[:500])
    tree = ET.ElementTree(root)
    ET.indent(tree)
    return tree


def write_junit(report: Report, path: Path) -> None:
    junit_xml(report).write(path, encoding="utf-8", xml_declaration=True)


def as_json(report: Report) -> dict[str, Any]:
    return {
        "target": report.target,
        "transport": report.transport,
        "exit_code": report.exit_code(),
        "setup_error": report.setup_error,
        "counts": dict(report.counts()),
        "not_run": report.not_run,
        "stale_entries": report.stale_entries,
        "cleanup_problems": report.cleanup_problems,
        "server": {
            k: report.capabilities.get(k) for k in ("server", "server_version", "spec_version")
        },
        "cases": [
            {
                "id": r.case.id,
                "area": r.case.area,
                "tier": r.case.tier,
                "outcome": r.outcome,
                "difference": r.difference,
                "detail": r.detail,
                "duration_s": round(r.duration, 4),
                "step": r.step,  # not-an-op
                "spec": r.case.spec,
                "notes": list(r.notes),
            }
            for r in report.results
        ],
    }


def write_json(report: Report, path: Path) -> None:
    path.write_text(json.dumps(as_json(report), indent=2) + "\n")
