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
