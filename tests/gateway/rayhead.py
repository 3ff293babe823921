"""Local Ray instances for the gateway's Ray tests (`arctic_servers.gateway.ray_local`): one node
(`local_ray_head`: `ray start --head --block` with 2 CPUs), or a head and worker nodes on this
machine, each its own `ray start` with its own custom resources (`local_ray_cluster`;
`kill_node` loses one, as a host is lost). The gateway connects on loopback and its worker
hosts bind there (ARCTIC_GATEWAY_RAY_BIND). Stopping an instance leaves none of its processes
(checked), and nothing else on the machine is touched.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

from arctic_servers.gateway.ray_local import kill_node, local_ray_cluster, local_ray_head

__all__ = ["TWO_NODES", "kill_node", "local_ray_cluster", "local_ray_head", "require_ray",
           "two_node_args"]  # fmt: skip

# a trainer's node and a sampler's, each with its own custom resource
TWO_NODES = [
    {"num_cpus": 1, "resources": {"trainer_node": 1}},
    {"num_cpus": 1, "resources": {"sampler_node": 1}},
]


def two_node_args(address: str) -> tuple[str, ...]:
    """A gateway's arguments that put the trainer on the one node and the sampler on the other
    (the local loopback binding: ARCTIC_GATEWAY_RAY_BIND, set by the caller)."""
    return ("--ray-address", address, "--gpus", "2",
            "--ray-resources", "training=trainer_node:1",
            "--ray-resources", "sampling=sampler_node:1")  # fmt: skip


RAY_MISSING = "ray is not installed: pip install -e '.[ray]' (the dev extra has it)"


def require_ray() -> None:
    """Skip without ray; under CI (`CI` set, where tools/test.sh installs it) fail instead."""
    if importlib.util.find_spec("ray") is None:
        if os.environ.get("CI"):
            pytest.fail(RAY_MISSING)
        pytest.skip(RAY_MISSING)
