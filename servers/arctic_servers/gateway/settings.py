"""Gateway settings, and PATs read from a file or the environment (kept only as sha256 digests)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..protocol.config import parse_tokens as parse_tokens  # re-exported: tests, older imports
from ..serving.collective_sync import SyncSettings
from ..serving.lora_pools import PoolPolicy

TOKENS_ENV = "ARCTIC_GATEWAY_TOKENS"


@dataclass(frozen=True)
class GatewaySettings:
    """Everything the gateway needs beyond the protocol layer's `ProtocolConfig`."""

    db: Path  # SQLite file: jobs, requests, idempotency keys, chunk groups, results
    data_dir: Path | None = None  # checkpoints, worker logs and sockets (default: beside db)
    engine: str = "fake"  # "fake" (NUMERICS.md workers) or "onprem" (DeepSpeed / vLLM)
    worker_python: str = field(default_factory=lambda: sys.executable)
    max_total_gpus: int = 8  # capacity in GPUs (on CPU: slots); a sub-job takes its n_gpus
    worker_start_timeout_s: float = 600.0
    lease_default_seconds: int = 0  # 0 = jobs without a lease unless CreateJob asks for one
    lease_max_seconds: int = 7 * 24 * 3600
    lease_restart_grace_s: float = 60.0  # a lease never expires sooner than this after a start
    drain_timeout_s: float = 30.0  # SIGTERM: how long running requests may take to finish
    max_inflight_per_token: int = 64
    sweep_interval_s: float = 60.0
    ray_address: str = ""  # place sub-jobs as Ray actors on this cluster ("" = local processes)
    ray_namespace: str = "arctic-gateway"
    # Ray custom resources a role's actors ask for, e.g. {"training": {"trainer_node": 1}}: with
    # nodes started with those resources, the trainer and the samplers land on the nodes meant
    ray_resources: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    sync: SyncSettings = field(default_factory=SyncSettings)  # the collective weight sync
    worker_threads: int = 0  # threads per engine worker (0 = the engine's default)
    # Fake workers: seconds a command sleeps before it runs ({"step": 0.5}), for tests.
    fake_latency_s: Mapping[str, float] = field(default_factory=dict)
    # base models whose LoRA jobs share one trainer and one sampler (none by default; on-prem
    # engines only: PROTOCOL.md §3.6)
    lora_pools: PoolPolicy = field(default_factory=PoolPolicy)

    @property
    def root(self) -> Path:
        return self.data_dir or self.db.with_name(self.db.stem + "-data")

    @property
    def run_dir(self) -> Path:
        """Worker specs, status files and logs."""
        return self.root / "workers"

    @property
    def checkpoint_root(self) -> Path:
        return self.root / "checkpoints"


ROLES = ("training", "sampling", "log_prob")


def parse_ray_resources(specs: Iterable[str]) -> dict[str, dict[str, float]]:
    """`--ray-resources ROLE=NAME:N[,NAME:N]` (repeatable) -> {role: {name: amount}}."""
    out: dict[str, dict[str, float]] = {}
    for spec in specs:
        role, _, rest = spec.partition("=")
        if role not in ROLES or not rest:
            raise ValueError(f"--ray-resources {spec!r}: ROLE=NAME:N[,NAME:N], ROLE one of {ROLES}")
        for part in rest.split(","):
            name, _, n = part.partition(":")
            try:
                amount = float(n or 1)
            except ValueError:
                amount = -1.0
            if not name or amount <= 0:
                raise ValueError(f"--ray-resources {spec!r}: {part!r} is not NAME:N with N > 0")
            out.setdefault(role, {})[name] = amount
    return out


def load_tokens(tokens_file: Path | None, env: Mapping[str, str] | None = None) -> frozenset[str]:
    """Digests of the accepted PATs: the tokens file, plus `ARCTIC_GATEWAY_TOKENS` (comma or
    newline separated). Plaintext tokens are hashed at once and never kept."""
    env = os.environ if env is None else env
    digests: set[str] = set()
    if tokens_file is not None:
        digests |= parse_tokens(tokens_file.read_text().splitlines())
    raw = env.get(TOKENS_ENV, "")
    if raw:
        digests |= parse_tokens(raw.replace(",", "\n").splitlines())
    return frozenset(digests)
