"""Runs in Harbor's venv (`tests/openai/test_harbor.py` starts it): `HostEnvironment`'s
contract, built by Harbor's own classes, on the edges a trial does not reach. Prints "ok".

    python harbor_env_probe.py TASK_DIR SCRATCH_DIR   # examples/harbor on PYTHONPATH
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from arctic_host_env import HostEnvironment
from harbor.models.task.config import EnvironmentConfig
from harbor.models.trial.paths import TrialPaths


async def probe(task: Path, scratch: Path) -> None:
    paths = TrialPaths(trial_dir=scratch / "trial")
    env = HostEnvironment(
        environment_dir=task / "environment",
        environment_name="hello-file",
        session_id="probe__env",
        trial_paths=paths,
        task_env_config=EnvironmentConfig(workdir="/app"),
    )
    for workdir in ("/usr/src", "/", "app", "/app/../etc"):  # the host's, or not a path
        try:
            HostEnvironment(
                environment_dir=task / "environment",
                environment_name="hello-file",
                session_id="probe__env",
                trial_paths=paths,
                task_env_config=EnvironmentConfig(workdir=workdir),
            )
            raise AssertionError(f"workdir {workdir!r} was accepted")
        except ValueError as exc:
            assert "workdir" in str(exc), exc
    try:
        await env.exec("true")
        raise AssertionError("exec before start ran")
    except RuntimeError as exc:
        assert "before start" in str(exc)
    await env.start(force_build=False)
    try:
        await _checks(env, task, scratch)
    finally:
        await env.stop(delete=True)
    print("ok")


async def _checks(env: HostEnvironment, task: Path, scratch: Path) -> None:
    root = env._root
    assert root is not None and root.is_dir()
    r = await env.exec("pwd; ls -A /tests | wc -l; echo $TMPDIR; test -d /usr/bin && echo host")
    assert (r.return_code, (r.stdout or "").split()) == (0, ["/app", "0", "/tmp", "host"]), r
    # a file uploaded to a private path is there for commands and on the host under the root
    src = scratch / "in.txt"
    src.write_text("payload\n")
    await env.upload_file(src, "/tests/in.txt")
    r = await env.exec("cat /tests/in.txt && echo made > /tmp/out.txt && echo w > rel.txt")
    assert r.stdout == "payload\n" and (root / "tests" / "in.txt").is_file()
    await env.download_file("/tmp/out.txt", scratch / "out.txt")
    assert (scratch / "out.txt").read_text() == "made\n"
    assert (root / "app" / "rel.txt").is_file()  # relative to the working directory
    assert not Path("/tmp/out.txt").exists() or Path("/tmp/out.txt").read_text() != "made\n"
    await env.upload_dir(task / "tests", "/tests")
    await env.download_dir("/tests", scratch / "tests")
    assert (scratch / "tests" / "test.sh").is_file()
    # hostile and failing input
    for bad in ("/tests/../../etc/passwd", "../outside"):
        try:
            await env.upload_file(src, bad)
            raise AssertionError(f"{bad!r} was accepted")
        except ValueError as exc:
            assert "'..'" in str(exc)
    r = await env.exec("echo err >&2; exit 3")
    assert (r.return_code, r.stderr) == (3, "err\n")
    r = await env.exec("echo $A-$B", env={"A": "x", "B": "it's"})
    assert r.stdout == "x-it's\n"
    try:
        await env.exec("sleep 30", timeout_sec=1)
        raise AssertionError("the timeout did not fire")
    except RuntimeError as exc:
        assert "timed out after 1 seconds" in str(exc)
    if os.geteuid() == 0:
        for who in ("nobody", 65534):
            r = await env.exec("id -u", user=who)
            assert (r.return_code, r.stdout) == (0, "65534\n"), r
    # a process left running in the trial dies with it, and the root goes
    await env.exec("(sleep 300 &) ; true")
    pids = env._namespace_pids()
    assert len(pids) >= 2, pids  # the holder and the sleep
    await env.stop(delete=True)
    assert not root.exists()
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or _zombie(pid), pid
    try:
        await env.exec("true")
        raise AssertionError("exec after stop ran")
    except RuntimeError as exc:
        assert "after stop" in str(exc)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


if __name__ == "__main__":
    asyncio.run(probe(Path(sys.argv[1]), Path(sys.argv[2])))
