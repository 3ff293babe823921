"""CPU seconds of a benchmark's server processes, found by a mark in their environment.

A server the benchmark starts gets `ARCTIC_BENCH_PROCS=<mark>` in its environment; its workers
and engine processes inherit it, wherever they end up in the process tree (the gateway's worker
hosts leave the gateway's session by design). `ServerCpu.sample()` reads the CPU time (user +
system, `/proc/<pid>/stat`) of the server's own process and of every other marked process, so a
row can show where the machine's cores went while its calls ran: the client (this process), the
server, the engines. Linux only; elsewhere the samples are None.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

MARK_VAR = "ARCTIC_BENCH_PROCS"
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def new_mark() -> str:
    return uuid.uuid4().hex


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def marked(mark: str) -> list[int]:
    """The processes whose environment carries `ARCTIC_BENCH_PROCS=mark`, and their
    descendants (a process that sets its title, as vLLM's engine core does, may overwrite the
    environment /proc shows)."""
    needle = f"{MARK_VAR}={mark}".encode()
    found: set[int] = set()
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            parent[pid] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.add(pid)
        except (OSError, IndexError, ValueError):
            continue
    grew = True
    while grew:
        kids = {pid for pid, pp in parent.items() if pp in found and pid not in found}
        found |= kids
        grew = bool(kids)
    return sorted(found)


class ServerCpu:
    """The CPU of one server (`main_pid`) and of the other processes carrying its mark."""

    def __init__(self, mark: str, main_pid: int) -> None:
        self.mark, self.main_pid = mark, main_pid
        self.others: list[int] = []

    def refresh(self) -> None:
        """Find the marked processes again (call it outside the timed part: it reads /proc)."""
        if Path("/proc/self/stat").exists():
            self.others = [p for p in marked(self.mark) if p != self.main_pid]

    def sample(self) -> tuple[float, float] | None:
        """(the server process's CPU s, the other marked processes' CPU s) so far."""
        if not Path("/proc/self/stat").exists():
            return None
        return cpu_seconds(self.main_pid), sum(cpu_seconds(p) for p in self.others)
