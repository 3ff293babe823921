"""The fake engine's state: a job's sub-jobs, its fake training state and its checkpoints.

The fake gateway (`conformance/fake`) keeps one `Job` per job; the deterministic numerics
(NUMERICS.md §2, §4, §6) read and advance it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...protocol import jobs as pj
from ...protocol.jobs import JobRecord


@dataclass
class SubJob:
    sub_job_id: str
    role: str
    index: int
    model_name: str
    n_gpus: int
    config: dict[str, Any]
    # NUMERICS.md §2: the step whose weights this sub-job serves (training: its own steps).
    model_step: int = 0

    @property
    def max_seq_len(self) -> int:
        return int(self.config.get("max_seq_len") or 0)


@dataclass
class Checkpoint:
    checkpoint_id: str
    checkpoint_type: str
    global_step: int
    model_step: int
    lr: float
    avg_loss: float
    created_at: float
    model_name: str


@dataclass
class Job(JobRecord[SubJob]):
    # Training state (NUMERICS.md §4).
    applied_steps: int = 0
    lr: float = 1e-5
    grad: dict[int, float] = field(default_factory=dict)
    accum_loss: float = 0.0
    accum_tokens: int = 0
    checkpoints: dict[str, Checkpoint] = field(default_factory=dict)
    execution_log: list[dict[str, Any]] = field(default_factory=list)

    @property
    def n_gpus(self) -> int:
        return sum(s.n_gpus for s in self.sub_jobs)

    def sub_job_json(self, sub: SubJob) -> dict[str, Any]:
        # the fake's sub-jobs are always in their job's state
        return pj.sub_job_json(sub.sub_job_id, sub.role, self.state, self.reason, sub.model_name)
