"""Harbor 0.26 in a Python 3.12 venv of its own, cached: `python install_harbor.py` prints its
`harbor` executable.

Harbor needs Python >= 3.12 and is not a dependency of this project: it gets its own venv at
`$ARCTIC_HARBOR_VENV` (default `~/.cache/arctic/harbor-0.26-py3.12`), made once with the first
Python 3.12 found (`$ARCTIC_HARBOR_PYTHON`, `python3.12` on PATH, pyenv's 3.12 versions) and
`pip install 'harbor==0.26.*'` from the package index (about two minutes), then reused. A venv
left half-made (no completion marker) is made again; concurrent callers wait on a lock.
"""

from __future__ import annotations

import fcntl
import glob
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

SPEC = "harbor==0.26.*"
VERSION_PREFIX = "0.26."
MARKER = ".arctic-harbor-complete"


class HarborUnavailable(RuntimeError):
    """Harbor could not be installed here (the message says why)."""


def default_venv() -> Path:
    env = os.environ.get("ARCTIC_HARBOR_VENV")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "arctic" / "harbor-0.26-py3.12"


def find_python312() -> str | None:
    """A Python 3.12 interpreter: `$ARCTIC_HARBOR_PYTHON`, `python3.12`, pyenv's 3.12.x."""
    home = Path.home()
    candidates = [os.environ.get("ARCTIC_HARBOR_PYTHON", ""), shutil.which("python3.12") or ""]
    candidates += sorted(glob.glob(str(home / ".pyenv/versions/3.12*/bin/python")), reverse=True)
    for c in candidates:
        if not c or not os.access(c, os.X_OK):
            continue
        p = subprocess.run(
            [c, "-c", "import sys; print(sys.version_info[:2] == (3, 12))"],
            capture_output=True,
            text=True,
            check=False,
        )
        if p.stdout.strip() == "True":
            return c
    return None


def _version(harbor: Path) -> str:
    p = subprocess.run([str(harbor), "--version"], capture_output=True, text=True, check=False)
    return p.stdout.strip() if p.returncode == 0 else ""


def ensure_harbor(
    venv: Path | None = None,
    *,
    timeout: float = 900.0,
    log: Callable[[str], None] = lambda m: print(m, file=sys.stderr),
) -> Path:
    """The `harbor` executable of the cached venv, made first if need be (HarborUnavailable
    when it cannot be: no Python 3.12, the index unreachable, a failed install)."""
    venv = (venv or default_venv()).resolve()
    harbor = venv / "bin" / "harbor"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (venv / MARKER).is_file() and _version(harbor).startswith(VERSION_PREFIX):
            return harbor
        python = find_python312()
        if python is None:
            raise HarborUnavailable(
                "no Python 3.12 found (Harbor 0.26 needs >= 3.12): set ARCTIC_HARBOR_PYTHON"
            )
        shutil.rmtree(venv, ignore_errors=True)
        log(f"making Harbor's venv {venv} ({python}, pip install '{SPEC}')")
        steps = [
            [python, "-m", "venv", str(venv)],
            [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", SPEC],
        ]
        for cmd in steps:
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            except subprocess.TimeoutExpired:
                raise HarborUnavailable(f"{' '.join(cmd)} ran past {timeout:.0f} s") from None
            if p.returncode != 0:
                tail = "\n".join((p.stdout + p.stderr).strip().splitlines()[-15:])
                raise HarborUnavailable(f"{' '.join(cmd)} failed (exit {p.returncode}):\n{tail}")
        version = _version(harbor)
        if not version.startswith(VERSION_PREFIX):
            raise HarborUnavailable(f"{harbor} --version says {version!r}, not {VERSION_PREFIX}x")
        (venv / MARKER).write_text(version + "\n")
        log(f"Harbor {version} installed")
        return harbor


if __name__ == "__main__":
    print(ensure_harbor())
