"""The families read at scrape time from a server's live state: chunk-group bytes against their
budgets, sampling backpressure, jobs by state, and per job (jobs that have not ended) its state,
weight version, tokens, weight syncs and each engine's busy time.

Nothing here is updated on the request path: a scrape walks the core's chunk groups and
sampling queue and the servicer's jobs (`JobQueue.jobs`), so a job's series exist exactly while
it has not ended, and the per-job meters of ended jobs are dropped at the same time
(`ServerMetrics.forget_jobs`). An engine's busy time comes from its worker link's `BusyMeter`,
found through the servicer's `engine_link(sub_job)` (on-prem: the worker process, gateway: the
worker host's connection; the fake gateway has no engines and reports none).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from ..rules.jobs import STATES, TERMINAL
from ..telemetry.metrics import BusyMeter, JobMeters

if TYPE_CHECKING:
    from .core_state import CoreState

__all__ = ["LiveCollector"]

JOB = ["job_id"]
ENGINE = ["job_id", "sub_job_id", "role"]


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


class LiveCollector:
    """A prometheus_client collector over one protocol core and its servicer."""

    def __init__(self, core: CoreState) -> None:
        self.core = core

    def collect(self) -> Iterator[Metric]:
        yield from self._chunks()
        yield from self._sampling()
        yield from self._jobs()

    def _chunks(self) -> Iterator[Metric]:
        groups = self.core.groups
        b = groups.budget
        yield _gauge(
            "arctic_chunk_open_bytes",
            "Bytes incomplete request chunk groups hold now, over the whole server (counted "
            "against max_open_chunk_bytes).",
            groups.held_bytes(),
        )
        yield _gauge(
            "arctic_chunk_open_bytes_job_max",
            "Bytes the job holding the most in incomplete chunk groups holds now (counted "
            "against max_open_chunk_bytes_per_job).",
            groups.max_job_bytes(),
        )
        budget = GaugeMetricFamily(
            "arctic_chunk_open_bytes_budget",
            "The budgets of incomplete chunk groups: scope server (max_open_chunk_bytes) and "
            "job (max_open_chunk_bytes_per_job); a chunk past either is 429 rate_limited.",
            labels=["scope"],
        )
        budget.add_metric(["server"], b.server_bytes)
        budget.add_metric(["job"], b.per_job_bytes)
        yield budget
        yield _gauge(
            "arctic_chunk_groups_open", "Incomplete request chunk groups.", groups.open_groups()
        )

    def _sampling(self) -> Iterator[Metric]:
        q = self.core.sampling
        yield _gauge(
            "arctic_sampling_requests_in_flight",
            "Sampling requests (generate, OpenAI completions) admitted and not ended, over every "
            "job.",
            q.total(),
        )
        yield _gauge(
            "arctic_sampling_requests_per_job_limit",
            "limits.max_sampling_requests_per_job: past it a job's sampling call is 429 (0: none).",
            q.limit,
        )

    def _jobs(self) -> Iterator[Metric]:
        metrics = self.core.metrics
        jobs_of = getattr(self.core.servicer, "jobs", None)
        jobs: dict[str, Any] = dict(getattr(jobs_of, "jobs", None) or {})
        by_state = GaugeMetricFamily(
            "arctic_jobs", "Jobs this server knows, by state.", labels=["state"]
        )
        counts = dict.fromkeys(STATES, 0)
        for job in jobs.values():
            counts[job.state] = counts.get(job.state, 0) + 1
        for state, n in counts.items():
            by_state.add_metric([state], n)
        yield by_state
        live = [j for j in jobs.values() if j.state not in TERMINAL]
        metrics.forget_jobs(j.job_id for j in live)
        fams = _JobFamilies()
        link = getattr(self.core.servicer, "engine_link", lambda sub: None)
        for job in live:
            fams.add(job, metrics.jobs.get(job.job_id) or JobMeters())
            for sub in job.sub_jobs:
                meter = getattr(link(sub), "busy", None)
                if isinstance(meter, BusyMeter):
                    fams.engine([job.job_id, sub.sub_job_id, sub.role], meter)
        yield from fams.all()


# key -> (gauge or counter, name, help) of each per-job family labelled by job id
_PER_JOB: dict[str, tuple[str, str, str]] = {
    "weight_version": ("gauge", "arctic_job_weight_version",
                       "The job's weight version (moved by syncs)."),
    "global_step": ("gauge", "arctic_job_global_step", "The job's optimizer steps so far."),
    "sampled": ("counter", "arctic_job_tokens_sampled",
                "Tokens the job's samplers generated (protocol generate and OpenAI routes)."),
    "trained": ("counter", "arctic_job_tokens_trained",
                "Tokens the job's trainer trained on (forward-backward metrics.num_tokens)."),
    "syncs": ("counter", "arctic_job_weight_syncs", "Weight syncs the job completed."),
    "sync_seconds": ("counter", "arctic_job_weight_sync_seconds",
                     "Seconds the job's weight syncs took."),
    "sync_bytes": ("counter", "arctic_job_weight_sync_bytes",
                   "Bytes the job's weight syncs moved."),
    "last_seconds": ("gauge", "arctic_job_last_weight_sync_seconds",
                     "Seconds the job's last weight sync took (its result's `seconds`)."),
    "last_bytes": ("gauge", "arctic_job_last_weight_sync_bytes",
                   "Bytes the job's last weight sync moved (its result's `num_bytes`)."),
    "last_at": ("gauge", "arctic_job_last_weight_sync_timestamp_seconds",
                "Unix time the job's last weight sync ended."),
}  # fmt: skip


class _JobFamilies:
    def __init__(self) -> None:
        self.state = GaugeMetricFamily(
            "arctic_job_state",
            "1 for each job that has not ended, labelled with its state (pending, starting, "
            "running); its series go away when the job ends.",
            labels=["job_id", "state"],
        )
        kinds = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily}
        self.per_job: dict[str, Metric] = {
            key: kinds[kind](name, doc, labels=JOB) for key, (kind, name, doc) in _PER_JOB.items()
        }
        self.busy = CounterMetricFamily(
            "arctic_job_engine_busy_seconds",
            "Seconds each sub-job's engine had a command in flight; rate() over a window is the "
            "engine's busy fraction.",
            labels=ENGINE,
        )
        self.busy_ratio = GaugeMetricFamily(
            "arctic_job_engine_busy_ratio",
            "Busy fraction of each sub-job's engine over the last 60 s.",
            labels=ENGINE,
        )

    def add(self, job: Any, m: JobMeters) -> None:
        self.state.add_metric([job.job_id, job.state], 1)
        values: dict[str, float] = {
            "weight_version": job.weight_version,
            "global_step": job.global_step,
            "sampled": m.tokens_sampled,
            "trained": m.tokens_trained,
            "syncs": m.syncs,
            "sync_seconds": m.sync_seconds,
            "sync_bytes": m.sync_bytes,
        }
        if m.last_sync:  # no series before the job's first sync
            values.update(
                last_seconds=m.last_sync["seconds"],
                last_bytes=m.last_sync["bytes"],
                last_at=m.last_sync["at"],
            )
        for key, v in values.items():
            fam = self.per_job[key]
            assert isinstance(fam, GaugeMetricFamily | CounterMetricFamily)
            fam.add_metric([job.job_id], v)

    def engine(self, labels: list[str], meter: BusyMeter) -> None:
        self.busy.add_metric(labels, meter.seconds())
        self.busy_ratio.add_metric(labels, meter.ratio())

    def all(self) -> list[Metric]:
        return [self.state, *self.per_job.values(), self.busy, self.busy_ratio]
