"""The drift check: committed generated files equal a fresh regeneration, and hand edits fail it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import generate

ROOT = generate.ROOT
GENERATE = ROOT / "tools" / "codegen" / "generate.py"
SDK_GEN = "sdk/arctic_sdk/_generated"
SERVER_GEN = "servers/arctic_servers/_generated"
TABLES_GEN = "sdk/arctic_sdk/spec/tables"  # the public method and error tables
PB2_GEN = "sdk/arctic_sdk/spec/pb"  # the public protobuf modules


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(GENERATE), *args], capture_output=True, text=True, check=False
    )


def _copy_repo(tmp: Path) -> Path:
    """The parts generate.py reads and writes: proto/ and the generated folders."""
    root = tmp / "repo"
    ignore = shutil.ignore_patterns("__pycache__")
    for d in ("proto", SDK_GEN, SERVER_GEN, TABLES_GEN, PB2_GEN):
        shutil.copytree(ROOT / d, root / d, ignore=ignore)
    return root


def test_committed_generated_code_is_current() -> None:
    proc = _run("--check")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_check_fails_on_a_hand_edit_and_names_the_file(tmp_path: Path) -> None:
    root = _copy_repo(tmp_path)
    assert _run("--check", "--root", str(root)).returncode == 0
    target = root / TABLES_GEN / "methods.py"
    target.write_text(target.read_text().replace('name="step"', 'name="stepp"'))
    proc = _run("--check", "--root", str(root))
    assert proc.returncode == 1
    assert f"differs: {TABLES_GEN}/methods.py" in proc.stdout
    assert '-    name="stepp",' in proc.stdout and '+    name="step",' in proc.stdout
    assert "1 generated file(s) differ" in proc.stdout


def test_check_fails_on_added_and_deleted_files(tmp_path: Path) -> None:
    root = _copy_repo(tmp_path)
    (root / SERVER_GEN / "helpers.py").write_text("x = 1\n")
    (root / PB2_GEN / "arctic" / "v1" / "jobs_pb2.pyi").unlink()
    proc = _run("--check", "--root", str(root))
    assert proc.returncode == 1
    assert f"not generated (stale or hand-added): {SERVER_GEN}/helpers.py" in proc.stdout
    assert f"missing: {PB2_GEN}/arctic/v1/jobs_pb2.pyi" in proc.stdout


def test_regenerating_restores_exactly_the_generated_tree(tmp_path: Path) -> None:
    root = _copy_repo(tmp_path)
    (root / SDK_GEN / "client.py").write_text("# edited\n")
    (root / SERVER_GEN / "extra.py").write_text("x = 1\n")
    proc = _run("--root", str(root))
    assert proc.returncode == 0, proc.stderr
    assert f"{SDK_GEN}/client.py" in proc.stdout and f"{SERVER_GEN}/extra.py" in proc.stdout
    assert not (root / SERVER_GEN / "extra.py").exists()
    assert _run("--check", "--root", str(root)).returncode == 0


def test_check_follows_a_proto_change(tmp_path: Path) -> None:
    """Editing the spec without regenerating is drift too."""
    root = _copy_repo(tmp_path)
    proto = root / "proto" / "arctic" / "v1" / "training_service.proto"
    proto.write_text(proto.read_text().replace("// Drop the samplers' prefix caches.", "// Drop!"))
    proc = _run("--check", "--root", str(root))
    assert proc.returncode == 1
    assert f"differs: {TABLES_GEN}/methods.py" in proc.stdout


def test_pb2_modules_are_moved_under_the_public_spec_package() -> None:
    tree = generate.read_tree(ROOT, generate.Layout())
    pb2 = {p: t.decode() for p, t in tree.items() if p.endswith(("_pb2.py", "_pb2.pyi"))}
    assert len(pb2) == 2 * len(generate.proto_files(ROOT / "proto"))
    for path, text in pb2.items():
        assert "from arctic.v1 import" not in text, path
        assert "DO NOT EDIT" in "".join(text.splitlines()[:3]), path
        if path.endswith(".py"):
            assert "'arctic_sdk.spec.pb.arctic.v1." in text, path
