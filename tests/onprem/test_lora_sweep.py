"""A LoRA sampler killed with SIGKILL leaves its adapter versions under /dev/shm (RAM); the next
sampler on the host removes them (`engines/vllm/lora_sampler.py` `sweep_stale`), and never a
live sampler's: ownership is a flock the kernel drops with its process, in any PID namespace."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from arctic_servers.engines.vllm.lora_sampler import OWNER, PREFIX, own, sweep_stale

HOLD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from arctic_servers.engines.vllm.lora_sampler import own
    own(Path(sys.argv[1]))
    print("owned", flush=True)
    time.sleep(300)
    """
)


def _owned_by_child(d: Path) -> subprocess.Popen[str]:
    d.mkdir()
    (d / "v1").mkdir()
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(d)], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "owned"
    return p


def test_only_the_directories_of_dead_samplers_go(tmp_path: Path) -> None:
    live_dir, dead_dir = tmp_path / f"{PREFIX}live", tmp_path / f"{PREFIX}dead"
    live, dead = _owned_by_child(live_dir), _owned_by_child(dead_dir)
    mine = tmp_path / f"{PREFIX}mine"
    mine.mkdir()
    fd = own(mine)
    legacy = tmp_path / f"{PREFIX}legacy"  # no owner file: not ours to judge
    legacy.mkdir()
    other = tmp_path / "someone-else"
    other.mkdir()
    (other / OWNER).write_text("")
    try:
        dead.send_signal(signal.SIGKILL)
        dead.wait(10)
        assert dead.stdout is not None
        dead.stdout.close()
        deadline = time.monotonic() + 10
        removed: list[Path] = []
        while dead_dir.exists() and time.monotonic() < deadline:
            removed += sweep_stale(tmp_path)
        assert removed == [dead_dir] and not dead_dir.exists()
        assert live_dir.exists() and (live_dir / "v1").exists()
        assert mine.exists() and legacy.exists() and other.exists()
        assert sweep_stale(tmp_path) == []
    finally:
        live.kill()
        live.wait(10)
        assert live.stdout is not None
        live.stdout.close()
        os.close(fd)
    # once their owners are gone, theirs go too
    assert set(sweep_stale(tmp_path)) == {live_dir, mine}
    assert legacy.exists() and other.exists()
