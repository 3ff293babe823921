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

# `tools/test.sh` runs the suite on two pytest-xdist workers (`-n 2 --dist loadscope`, scheduled
# by `pytest_xdist_make_scheduler` below: xdist's own `loadgroup` marks do not take under pytest 9,
# whose node ids it can no longer rename), in two lanes:
# - the engine lane: every test of the directories that start engines, Ray clusters or servers
#   shared across their files, in this order, as one unit on one worker, so its session servers
#   start once, no two Ray clusters ever run at once, and its timing-sensitive tests (a stream's
#   chunks, an abandoned stream's abort: `openai`, last) run after the other lane has ended;
# - the other lane: every other file as a unit of its own (a directory whose files share a
#   session server, as one), and the two long engine modules that start servers of their own and
#   assert no timings, first.
# How long each lane took: bench/results/2026-12-06-ci-run.md.
ENGINE_LANE = ("onprem", "gateway", "tinker", "compat", "examples", "openai")
OTHER_LANE_FIRST = ("onprem/test_conformance.py", "tinker/test_onprem.py")
SHARED_SERVER_DIRS = frozenset({"sdk", "docs"})


def _lane(path: str) -> tuple[int, str]:
    """(rank, unit of work) of a test file, its path relative to the checkout: the engine lane
    (one unit, its directories in order), then the other lane's long modules, then the rest."""
    parts = Path(path).parts
    if not parts or parts[0] != "tests" or len(parts) < 2:
        return 9, path
    rel = "/".join(parts[1:])
    if rel in OTHER_LANE_FIRST:
        return 1, rel
    if len(parts) > 2 and parts[1] in ENGINE_LANE:
        return 0, f"engines-{ENGINE_LANE.index(parts[1])}"
    if len(parts) > 2 and parts[1] in SHARED_SERVER_DIRS:
        return 2, parts[1]
    return 2, rel


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """xdist's load-scope scheduling over the lanes' units (a unit runs whole on one worker;
    units go to whichever worker is free, in collection order)."""
    from xdist.scheduler import LoadScopeScheduling

    class LaneScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            rank, unit = _lane(nodeid.split("::", 1)[0])
            return "engines" if rank == 0 else unit

    return LaneScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In an xdist worker: the engine lane first, then the other lane's long modules (every
    worker collects the same order, which the scheduler keeps: `--no-loadscope-reorder`)."""
    if not hasattr(config, "workerinput"):
        return
    rank = {id(it): _lane(it.nodeid.split("::", 1)[0]) for it in items}
    items.sort(key=lambda it: rank[id(it)])  # stable: file order kept within a unit
