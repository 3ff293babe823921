import contextlib
import os
import signal
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# tools/ holds the spec loader and the vector generator; tests import them directly.
sys.path.insert(0, str(ROOT / "tools"))

# Engine processes a test may start. Gateway worker hosts outlive their gateway by design (a
# restarted gateway reattaches), so a test that stops a gateway without ending its jobs leaves
# them running: the session fails if one started during it is still alive at its end.
ENGINE_PROCESSES = (
    "arctic_servers.gateway.worker_host",
    "arctic_servers.engines.worker.worker",
    "vllm.entrypoints.openai.api_server",
)
# Marks the processes this session starts (inherited through every server and worker it spawns),
# so a pytest run beside this one on the same machine is never counted, nor killed.
SESSION_MARK = "ARCTIC_TEST_SESSION"
_SESSION = uuid.uuid4().hex


def _engine_processes() -> dict[int, str]:
    """Engine processes this session started (their environment carries its mark, inherited
    from the test that started them): pid -> command line."""
    out: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if not any(p in cmd for p in ENGINE_PROCESSES):
                continue
            if f"{SESSION_MARK}={_SESSION}".encode() not in (entry / "environ").read_bytes():
                continue
        except OSError:
            continue
        out[int(entry.name)] = cmd.strip()
    return out


def pytest_sessionstart(session: pytest.Session) -> None:
    os.environ[SESSION_MARK] = _SESSION


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not sys.platform.startswith("linux"):
        return
    deadline = time.monotonic() + 20  # servers stopped by fixtures take seconds to reap workers
    left = _engine_processes()
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = _engine_processes()
    if not left:
        return
    print(f"\n{len(left)} engine process(es) started by this session are still running:")
    for pid, cmd in sorted(left.items()):
        print(f"  {pid}: {cmd[:200]}")
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# ------------------------------------------------------------------ parallel runs (pytest -n)

# Directories whose tests share a session-scoped server (the on-prem engine server, a fake
# gateway, a Tinker service): under pytest-xdist (`tools/test.sh` runs `-n 2 --dist loadgroup`)
# each runs whole on one worker, so its server starts once per run. Every other test file is a
# group of its own, and so are the files below, which start servers of their own or are long
# enough that a second copy of their directory's server (seconds) buys minutes of parallelism.
SHARED_SERVER_DIRS = frozenset({"onprem", "compat", "openai", "tinker", "sdk", "docs"})
OWN_GROUP_FILES = frozenset({"onprem/test_conformance.py", "tinker/test_onprem.py"})
# The longest groups first (seconds on the 2-core CI machine, one worker, 2026-12-06): a worker
# that finishes one takes the next, so the two workers end close together. `tools/test.sh`
# passes `--no-loadscope-reorder`, which keeps this order (xdist's default orders groups by their
# number of tests, which says little about their time); the rest follow in collection order.
LONGEST_FIRST = (
    "onprem",  # 715
    "onprem/test_conformance.py",  # 403
    "tinker/test_onprem.py",  # 316
    "gateway/test_real_engines.py",  # 285
    "conformance/test_proven.py",  # 242
    "tinker",  # 149
    "openai",  # 123
    "gateway/test_ray_multirank.py",  # 101
    "gateway/test_conformance.py",  # 94
    "compat",  # 89
)


def _group(item: pytest.Item) -> str:
    try:
        rel = Path(item.path).resolve().relative_to(ROOT / "tests")
    except ValueError:  # a test outside tests/
        return str(item.path)
    if rel.as_posix() in OWN_GROUP_FILES or len(rel.parts) == 1:
        return rel.as_posix()
    return rel.parts[0] if rel.parts[0] in SHARED_SERVER_DIRS else rel.as_posix()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if getattr(config.option, "dist", "no") == "no":  # not a distributed run
        return
    rank = {g: i for i, g in enumerate(LONGEST_FIRST)}
    groups = {id(item): _group(item) for item in items}
    items.sort(key=lambda it: rank.get(groups[id(it)], len(rank)))  # stable: file order kept
    for item in items:
        item.add_marker(pytest.mark.xdist_group(groups[id(item)]))
