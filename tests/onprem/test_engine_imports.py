"""Importing one engine imports no other (issue 32): the engines raise `engines/errors.py`'s
`WorkerError` and read the pipe's shapes from `worker/messages.py`; only the registry
(`engines/registry.py`) and the worker loop above it know every engine. Checked on the source,
function-level imports included, so a lazy import cannot close the circle again."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ENGINES = Path(__file__).resolve().parents[2] / "servers" / "arctic_servers" / "engines"
ABOVE_THE_ENGINES = ("arctic_servers.engines.registry", "arctic_servers.engines.worker.worker")
ROOMS = ("deepspeed", "vllm", "fake", "weight_transfer", "losses")


def _module(path: Path) -> str:
    rel = path.relative_to(ENGINES.parent.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every module `path` imports, at any depth of its code, as an absolute name."""
    here = _module(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            mod = ".".join([*base, *([node.module] if node.module else [])])
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
    return out


def test_the_import_scanner_resolves_relative_imports() -> None:
    path = ENGINES / "fake" / "engine.py"
    got = imports_of(path)
    assert "arctic_servers.engines.worker.engine_base" in got
    assert "arctic_servers.rules.errors" in got


@pytest.mark.parametrize("room", ROOMS)
def test_no_engine_imports_the_registry_or_the_worker_loop(room: str) -> None:
    files = [ENGINES / "worker" / "engine_base.py", *sorted((ENGINES / room).rglob("*.py"))]
    for path in files:
        bad = sorted(m for m in imports_of(path) if m.startswith(ABOVE_THE_ENGINES))
        assert not bad, f"{path.relative_to(ENGINES)} imports {bad}"


@pytest.mark.parametrize("room", ROOMS)
def test_an_engine_imports_no_other_engine(room: str) -> None:
    engines = ("deepspeed", "vllm", "fake")
    others = tuple(f"arctic_servers.engines.{r}" for r in engines if r != room)
    for path in sorted((ENGINES / room).rglob("*.py")):
        bad = sorted(m for m in imports_of(path) if m.startswith(others))
        assert not bad, f"{path.relative_to(ENGINES)} imports {bad}"


def test_importing_the_fake_engine_loads_no_other_engine() -> None:
    code = (
        "import sys, arctic_servers.engines.fake.engine\n"
        "print(sorted(m for m in sys.modules if m.startswith(("
        "'arctic_servers.engines.deepspeed', 'arctic_servers.engines.vllm', "
        "'arctic_servers.engines.registry', 'arctic_servers.engines.worker.worker', "
        "'torch', 'vllm', 'deepspeed'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
