"""No op name, legacy alias or route literal outside the generated folders.

Everything per-op is driven by the generated method table (`arctic_sdk._generated.methods`), so
a string constant equal to an op name, an alias or a route is a hand-written copy of the table
that will drift. Scanned: the product code (`sdk/`, `servers/`, `conformance/`, `dssst1/`,
`bench/`); exempt: `_generated/` folders, the compatibility alias table
`sdk/arctic_sdk/compat/aliases.py`, tests and tools. Rules, to stay precise with op names that
are also words ("step", "save", "forward"):

- a constant must equal a name, an alias, or a route exactly (substrings are fine);
- the route `/` is not checked (every path join has one);
- a name that is also a field name of a spec message (`operation`, the chunk descriptor's field)
  is not checked: it names the field far more often than the op;
- a line that ends with the comment `# not-an-op` is exempt (a word that happens to be an op
  name, e.g. DeepSpeed's `client_state={"step": n}`).

`PENDING` lists the literals found when this test was written, in code being written in
parallel; their owners replace them with the table (`methods.X.name`, `methods.X.operation_type`)
or move them to the compatibility table, then delete the entry. New literals fail at once.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.protobuf.descriptor import Descriptor

from arctic_sdk._generated import methods
from arctic_sdk._generated.arctic import v1 as pb2

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
PENDING: dict[str, set[str]] = {
    # worker-command and operation-type literals in the servers written in parallel this session:
    # owed a pass that reads them from the table (methods.X.python_name / .operation_type).
    "arctic_sdk._generated.methods...rvers/arctic_servers/gateway/dataplane.py": {"step"},
    "bench/gateway_load.py": {"forward-backward"},
    "bench/server.py": {"generate"},
    "servers/arctic_servers/gateway/checkpoints.py": {"load", "save"},
    "servers/arctic_servers/gateway/dataplane.py": {
        "cancel-request",
        "forward",
        "forward_backward",
        "generate",
        "log_probs",
        "reset-prefix-cache",
        "reset_prefix_cache",
        "step",
    },
    "servers/arctic_servers/gateway/fake_engine.py": {
        "forward",
        "forward_backward",
        "generate",
        "log_probs",
        "save",
        "step",
    },
    "servers/arctic_servers/gateway/servicer.py": {
        "cancel-request",
        "forward",
        "reset-prefix-cache",
    },
    "servers/arctic_servers/onprem/checks.py": {
        "sleep-inference",
        "sleep-training",
        "wake-inference",
    },
    "servers/arctic_servers/onprem/servicer.py": {
        "cancel-request",
        "forward",
        "forward_backward",
        "generate",
        "load",
        "log_probs",
        "reset-prefix-cache",
        "reset_prefix_cache",
        "save",
        "step",
    },
}


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


def _python_files() -> Iterator[Path]:
    for top in SCANNED:
        for p in sorted((ROOT / top).rglob("*.py")):
            rel = p.relative_to(ROOT).as_posix()
            if "_generated" in p.parts or rel in ALLOWED_FILES or "__pycache__" in p.parts:
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
        f"{path}:{line}: {kind} literal {value!r}: use arctic_sdk._generated.methods"
        for p in _python_files()
        if p.relative_to(ROOT).parts[0] == top
        for path, line, kind, value in violations(p)
        if value not in PENDING.get(path, set())
    ]
    assert not found, "\n".join(found)
