"""The servers' rooms import only the rooms below them (servers/README.md, "Rooms").

Every import of every module under `servers/arctic_servers` — at the top or inside a function,
absolute or relative — is resolved to the room it lands in and checked against the one table
below: `rules` and `telemetry` at the bottom, then the protocol core, the generated skeletons,
`serving` and the engines, and the servers and surfaces on top. A test that fails when an arrow
runs back up (the protocol core importing the generated servicer, an engine importing a job
manager) rather than a picture that goes stale.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "servers" / "arctic_servers"

# room -> the rooms it may import (itself always)
ALLOWED: dict[str, set[str]] = {
    "rules": set(),
    "telemetry": set(),
    "protocol": {"rules", "telemetry"},
    "_generated": {"protocol", "rules"},
    "engines": {"rules", "telemetry"},
    "serving": {"protocol", "rules", "telemetry", "_generated", "engines"},
}
TOP = {"onprem", "gateway", "openai", "tinker"}  # servers and surfaces: may import any room


def _room(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "arctic_servers" or len(parts) < 2:
        return None
    return parts[1]


def _imports(path: Path, room_dir: Path | None = None) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in `path` (as if it sat in `room_dir`)."""
    pkg = ["arctic_servers", *(room_dir or path.parent).relative_to(PKG).parts]
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[: len(pkg) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if node.module is None or mod in ("arctic_servers",):  # `from . import x`
                out += [(node.lineno, f"{mod}.{a.name}") for a in node.names]
            else:
                out.append((node.lineno, mod))
    return out


def _modules() -> list[Path]:
    return sorted(p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_room_is_in_the_table() -> None:
    rooms = {p.relative_to(PKG).parts[0] for p in _modules() if len(p.relative_to(PKG).parts) > 1}
    assert rooms == set(ALLOWED) | TOP, rooms


@pytest.mark.parametrize("room", sorted(ALLOWED))
def test_room_imports_only_rooms_below(room: str) -> None:
    bad = []
    for path in sorted((PKG / room).rglob("*.py")):
        for line, mod in _imports(path):
            target = _room(mod)
            if target is None or target == room or target in ALLOWED[room]:
                continue
            bad.append(f"{path.relative_to(PKG)}:{line} imports {mod} (room {target})")
    assert not bad, "\n".join(bad)


def test_the_check_sees_a_backward_arrow(tmp_path: Path) -> None:
    """Relative, function-level and `from .. import x` imports resolve to their room (a check
    that cannot fail is none)."""
    mods = {m for _, m in _imports(PKG / "protocol" / "core_state.py")}
    assert "arctic_servers.rules.errors" in mods and "arctic_servers.protocol.auth" in mods
    fake = tmp_path / "x.py"
    fake.write_text("def f():\n    from ..serving.serve import x\n    from .. import engines\n")
    found = [m for _, m in _imports(fake, PKG / "protocol")]
    assert found == ["arctic_servers.serving.serve", "arctic_servers.engines"], found
    assert {_room(m) for m in found} - ALLOWED["protocol"] - {"protocol"} == {"serving", "engines"}
