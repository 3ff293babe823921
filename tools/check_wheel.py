#!/usr/bin/env python3
"""Install the package as users do and run what the README promises (tools/test.sh, "wheel").

Builds the wheel (`pip wheel`, with the build log checked for warnings), installs it into a fresh
venv (no checkout on the path, no dev extra), and runs there, from a directory outside the checkout:

- the README's SDK quick start as written (taken from the README, so the two cannot drift), and
  again with `transport="grpc"` (the README says that is the only change);
- `python -m conformance serve` and the conformance runner against it, over HTTP and gRPC;
- `--help` of every `python -m` entry point of this project that the README names;
- mypy resolving the installed `arctic_sdk` (its `py.typed`) with no MYPYPATH;
- with `--engines-python PY`: `python -m arctic_servers.onprem check --worker-python PY`;
- then an editable install of the checkout into the same venv, and mypy resolving that too.

    python tools/check_wheel.py [--engines-python PY] [--keep DIR]

The pip cache makes a second run fast; a fresh machine needs only the package registries.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("arctic_sdk", "arctic_servers", "conformance", "dssst1")
TOKENS = ("wheel-check-pat", "wheel-check-pat-2")
# pip's notes about this machine's local mirrors, not about the build
PIP_NOISE = re.compile(r"^WARNING: Location '.*' is ignored")
MYPY_PROBE = """\
import dssst1
from arctic_sdk import Client
from conformance.fake import BackgroundFake


def probe(client: Client, fake: BackgroundFake) -> None:
    reveal_type(client.step)
    reveal_type(fake.start)
    reveal_type(dssst1.decode_chunks)
"""


class CheckFailed(RuntimeError):
    pass


def quick_start(readme: str) -> str:
    """The python block(s) under the README's "SDK quick start" heading, as one script."""
    section = readme.split("\n## SDK quick start\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    if not blocks:
        raise CheckFailed("README.md has no python block under '## SDK quick start'")
    return "\n".join(blocks)


def entry_points(readme: str) -> list[tuple[str, ...]]:
    """Every `python -m <module> [subcommand]` of this project's packages in the README."""
    found: list[tuple[str, ...]] = []
    names = "|".join(PACKAGES)
    pattern = rf"python -m ((?:{names})(?:\.\w+)*)(?: ([a-z][a-z-]*)\b)?"
    for module, sub in re.findall(pattern, readme):
        cmd = (module, sub) if sub else (module,)
        if cmd not in found:
            found.append(cmd)
    return found


_STEP = [time.monotonic()]


def step(title: str) -> None:
    """Print the time the previous step took, then the next step's title."""
    now = time.monotonic()
    print(f"    ({now - _STEP[0]:.0f} s)\n--> {title}", flush=True)
    _STEP[0] = now


def run(
    argv: Sequence[str], *, cwd: Path, env: dict[str, str], timeout: float = 600, check: bool = True
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        list(argv), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    if check and done.returncode != 0:
        raise CheckFailed(
            f"{' '.join(argv)} exited {done.returncode}\n{done.stdout[-4000:]}{done.stderr[-4000:]}"
        )
    return done


def clean_env() -> dict[str, str]:
    """The caller's environment without anything that would put the checkout on the path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "MYPY", "VIRTUAL"))}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def build_wheel(out: Path, env: dict[str, str]) -> Path:
    done = run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(out), str(ROOT)],
        cwd=ROOT,
        env=env,
    )
    log = (done.stdout + done.stderr).splitlines()
    warnings = [
        line
        for line in log
        if re.search(r"warn|deprecat", line, re.I) and not PIP_NOISE.match(line)
    ]
    if warnings:
        raise CheckFailed("the build printed warnings:\n" + "\n".join(warnings))
    (wheel,) = out.glob("arctic_sdk-*.whl")
    print(f"built {wheel.name} ({wheel.stat().st_size // 1024} KiB), no warnings")
    return wheel


class Venv:
    def __init__(self, path: Path, env: dict[str, str]) -> None:
        self.path = path
        self.python = str(path / "bin" / "python")
        self.env = dict(env, VIRTUAL_ENV=str(path), PATH=f"{path / 'bin'}:{env.get('PATH', '')}")

    def run(
        self, *args: str, cwd: Path, timeout: float = 600, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return run([self.python, *args], cwd=cwd, env=self.env, timeout=timeout, check=check)


def check_imports(venv: Venv, work: Path, under: Path) -> None:
    code = f"import {', '.join(PACKAGES)}\n" + "".join(f"print({p}.__file__)\n" for p in PACKAGES)
    files = venv.run("-c", code, cwd=work).stdout.split()
    wrong = [f for f in files if not Path(f).resolve().is_relative_to(under.resolve())]
    if wrong:
        raise CheckFailed(f"imported from outside {under}: {wrong}")
    print(f"{', '.join(PACKAGES)} import from {under}")


def check_quick_start(venv: Venv, work: Path, code: str) -> None:
    for transport in ("http", "grpc"):
        script = work / f"quickstart_{transport}.py"
        variant = code.replace('transport="http"', f'transport="{transport}"')
        if transport == "grpc" and variant == code:
            raise CheckFailed('the quick start no longer says transport="http"')
        script.write_text(variant)
        t0 = time.monotonic()
        out = venv.run(str(script), cwd=work, timeout=300).stdout
        if "loss" not in out or "invalid_argument" not in out:
            raise CheckFailed(f"the quick start ({transport}) printed:\n{out}")
        print(f"README quick start over {transport}: ok ({time.monotonic() - t0:.1f} s)")


def check_conformance(venv: Venv, work: Path) -> None:
    argv = [venv.python, "-m", "conformance", "serve", "--admin", "--port", "0"]
    argv += [a for t in TOKENS for a in ("--token", t)]
    proc = subprocess.Popen(
        argv, cwd=work, env=venv.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        urls: dict[str, str] = {}
        assert proc.stdout is not None
        while "grpc" not in urls:
            line = proc.stdout.readline()
            if not line:
                raise CheckFailed(f"python -m conformance serve exited {proc.wait()}")
            key, _, value = line.strip().partition(" ")
            if key in ("prefix", "grpc"):
                urls[key] = value.strip()
        listed = venv.run("-m", "conformance", "--list", cwd=work).stdout.splitlines()
        here = subprocess.run(
            [sys.executable, "-m", "conformance", "--list"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
        if len(listed) != len(here):
            raise CheckFailed(f"installed runner has {len(listed)} cases, the checkout {len(here)}")
        base = ["-m", "conformance", "--target", urls["prefix"]]
        base += ["--token", TOKENS[0], "--alt-token", TOKENS[1]]
        for transport in ("http", "grpc"):
            extra = (
                ["--transport", "grpc", "--grpc-target", urls["grpc"]]
                if transport == "grpc"
                else []
            )
            t0 = time.monotonic()
            done = venv.run(*base, *extra, cwd=work, timeout=900, check=False)
            summary = [line for line in done.stdout.splitlines() if " cases: " in line] + [""]
            if done.returncode != 0:
                raise CheckFailed(
                    f"conformance over {transport} exited {done.returncode}\n{done.stdout[-6000:]}"
                )
            took = time.monotonic() - t0
            print(f"conformance over {transport}: {summary[0]} ({took:.0f} s)")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def check_help(venv: Venv, work: Path, readme: str) -> None:
    commands = entry_points(readme)
    if not any(c[0] == "conformance" for c in commands):
        raise CheckFailed("the README names no python -m conformance")
    for cmd in commands:
        done = venv.run("-m", *cmd, "--help", cwd=work, timeout=120)
        if "usage:" not in done.stdout:
            raise CheckFailed(f"python -m {' '.join(cmd)} --help printed no usage")
        if cmd == ("conformance",) and "conformance serve" not in done.stdout:
            raise CheckFailed("python -m conformance --help does not mention serve")
    print("--help ok: " + "; ".join("python -m " + " ".join(c) for c in commands))


def check_mypy(venv: Venv, work: Path, what: str) -> None:
    probe = work / "typed_probe.py"
    probe.write_text(MYPY_PROBE)
    cache = ["--cache-dir", str(work / ".mypy_cache")]  # shared by both runs: numpy etc. once
    done = venv.run("-m", "mypy", "--strict", *cache, str(probe), cwd=work, check=False)
    revealed = [line for line in done.stdout.splitlines() if "Revealed type" in line]
    if done.returncode != 0 or len(revealed) != 3 or any('"Any"' in line for line in revealed):
        raise CheckFailed(f"mypy on the {what} install:\n{done.stdout}{done.stderr}")
    print(f"mypy resolves the {what} install (py.typed, no MYPYPATH)")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engines-python", help="also run the engine check against this interpreter")
    ap.add_argument("--keep", type=Path, help="build and install here, and keep it")
    args = ap.parse_args(argv)
    engines_python = os.path.abspath(args.engines_python) if args.engines_python else None
    readme = (ROOT / "README.md").read_text()
    env = clean_env()
    top = args.keep or Path(tempfile.mkdtemp(prefix="arctic-wheel-"))
    top.mkdir(parents=True, exist_ok=True)
    work = top / "work"  # the cwd of every check: not the checkout
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    t0 = time.monotonic()
    try:
        step("build the wheel")
        shutil.rmtree(top / "dist", ignore_errors=True)
        wheel = build_wheel(top / "dist", env)
        step("a fresh venv with the wheel (no checkout, no dev extra) and mypy")
        run([sys.executable, "-m", "venv", "--clear", str(top / "venv")], cwd=work, env=env)
        venv = Venv(top / "venv", env)
        venv.run("-m", "pip", "install", "-q", str(wheel), "mypy>=1.10", cwd=work)
        site = Path(venv.run("-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                             cwd=work).stdout.strip())  # fmt: skip
        check_imports(venv, work, site)
        step("README SDK quick start")
        check_quick_start(venv, work, quick_start(readme))
        step("conformance runner against python -m conformance serve")
        check_conformance(venv, work)
        step("--help of the README's python -m entry points")
        check_help(venv, work, readme)
        step("mypy against the installed wheel")
        check_mypy(venv, work, "wheel")
        if engines_python:
            step(f"engine check of {engines_python}")
            done = venv.run(
                "-m", "arctic_servers.onprem", "check", "--worker-python", engines_python,
                cwd=work,
            )  # fmt: skip
            print(done.stdout.strip())
        step("editable install of the checkout")
        venv.run("-m", "pip", "install", "-q", "--no-deps", "-e", str(ROOT), cwd=work)
        check_imports(venv, work, ROOT)
        check_mypy(venv, work, "editable")
        step("done")
    except CheckFailed as exc:
        print(f"\nwheel check FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        if args.keep is None:
            shutil.rmtree(top, ignore_errors=True)
    print(f"\nwheel check passed ({time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
