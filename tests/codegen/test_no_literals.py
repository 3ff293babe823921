"""No op name, legacy alias or route literal outside the generated folders.

Everything per-op is driven by the generated method table (`arctic_sdk.spec.tables.methods`), so
a string constant equal to an op name, an alias or a route is a hand-written copy of the table
that will drift. Scanned: the product code (`sdk/`, `servers/`, `conformance/`, `dssst1/`,
`bench/`); exempt: the generated folders (`generate.managed_dirs`), the compatibility alias table
`sdk/arctic_sdk/compat/aliases.py`, tests and tools. Rules, to stay precise with op names that
are also words ("step", "save", "forward"):

- a constant must equal a name, an alias, or a route exactly (substrings are fine);
- the route `/` is not checked (every path join has one);
- a name that is also a field name of a spec message (`operation`, the chunk descriptor's field)
  is not checked: it names the field far more often than the op;
- a line that ends with the comment `# not-an-op` is exempt (a word that happens to be an op
  name, e.g. DeepSpeed's `client_state={"step": n}`).

Engine (worker) commands named after an op are its `methods.X.python_name`; `/operation` types
are `arctic_servers.rules.operation_types`.

`PENDING` lists literals tolerated for now, by file, in code being written in parallel; their
owners replace them with the table (`methods.X.name`, `.python_name`, `.operation_type`) or move
them to the compatibility table, then delete the entry. New literals fail at once, and an entry
that names no scanned file or a literal no longer there fails too, so the list only shrinks.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import generate
import pytest
from google.protobuf.descriptor import Descriptor

from arctic_sdk.spec.pb.arctic import v1 as pb2
from arctic_sdk.spec.tables import methods

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("sdk", "servers", "conformance", "dssst1", "bench")
ALLOWED_FILES = {
    "sdk/arctic_sdk/compat/aliases.py",
    # DSSST1.md §8 makes the codec itself accept both chunk labels of the deployed writers, and
    # the codec sits below the SDK (it must not import arctic_sdk's generated table).
    "dssst1/_chunks.py",
}
NAMES = {m.name for m in methods.METHODS} | {a for m in methods.METHODS for a in m.aliases}
ROUTES = {m.http_path for m in methods.METHODS} - {"/"}
MARKER = "# not-an-op"
PENDING: dict[str, set[str]] = {}


def _field_names() -> set[str]:
    out: set[str] = set()

    def walk(d: Descriptor) -> None:
        out.update(f.name for f in d.fields)
        for n in d.nested_types:
            walk(n)

    for name in pb2.__all__:
        for d in getattr(pb2, name).DESCRIPTOR.message_types_by_name.values():
            walk(d)
    return out


FIELD_NAMES = _field_names()
GENERATED_DIRS = generate.managed_dirs(generate.Layout())


def _python_files() -> Iterator[Path]:
    for top in SCANNED:
        for p in sorted((ROOT / top).rglob("*.py")):
            rel = p.relative_to(ROOT).as_posix()
            generated = any(rel.startswith(d + "/") for d in GENERATED_DIRS)
            if generated or rel in ALLOWED_FILES or "__pycache__" in p.parts:
                continue
            yield p


def violations(path: Path, root: Path = ROOT) -> list[tuple[str, int, str, str]]:
    """(relative path, line, kind, value) of every literal the rules forbid, in source order."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    out = []
    for node in ast.walk(ast.parse(source, str(path))):
        if not isinstance(node, ast.Constant) or not isinstance(node.value, str):
            continue
        value = node.value
        if value in NAMES and value not in FIELD_NAMES:
            kind = "op name or alias"
        elif value in ROUTES:
            kind = "route"
        else:
            continue
        if lines[node.lineno - 1].rstrip().endswith(MARKER):
            continue
        out.append((path.relative_to(root).as_posix(), node.lineno, kind, value))
    return sorted(out)


def test_scanner_finds_literals(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        'a = BY_NAME["forward-backward"]\n'
        'b = "/{job_id}/step"\n'
        'c = {"operation": 1}\n'  # a field name of the spec: not checked
        'd = {"step": 1}  # not-an-op\n'
        'e = "step size"\n'
        'f = "/"\n'
        'g = ("fwd-bwd", "/capacity")\n'
    )
    assert [(line, kind, value) for _, line, kind, value in violations(bad, tmp_path)] == [
        (1, "op name or alias", "forward-backward"),
        (2, "route", "/{job_id}/step"),
        (7, "op name or alias", "fwd-bwd"),
        (7, "route", "/capacity"),
    ]


@pytest.mark.parametrize("top", SCANNED)
def test_no_op_name_or_route_literals(top: str) -> None:
    found = [
        f"{path}:{line}: {kind} literal {value!r}: use arctic_sdk.spec.tables.methods"
        for p in _python_files()
        if p.relative_to(ROOT).parts[0] == top
        for path, line, kind, value in violations(p)
        if value not in PENDING.get(path, set())
    ]
    # pytest.fail, not `assert not found, ...`: an assert also prints `found` through repr,
    # which cuts long lists in the middle ("...methods...rvers/...") - once copied as a path.
    if found:
        pytest.fail("\n".join(found), pytrace=False)


def test_pending_entries_name_real_literals() -> None:
    """Every PENDING entry names a scanned file and literals still in it: the list only shrinks."""
    scanned = {p.relative_to(ROOT).as_posix(): p for p in _python_files()}
    problems = []
    for path, values in PENDING.items():
        if path not in scanned:
            problems.append(f"{path}: not a scanned file")
            continue
        stale = values - {value for *_, value in violations(scanned[path])}
        if stale:
            problems.append(f"{path}: {sorted(stale)} no longer found: delete them from PENDING")
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)
