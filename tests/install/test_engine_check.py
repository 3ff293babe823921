"""The engine check: a known-bad install (PyPI torchvision against the CPU torch) is named with
the command that fixes it, by `check` and at `serve` start, before any worker is started."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from arctic_servers.engines.install_check import EngineCheckError, check_engines

ROOT = Path(__file__).resolve().parents[2]
# what PyPI's torchvision raises against the CPU torch (ENGINE_NOTES §5.1)
NMS = "operator torchvision::nms does not exist"


@pytest.fixture
def broken_torchvision(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A torchvision that is installed (metadata) and fails on import as PyPI's does."""
    site = tmp_path / "site"
    (site / "torchvision").mkdir(parents=True)
    (site / "torchvision" / "__init__.py").write_text(f"raise RuntimeError({NMS!r})\n")
    meta = site / "torchvision-0.28.0.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: torchvision\nVersion: 0.28.0\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    return site


def no_site_python(tmp_path: Path) -> str:
    """An interpreter that sees no installed package at all (`python -S`)."""
    script = tmp_path / "python-bare"
    script.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    script.chmod(0o755)
    return str(script)


def module(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "arctic_servers.onprem", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_broken_torchvision_is_named_with_the_uninstall_command(broken_torchvision: Path) -> None:
    result = check_engines(sys.executable)
    assert not result.ok
    assert result.broken == {"torchvision": ("torchvision 0.28.0", f"RuntimeError: {NMS}")}
    assert result.fix_command() == f"{sys.executable} -m pip uninstall -y torchvision"
    text = result.message()
    assert f"import torchvision (torchvision 0.28.0) fails: RuntimeError: {NMS}" in text
    assert result.fix_command() in text and "ENGINE_NOTES.md §5.1" in text


def test_check_command_exits_1_with_the_fix(broken_torchvision: Path) -> None:
    done = module("check")
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"{sys.executable} -m pip uninstall -y torchvision" in done.stderr


def test_serve_refuses_to_start_and_names_the_fix(broken_torchvision: Path) -> None:
    done = module("serve", "--port", "0", "--prewarm", "")
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{sys.executable} -m pip uninstall -y torchvision" in done.stderr
    assert "--no-engine-check" in done.stderr
    assert "onprem server: http" not in done.stdout  # it never started


def test_gateway_with_onprem_engines_refuses_too(broken_torchvision: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "arctic_servers.gateway", "--db", str(tmp_path / "g.db")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{sys.executable} -m pip uninstall -y torchvision" in done.stderr


def test_gateway_without_the_engines_names_engine_fake(tmp_path: Path) -> None:
    """Only `.[gateway]` installed: the default `--engine onprem` stops, and says how to try the
    gateway anyway (`--engine fake`) beside the install command (issue 37)."""
    python = no_site_python(tmp_path)
    db = str(tmp_path / "g.db")
    done = subprocess.run(
        [sys.executable, "-m", "arctic_servers.gateway", "--db", db, "--worker-python", python],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--engine fake" in done.stderr and "not installed: torch" in done.stderr


def test_missing_engines_name_the_install_command(tmp_path: Path) -> None:
    python = no_site_python(tmp_path)
    result = check_engines(python)
    assert result.missing == ["torch", "vllm", "deepspeed", "transformers"]
    assert result.fix_command() == (
        f'{python} -m pip install "arctic-sdk[onprem]" '
        "--extra-index-url https://download.pytorch.org/whl/cpu"
    )
    assert "not installed: torch, vllm, deepspeed, transformers" in result.message()


def test_an_interpreter_that_cannot_run_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(EngineCheckError, match="cannot run the engines' Python"):
        check_engines(str(tmp_path / "no-such-python"))
    done = module("check", "--worker-python", str(tmp_path / "no-such-python"))
    assert done.returncode == 1 and "no-such-python" in done.stderr


@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="the engines are not installed here"
)
def test_the_installed_engines_pass() -> None:
    """tools/install_engines.sh's environment (what tools/test.sh runs on) passes the check."""
    result = check_engines(sys.executable)
    assert result.ok, result.message()
    assert result.versions["torch"].startswith("torch 2.13.0")
    done = module("check")
    assert done.returncode == 0 and "on-prem engines ok in" in done.stdout
