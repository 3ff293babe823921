"""A Ray cluster of several nodes on one machine: each node its own `ray start --block` (the head,
then nodes joining it with `--address`), with its own CPUs and custom resources, in a session of
its own — the way to try, test and benchmark the gateway's placement across hosts (trainer on
one node, samplers on another: `--ray-resources`) without a second machine.

    python -m arctic_servers.gateway.ray_local --node trainer_node=1 --node sampler_node=1
        # prints the address for `python -m arctic_servers.gateway --ray-address ADDRESS`;
        # stops every node on Ctrl-C

Every node listens on loopback (`--node-ip-address 127.0.0.1`); the ports Ray would take at
fixed defaults (GCS 6379, client server 10001, dashboard agent 52365) are free ones picked here
and each node's worker ports a range of its own, so two clusters on one machine do not collide.
Every process Ray starts for a node (raylet, agents, actor workers; the head's GCS) stays in that
node's session, so `kill_node` loses a node as a host is lost (SIGKILL to all of it at once) and
stopping the cluster leaves nothing behind (checked; `ray stop` would stop every Ray instance of
this user).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


# Ray's memory monitor kills the actor with the largest process tree once the machine is 95%
# full: on a machine shared with other work that is the memory of others' processes (it killed
# a 0.5B trainer's actor in bench/weight_sync.py here); the kernel's OOM killer stays the limit
ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
       "RAY_memory_monitor_refresh_ms": "0"}  # fmt: skip


def session_pids(sid: int) -> set[int]:
    """The live processes of session `sid` (zombies excluded)."""
    out = set()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[3]) == sid:
            out.add(int(d.name))
    return out


def _signal(pids: set[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _start_node(argv: list[str], log: Path, timeout: float) -> subprocess.Popen[bytes]:
    """`ray start ... --block` in a session of its own, once it says it started."""
    env = dict(os.environ, **ENV)
    env.pop("PYTHONWARNINGS", None)
    with log.open("wb") as logf:
        node = subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    deadline = time.monotonic() + timeout
    while b"Ray runtime started" not in log.read_bytes():
        if node.poll() is not None or time.monotonic() > deadline:
            kill_node(node)
            raise AssertionError(f"ray start did not start ({node.returncode}):\n{log.read_text()}")
        time.sleep(0.2)
    return node


def kill_node(node: subprocess.Popen[bytes]) -> None:
    """SIGKILL every process of a node's session at once: the node is lost, as a host is."""
    _signal(session_pids(node.pid), signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        node.kill()
    node.wait(10)


def _stop_node(node: subprocess.Popen[bytes]) -> set[int]:
    """Stop a node; the pids of its session still there 10 s later."""
    node.send_signal(signal.SIGTERM)
    # `ray start --block` rarely exits on SIGTERM within 30 s here (teardowns of 30 s were
    # measured); whatever is left is killed below, and the check that nothing remains stays
    with contextlib.suppress(subprocess.TimeoutExpired):
        node.wait(5)
    kill_node(node)
    deadline = time.monotonic() + 10
    while (left := session_pids(node.pid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _ports(n: int) -> list[str]:
    lo = 20000 + (os.getpid() * 61 + n * 70) % 12000  # worker ports: a range per test process
    # and node, below the ephemeral ports (32768+) that free_port() and outgoing connections use
    return ["--min-worker-port", str(lo), "--max-worker-port", str(lo + 60),
            "--dashboard-agent-listen-port", str(free_port())]  # fmt: skip


@contextlib.contextmanager
def local_ray_cluster(
    nodes: list[dict[str, Any]], start_timeout: float = 120.0
) -> Iterator[tuple[str, list[subprocess.Popen[bytes]]]]:
    """A head and worker nodes on this machine (`ray start --head`, then `ray start --address`),
    each `{"num_cpus": N, "num_gpus": G, "resources": {...}}` (the first is the head), each in
    a session of its own; yields the address and the node processes (`kill_node` loses one);
    stops them all and checks that none of their processes is left (AssertionError naming
    them otherwise)."""
    tmp = tempfile.mkdtemp(prefix="arcray")  # short: Ray's socket paths must stay < 108 bytes
    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []
    py = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block"]
    try:
        for i, spec in enumerate(nodes):
            argv = [*py, "--node-ip-address", "127.0.0.1", "--num-cpus", str(spec["num_cpus"]),
                    "--num-gpus", str(spec.get("num_gpus", 0)), "--disable-usage-stats",
                    *_ports(i)]  # fmt: skip
            if spec.get("resources"):
                argv += ["--resources", json.dumps(spec["resources"])]
            if i == 0:
                argv += ["--head", "--port", str(port), "--include-dashboard", "false",
                         "--temp-dir", tmp,
                         "--ray-client-server-port", str(free_port())]  # fmt: skip
            else:
                argv += ["--address", f"127.0.0.1:{port}"]
            procs.append(_start_node(argv, Path(tmp) / f"ray-start-{i}.log", start_timeout))
        yield f"127.0.0.1:{port}", procs
    finally:
        left: set[int] = set()
        for node in reversed(procs):
            left |= _stop_node(node)
        shutil.rmtree(tmp, ignore_errors=True)
        assert not left, f"Ray processes left behind: {sorted(left)}"


@contextlib.contextmanager
def local_ray_head(num_cpus: int = 2, start_timeout: float = 120.0) -> Iterator[str]:
    """One node: start it; yields its address `127.0.0.1:PORT`; stops it and checks that none
    of its processes is left (AssertionError naming them otherwise)."""
    with local_ray_cluster([{"num_cpus": num_cpus}], start_timeout) as (address, _):
        yield address


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m arctic_servers.gateway.ray_local")
    ap.add_argument(
        "--node",
        action="append",
        default=[],
        metavar="NAME=N[,NAME=N]",
        help="a node and its custom resources (repeatable; the first is the head); "
        "num_cpus=N sets its CPUs (default 1)",
    )
    args = ap.parse_args(argv)
    nodes: list[dict[str, Any]] = []
    for spec in args.node or [""]:
        res = {k: float(v) for k, _, v in (p.partition("=") for p in spec.split(",") if p)}
        nodes.append({"num_cpus": int(res.pop("num_cpus", 1)), "resources": res})
    with local_ray_cluster(nodes) as (address, _):
        print(f"ray cluster of {len(nodes)} nodes at {address} (Ctrl-C stops it)", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.sigwait({signal.SIGINT, signal.SIGTERM})
    return 0


if __name__ == "__main__":
    sys.exit(main())
