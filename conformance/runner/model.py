"""Test cases as data: loading and checking `conformance/cases/*.yaml`.

A case file holds `area`, optional `defaults` (tier, features, transports) and `cases`; a case
has a stable `id` (`<area>/...`), a `tier`, the `features` it needs, the `transports` it runs on,
optional `vars`, `job` (`shared`, `fresh` or `none`) and `steps`. `generate: vectors` in a file
adds the golden-vector family (`vectors.py`). The vocabulary is documented in
conformance/cases/README.md; `load_cases` refuses anything outside it, so a typo in a case file
is an error, not a silently weaker test.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped,unused-ignore]

from arctic_sdk.spec.tables import methods as M

from .matchers import EXPECT_KEYS
from .values import CaseDataError

CASES_DIR = Path(__file__).resolve().parent.parent / "cases"
TIERS = ("required", "recommended")
TRANSPORTS = ("http", "grpc")
JOB_MODES = ("shared", "fresh", "none")
# the step key that keeps a value (a word, not the op)
SAVE = "save"  # not-an-op
CASE_KEYS = frozenset(
    {"id", "title", "spec", "tier", "features", "transports", "vars", "job", "steps", "notes"}
)
STEP_KEYS: dict[str, frozenset[str]] = {
    "call": frozenset(
        {
            "call",
            "job",
            "params",
            "query",
            "headers",
            "auth",
            "body",
            "raw",
            "content_type",
            "content_length",
            "accept",
            "chunks",
            "wait",
            "drain",
            "background",
            SAVE,
            "expect",
            "timeout",
            "http",
            "grpc_path",
            "skip_unless",
            "note",
        }
    ),
    "join": frozenset({"join", "expect", SAVE, "note"}),
    "admin": frozenset({"admin", "job", "expect", SAVE, "note"}),
    "create_job": frozenset(
        {"create_job", "overrides", "wait", "headers", "auth", "expect", SAVE, "note"}
    ),
    "wait_job": frozenset({"wait_job", "state", "timeout", "expect", SAVE, "note"}),
    "sleep": frozenset({"sleep", "note"}),
}
CHUNK_KEYS = frozenset(
    {"count", "order", "corrupt", "group", "operation", "overrides", "crc", "bad_crc"}
)
RAW_KEYS = frozenset({"hex", "text", "frame", "zeros", "frames", "socket"})


@dataclass
class Step:
    kind: str
    spec: dict[str, Any]

    @property
    def op(self) -> str | None:
        return str(self.spec["call"]) if self.kind == "call" else None


@dataclass
class Case:
    id: str
    area: str
    title: str
    tier: str = "required"
    features: tuple[str, ...] = ()
    transports: tuple[str, ...] = TRANSPORTS
    vars: dict[str, Any] = field(default_factory=dict)
    job: str = "shared"
    steps: list[Step] = field(default_factory=list)
    spec: str = ""
    source: str = ""
    covers: tuple[str, ...] = ()  # codes a generated case pins beyond its expectations

    def ops(self) -> set[str]:
        return {s.op for s in self.steps if s.op is not None} | (
            {M.CREATE_JOB.name} if any(s.kind == "create_job" for s in self.steps) else set()
        )

    def codes(self) -> set[str]:
        """Every error code this case expects somewhere."""
        out: set[str] = set(self.covers)
        for s in self.steps:
            for exp in _expects(s.spec.get("expect") or {}):
                for key in ("error", "failed", "fails_with"):
                    if isinstance(exp.get(key), str):
                        out.add(exp[key])
                out.update(exp.get("error_any") or [])
                code = (exp.get("fields") or {}).get("error.code")
                if isinstance(code, Mapping) and isinstance(code.get("eq"), str):
                    out.add(code["eq"])
        return out


def _expects(exp: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [exp, *(exp[t] for t in TRANSPORTS if isinstance(exp.get(t), Mapping))]


def _check_expect(exp: Any, where: str) -> None:
    if not isinstance(exp, Mapping):
        raise CaseDataError(f"{where}: expect must be a mapping")
    unknown = set(exp) - EXPECT_KEYS
    if unknown:
        raise CaseDataError(f"{where}: unknown expect key(s) {sorted(unknown)}")
    for code in [
        exp.get("error"),
        exp.get("failed"),
        exp.get("fails_with"),
        *(exp.get("error_any") or []),
        *(exp.get("not_error") or []),
    ]:
        if code is not None and code not in _codes():
            raise CaseDataError(f"{where}: {code!r} is not an error code of errors.proto")
    for t in TRANSPORTS:
        if t in exp:
            _check_expect(exp[t], f"{where}.{t}")


def _codes() -> frozenset[str]:
    from arctic_sdk.spec.tables.error_codes import ERRORS

    return frozenset(ERRORS)


def _step(raw: Any, where: str) -> Step:
    if not isinstance(raw, Mapping):
        raise CaseDataError(f"{where}: a step must be a mapping")
    kinds = [k for k in STEP_KEYS if k in raw]
    if len(kinds) != 1:
        raise CaseDataError(f"{where}: a step has exactly one of {sorted(STEP_KEYS)}")
    kind = kinds[0]
    unknown = set(raw) - STEP_KEYS[kind]
    if unknown:
        raise CaseDataError(f"{where}: unknown key(s) {sorted(unknown)} for a {kind} step")
    named = kind == "call" and not raw.get("http") and not raw.get("grpc_path")
    if named and raw["call"] not in M.BY_NAME and "${" not in str(raw["call"]):
        raise CaseDataError(f"{where}: {raw['call']!r} is not an op of the method table")
    if isinstance(raw.get("chunks"), Mapping) and set(raw["chunks"]) - CHUNK_KEYS:
        raise CaseDataError(
            f"{where}: unknown chunks key(s) {sorted(set(raw['chunks']) - CHUNK_KEYS)}"
        )
    if isinstance(raw.get("raw"), Mapping) and set(raw["raw"]) - RAW_KEYS:
        raise CaseDataError(f"{where}: unknown raw key(s) {sorted(set(raw['raw']) - RAW_KEYS)}")
    if "expect" in raw:
        _check_expect(raw["expect"], f"{where}.expect")
    return Step(kind, dict(raw))


def parse_case(raw: Mapping[str, Any], area: str, defaults: Mapping[str, Any], source: str) -> Case:
    cid = str(raw.get("id", ""))
    where = f"{source}: case {cid or '?'}"
    unknown = set(raw) - CASE_KEYS
    if unknown:
        raise CaseDataError(f"{where}: unknown key(s) {sorted(unknown)}")
    if not cid.startswith(area + "/"):
        raise CaseDataError(f"{where}: the id must start with {area + '/'!r}")
    merged = {**defaults, **raw}
    tier = str(merged.get("tier", "required"))
    if tier not in TIERS:
        raise CaseDataError(f"{where}: tier {tier!r} is not one of {TIERS}")
    transports = tuple(merged.get("transports") or TRANSPORTS)
    if set(transports) - set(TRANSPORTS):
        raise CaseDataError(f"{where}: transports must be among {TRANSPORTS}")
    job = str(merged.get("job", "shared"))
    if job not in JOB_MODES:
        raise CaseDataError(f"{where}: job {job!r} is not one of {JOB_MODES}")
    steps = [_step(s, f"{where} step {i + 1}") for i, s in enumerate(raw.get("steps") or [])]
    if not steps:
        raise CaseDataError(f"{where}: a case needs at least one step")
    features = tuple(defaults.get("features") or ()) + tuple(raw.get("features") or ())
    return Case(
        id=cid,
        area=area,
        title=str(raw.get("title", "")),
        tier=tier,
        features=features,
        transports=transports,
        vars=dict(merged.get("vars") or {}),
        job=job,
        steps=steps,
        spec=str(raw.get("spec", "")),
        source=source,
    )


def load_file(path: Path, vectors_dir: Path | None) -> list[Case]:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise CaseDataError(f"{path.name}: not valid YAML: {exc}") from None
    if not isinstance(data, Mapping) or "area" not in data:
        raise CaseDataError(f"{path.name}: a case file is a mapping with `area` and `cases`")
    area = str(data["area"])
    defaults = dict(data.get("defaults") or {})
    cases = [parse_case(c, area, defaults, path.name) for c in data.get("cases") or []]
    if data.get("generate") == "vectors":  # not-an-op
        from .vectors import vector_cases

        cases += vector_cases(area, vectors_dir, defaults, path.name)
    return cases


def load_cases(cases_dir: Path | None = None, vectors_dir: Path | None = None) -> list[Case]:
    """Every case of every `*.yaml` file, in file then listing order; ids must be unique."""
    out: list[Case] = []
    seen: dict[str, str] = {}
    for path in sorted((cases_dir or CASES_DIR).glob("*.yaml")):
        for case in load_file(path, vectors_dir):
            if case.id in seen:
                raise CaseDataError(f"duplicate case id {case.id} ({seen[case.id]}, {path.name})")
            seen[case.id] = path.name
            out.append(case)
    return out


def matches(case_id: str, patterns: Iterable[str]) -> bool:
    """Glob patterns (`*` also crosses `/`); a pattern without a glob also matches as a prefix."""
    for p in patterns:
        if fnmatch.fnmatchcase(case_id, p):
            return True
        if not any(ch in p for ch in "*?[") and case_id.startswith(p.rstrip("/") + "/"):
            return True
    return False
