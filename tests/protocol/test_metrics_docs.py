"""servers/METRICS.md lists exactly the families the servers expose, and every expression of the
Grafana dashboard (servers/grafana/gateway.json) names only families that exist (and is valid
PromQL, where Debian's `promtool` is installed)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from arctic_servers.gateway.metrics import WorkerHostsCollector
from conformance.fake import BackgroundFake

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "servers" / "METRICS.md"
DASHBOARD = ROOT / "servers" / "grafana" / "gateway.json"
NAME = re.compile(r"\b((?:arctic|process)_[a-z_]+)\b")


def exposed() -> dict[str, str]:
    """Family name as documented (counters with `_total`) -> its type, from a live registry: the
    fake's core, with the gateway's own collector added."""
    with BackgroundFake() as fake:
        metrics = fake.server.core.metrics
        stub = SimpleNamespace(supervisor=SimpleNamespace(events={}, client=None), jobs={})
        metrics.add_collector(WorkerHostsCollector(stub))  # type: ignore[arg-type]
        families = list(metrics.registry.collect())
    out: dict[str, str] = {}
    for fam in families:
        name = fam.name + "_total" if fam.type == "counter" else fam.name
        out[name] = fam.type
    return out


def sample_names(families: dict[str, str]) -> set[str]:
    """Every name a query may use: histograms' `_bucket`, `_sum`, `_count` series."""
    names: set[str] = set()
    for name, kind in families.items():
        if kind == "histogram":
            names |= {name + s for s in ("_bucket", "_sum", "_count")}
        else:
            names.add(name)
    return names


def documented() -> set[str]:
    rows = re.findall(r"^\| `([a-z_]+)` \|", DOC.read_text(), flags=re.M)
    assert rows, "no family rows in METRICS.md"
    return set(rows)


def dashboard_exprs() -> list[str]:
    dash: dict[str, Any] = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 10
    return exprs


def test_every_family_is_documented_and_every_row_exists() -> None:
    have = {n for n in exposed() if n.startswith(("arctic_", "process_"))}
    docs = documented()
    assert have - docs == set(), f"families without a row in METRICS.md: {sorted(have - docs)}"
    assert docs - have == set(), f"rows naming no family: {sorted(docs - have)}"


def test_every_dashboard_expression_names_existing_families() -> None:
    names = sample_names(exposed())
    for expr in dashboard_exprs():
        used = set(NAME.findall(expr))
        assert used, expr
        assert used <= names, f"{expr}: {sorted(used - names)} is no family of the servers"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="Debian's promtool is not installed")
def test_every_dashboard_expression_is_valid_promql(tmp_path: Path) -> None:
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:expr{i}", "expr": e.replace("$job", ".*")}
                    for i, e in enumerate(dashboard_exprs())
                ],
            }
        ]
    }
    path = tmp_path / "rules.json"  # YAML is a superset of JSON
    path.write_text(json.dumps(rules))
    out = subprocess.run(
        ["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr
