"""Backpressure on sampling: a bound on a job's sampling requests queued or running.

Generates reach the sampler as they arrive and share its continuous batch (PROTOCOL.md §7.2),
so nothing else limits how many a job can pile up: without a bound, a runaway driver queues work
faster than the engine serves it and every call's latency grows without end. `SamplingQueue`
counts, per job, the sampling requests admitted and not yet ended — protocol `generate` calls
(HTTP, gRPC, in-process: admitted by the request queue before the request is recorded, so a
refused call is not replayed as refused) and OpenAI completions (admitted by the route before it
answers, streamed or not) — and refuses one past `limits.max_sampling_requests_per_job` with 429
`rate_limited`, `Retry-After` and `details` {`limit`, `queued`, `job_id`, `retry_after_s`}.
The bound is in the capabilities (`limits`); 0 turns it off. One instance per server (the
protocol core's `sampling`), used by the fake, the on-prem server and the gateway alike.

Which ops count comes from the method table: the sampling role's `concurrent` ops (`generate`).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator

from arctic_sdk.spec.model import MethodInfo, Role

from ..rules.errors import ProtocolError

__all__ = ["SamplingQueue", "counts"]


def counts(method: MethodInfo) -> bool:
    """Whether a call of `method` is sampling work the bound counts."""
    return method.concurrent and method.role is Role.SAMPLING


class SamplingQueue:
    def __init__(self, limit: int) -> None:
        self.limit = int(limit)
        self._queued: dict[str, int] = {}  # job id -> sampling requests admitted, not ended
        self._seconds: dict[str, float] = {}  # job id -> mean seconds a request took (EWMA)

    def queued(self, job_id: str) -> int:
        return self._queued.get(job_id, 0)

    def total(self) -> int:
        """Sampling requests admitted and not ended, over every job."""
        return sum(self._queued.values())

    def acquire(self, job_id: str) -> float:
        """Admit one sampling request of `job_id` (else 429); what `release` needs back."""
        n = self._queued.get(job_id, 0)
        if self.limit > 0 and n >= self.limit:
            # a slot frees when one of the queued requests ends; they run together, so about
            # (n - limit + 1) / limit request times from now
            mean = self._seconds.get(job_id, 1.0)
            retry = max(1, math.ceil(mean * (n - self.limit + 1) / self.limit))
            raise ProtocolError(
                "rate_limited",
                f"job {job_id} has {n} sampling requests queued or running, its limit is "
                f"{self.limit} (limits.max_sampling_requests_per_job); retry in about {retry} s",
                limit=self.limit,
                queued=n,
                job_id=job_id,
                retry_after_s=retry,
            )
        self._queued[job_id] = n + 1
        return time.monotonic()

    def release(self, job_id: str, started: float) -> None:
        n = self._queued.get(job_id, 1) - 1
        if n > 0:
            self._queued[job_id] = n
        else:
            self._queued.pop(job_id, None)
        took = time.monotonic() - started
        old = self._seconds.get(job_id)
        self._seconds[job_id] = took if old is None else 0.8 * old + 0.2 * took

    @contextlib.contextmanager
    def hold(self, job_id: str) -> Iterator[None]:
        """One admitted sampling request for the duration of the block."""
        started = self.acquire(job_id)
        try:
            yield
        finally:
            self.release(job_id, started)
