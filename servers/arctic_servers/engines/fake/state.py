"""The fake gateway's state: a job's sub-jobs, each with its fake engine, and its checkpoints.

The fake gateway (`conformance/fake`) keeps one `Job` per job. Each sub-job runs a `FakeEngine`
in process (the engine that gateway workers run in a worker process), which holds the model
step and, for the trainer, the gradients and optimizer counters (NUMERICS.md §2, §4, §6); the
job keeps what spans sub-jobs: the global step, the weight version and the checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...rules import jobs as pj
from ...rules.jobs import JobRecord, SubJobRecord

if TYPE_CHECKING:
    from .engine import FakeEngine


@dataclass
class SubJob(SubJobRecord):
    n_gpus: int = 1
    # the sub-job's engine, started with its job (`start_engine`)
    engine: FakeEngine = field(init=False, repr=False)

    def start_engine(self, vocab_size: int) -> None:
        from .engine import FakeEngine

        self.engine = FakeEngine(
            {
                "role": self.role,
                "sub_job_id": self.sub_job_id,
                "engine_spec": {
                    "config": self.config,
                    "model_name": self.model_name,
                    "vocab_size": vocab_size,
                },
            }
        )

    @property
    def model_step(self) -> int:
        """NUMERICS.md §2: the step whose weights this sub-job serves (its engine's)."""
        return self.engine.model_step

    @model_step.setter
    def model_step(self, step: int) -> None:
        self.engine.model_step = step


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
    checkpoints: dict[str, Checkpoint] = field(default_factory=dict)
    execution_log: list[dict[str, Any]] = field(default_factory=list)

    def start_engines(self, vocab_size: int) -> None:
        for s in self.sub_jobs:
            s.start_engine(vocab_size)

    @property
    def trainer(self) -> FakeEngine:
        """The training sub-job's engine: the optimizer's state (NUMERICS.md §4)."""
        train = self.sub_job("training")
        if train is None:  # a job without a trainer: its (idle) defaults
            from .engine import FakeEngine

            return FakeEngine({})
        return train.engine

    @property
    def n_gpus(self) -> int:
        return sum(s.n_gpus for s in self.sub_jobs)

    def sub_job_json(self, sub: SubJob) -> dict[str, Any]:
        # the fake's sub-jobs are always in their job's state
        return pj.sub_job_json(sub.sub_job_id, sub.role, self.state, self.reason, sub.model_name)
