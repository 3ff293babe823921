"""The on-prem server's settings and its thread plan (the engines' configs: `engines/config.py`)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..engines.config import ROLES, cpu_count, default_cache_dir
from ..serving.collective_sync import SyncSettings
from ..serving.lora_pools import PoolPolicy


@dataclass(frozen=True)
class ThreadPlan:
    """Threads per worker process, so the client, server and engines do not oversubscribe.

    `per_role` overrides the default for a role; a sub-job's `num_threads` overrides both.
    `pin` binds each worker to `cores` round-robin (off by default: on a small machine the
    trainer and the sampler mostly take turns, and pinning would halve what each one gets).
    """

    default: int = 0  # 0 = max(1, cores // 2)
    per_role: Mapping[str, int] = field(default_factory=dict)
    pin: bool = False

    def threads(self, role: str, override: int | None = None) -> int:
        if override:
            return max(1, int(override))
        n = self.per_role.get(role) or self.default
        return max(1, n or cpu_count() // 2)

    @staticmethod
    def parse(spec: str | None) -> ThreadPlan:
        """`"2"` (every worker) or `"training=1,sampling=1,log_prob=1"`, optionally `",pin"`."""
        if not spec:
            return ThreadPlan()
        default, per, pin = 0, {}, False
        for part in (p.strip() for p in spec.split(",") if p.strip()):
            if part == "pin":
                pin = True
            elif "=" in part:
                role, _, n = part.partition("=")
                if role not in ROLES:
                    raise ValueError(f"--threads: unknown role {role!r} (one of {ROLES})")
                per[role] = int(n)
            else:
                default = int(part)
        return ThreadPlan(default, per, pin)


@dataclass(frozen=True)
class ServerSettings:
    """What the on-prem server needs beyond the protocol layer's `ProtocolConfig`."""

    data_dir: Path = field(default_factory=lambda: default_cache_dir() / "onprem")
    model: str = ""  # default model directory ("" = the embedded tiny model)
    worker_python: str = field(default_factory=lambda: sys.executable)
    threads: ThreadPlan = field(default_factory=ThreadPlan)
    max_slots: int = 16  # sub-jobs running at once (n_gpus each, 1 by default)
    worker_start_timeout_s: float = 600.0
    lease_default_seconds: int = 0
    lease_max_seconds: int = 7 * 24 * 3600
    verbose_workers: bool = False  # echo worker output to the server's stderr
    tiny_model_seed: int = 0
    # engines with one idle, pre-imported worker kept ready, so a job starts in seconds
    prewarm: tuple[str, ...] = ("deepspeed", "vllm")
    sync: SyncSettings = field(default_factory=SyncSettings)  # the collective weight sync
    # base models whose LoRA jobs share one trainer and one sampler (none by default)
    lora_pools: PoolPolicy = field(default_factory=PoolPolicy)
