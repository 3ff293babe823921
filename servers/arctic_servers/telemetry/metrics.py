"""Prometheus metrics of a server, recorded once in the protocol core (`ProtocolCore.metrics`).

Every server (the fake gateway, the on-prem server, the Cortex gateway) runs the same core, so
the same families come from the same lines: the core calls `call_done` for every call it answers
(each HTTP request, gRPC call or in-process call), `request_queued` / `request_started` /
`request_ended` as a recorded data-plane request moves through its queue, and `result` with what
the servicer answered (tokens, weight syncs). What is read at scrape time — queue depth, chunk
budgets, jobs, engines — comes from `metrics_live.LiveCollector`; a server adds its own families
with `add_collector` (the gateway: its worker hosts). `servers/METRICS.md` lists every family.

Labels are bounded: `op` is a name of the method table, `transport` one of http / grpc /
inproc, `code` "ok" or a code of errors.proto, `route` a route template of the app (never a
path with ids in it). Job and sub-job ids label only the per-job families, for jobs that have
not ended (`metrics_live`): a job's series go away once it ends.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from arctic_sdk.spec.model import MethodInfo
from arctic_sdk.spec.tables import methods as M

__all__ = ["BusyMeter", "JobMeters", "ServerMetrics", "outcome_code"]

# No `*_created` series beside every counter and histogram: they double what a scrape carries and
# no query here needs them (prometheus_client's own switch, process-wide).
disable_created_metrics()  # type: ignore[no-untyped-call]

# Seconds: a poll or a refused call (ms) up to a long forward-backward or sync (minutes).
LATENCY_BUCKETS = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
    300.0, 900.0,
)  # fmt: skip
Key = tuple[str, str]  # (job id, request id)


class BusyMeter:
    """Seconds an engine had work: at least one command in flight on its link (`held`).

    `seconds()` is the running total (a counter); `ratio(window)` the busy fraction of the last
    `window` seconds, from the busy intervals kept for that long.
    """

    def __init__(self, window: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.window = window
        self._clock = clock
        self._n = 0
        self._since = 0.0
        self._total = 0.0
        self._spans: deque[tuple[float, float]] = deque()

    def begin(self) -> None:
        if self._n == 0:
            self._since = self._clock()
        self._n += 1

    def end(self) -> None:
        self._n -= 1
        if self._n == 0:
            now = self._clock()
            self._total += now - self._since
            self._spans.append((self._since, now))
            while self._spans and self._spans[0][1] < now - self.window:
                self._spans.popleft()

    @contextmanager
    def held(self) -> Iterator[None]:
        self.begin()
        try:
            yield
        finally:
            self.end()

    def seconds(self) -> float:
        now = self._clock()
        return self._total + (now - self._since if self._n else 0.0)

    def ratio(self) -> float:
        now = self._clock()
        start = now - self.window
        busy = sum(max(0.0, b - max(a, start)) for a, b in self._spans)
        if self._n:
            busy += now - max(self._since, start)
        return min(1.0, busy / self.window)


@dataclass
class JobMeters:
    """What the core counts per job from the servicer's answers (`ServerMetrics.result`)."""

    tokens_sampled: int = 0
    tokens_trained: int = 0
    syncs: int = 0
    sync_seconds: float = 0.0
    sync_bytes: int = 0
    last_sync: dict[str, float] = field(default_factory=dict)  # seconds, bytes, at (unix)


@dataclass
class _Live:
    op: str
    transport: str
    queued_at: float
    started_at: float | None = None


def outcome_code(error: Mapping[str, Any] | None, status: str) -> str:
    """A request's outcome as a `code` label: "ok", or its error's code."""
    if status == "completed":
        return "ok"
    return str((error or {}).get("code") or ("request_cancelled" if status == "cancelled" else ""))


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        try:
            value = float(value)
        except (TypeError, ValueError):
            return None
    value = float(value)
    return value if math.isfinite(value) else None


def sampled_tokens(result: Any) -> int:
    """Tokens a `GenerateResult` sampled: every sample's `token_ids`."""
    n = 0
    comps = result.get("results") if isinstance(result, Mapping) else None
    for comp in comps or ():
        samples = comp.get("samples") if isinstance(comp, Mapping) else None
        for s in samples or ():
            ids = s.get("token_ids") if isinstance(s, Mapping) else None
            n += len(ids) if ids is not None else 0
    return n


class ServerMetrics:
    """The families of one server, in its own registry (several servers may share a process)."""

    def __init__(self, server: str, version: str) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        Gauge("arctic_server_info", "The server (1): its kind and version.",
              ["server", "version"], registry=r).labels(server, version).set(1)  # fmt: skip
        op, outcome = ["op", "transport"], ["op", "transport", "code"]
        self.calls = Counter(
            "arctic_calls",
            "Protocol calls answered (each HTTP request, gRPC call or in-process call), by op, "
            "transport and the answer's code: ok, or the error code of errors.proto (a refusal, "
            "or a request that ended failed when the call answered its outcome).",
            outcome,
            registry=r,
        )
        self.call_seconds = self._seconds(
            "arctic_call_duration_seconds",
            "Seconds from a call's arrival at the protocol core to its answer.",
            op,
        )
        self.requests = Counter(
            "arctic_requests",
            "Recorded data-plane requests that ended, by op, transport and outcome code: ok, or "
            "the error code of the failed (or cancelled) request.",
            outcome,
            registry=r,
        )
        self.request_seconds = self._seconds(
            "arctic_request_duration_seconds",
            "Seconds from a data-plane request's recording to its end (queue wait and run).",
            op,
        )
        self.queue_wait = self._seconds(
            "arctic_request_queue_wait_seconds",
            "Seconds a data-plane request waited in the server's queue (recorded, waiting for its "
            "sequence turn) before its servicer call began.",
            op,
        )
        self.in_flight = Gauge(
            "arctic_requests_in_flight",
            "Data-plane requests recorded and not ended: state pending (queued: the queue depth) "
            "or running.",
            ["op", "state"],
            registry=r,
        )
        self.http = Counter(
            "arctic_http_responses",
            "HTTP answers of every route (protocol, OpenAI, Tinker, admin, metrics; route "
            '"unmatched" for a path no route serves), by route template, method and status.',
            ["route", "method", "status"],
            registry=r,
        )
        self.http_seconds = self._seconds(
            "arctic_http_response_duration_seconds",
            "Seconds from an HTTP request's arrival to its answer's headers.",
            ["route", "method"],
        )
        ProcessCollector(registry=r)  # process_cpu_seconds_total, process_resident_memory_bytes
        self.jobs: dict[str, JobMeters] = {}
        self._live: dict[Key, _Live] = {}

    def _seconds(self, name: str, doc: str, labels: list[str]) -> Histogram:
        return Histogram(name, doc, labels, buckets=LATENCY_BUCKETS, registry=self.registry)

    # ------------------------------------------------------------------ exposition

    def add_collector(self, collector: Collector) -> None:
        self.registry.register(collector)

    def exposition(self, accept: str = "") -> tuple[bytes, str]:
        """Every family, in the format `accept` asks for (Prometheus text 0.0.4, or OpenMetrics
        when asked: prometheus_client's negotiation), and its content type."""
        encode, content_type = choose_encoder(accept)
        return encode(self.registry), content_type

    # ------------------------------------------------------------------ calls

    def call_done(self, method: MethodInfo, transport: str, code: str, seconds: float) -> None:
        self.calls.labels(method.name, transport, code).inc()
        self.call_seconds.labels(method.name, transport).observe(seconds)

    def http_done(self, route: str, method: str, status: int, seconds: float) -> None:
        self.http.labels(route, method, str(status)).inc()
        self.http_seconds.labels(route, method).observe(seconds)

    # ------------------------------------------------------------------ the request queue

    def request_queued(self, key: Key, op: str, transport: str) -> None:
        if key in self._live:
            return
        self._live[key] = _Live(op, transport, time.monotonic())
        self.in_flight.labels(op, "pending").inc()

    def request_started(self, key: Key) -> None:
        live = self._live.get(key)
        if live is None or live.started_at is not None:
            return
        live.started_at = time.monotonic()
        self.in_flight.labels(live.op, "pending").dec()
        self.in_flight.labels(live.op, "running").inc()
        self.queue_wait.labels(live.op, live.transport).observe(live.started_at - live.queued_at)

    def request_ended(self, key: Key, code: str | None) -> None:
        """The request ended with `code` (None: handed off to the next start, not ended)."""
        live = self._live.pop(key, None)
        if live is None:
            return
        state = "pending" if live.started_at is None else "running"
        self.in_flight.labels(live.op, state).dec()
        if code is None:
            return
        self.requests.labels(live.op, live.transport, code).inc()
        took = time.monotonic() - live.queued_at
        self.request_seconds.labels(live.op, live.transport).observe(took)

    # ------------------------------------------------------------------ per job

    def job(self, job_id: str) -> JobMeters:
        m = self.jobs.get(job_id)
        if m is None:
            m = self.jobs[job_id] = JobMeters()
        return m

    def forget_jobs(self, keep: Iterable[str]) -> None:
        """Drop the meters of every job not in `keep` (the jobs that have not ended)."""
        alive = set(keep)
        for job_id in [j for j in self.jobs if j not in alive]:
            del self.jobs[job_id]

    def result(self, method: MethodInfo, job_id: str | None, body: Any, result: Any) -> None:
        """What a servicer answered: tokens sampled or trained, a weight sync's seconds and
        bytes (read from the result's `seconds` and `num_bytes`, whichever sync method ran)."""
        if not job_id or not isinstance(result, Mapping):
            return
        if method is M.GENERATE:
            self.sampled(job_id, result)
        elif method is M.FORWARD_BACKWARD:
            n = _num((result.get("metrics") or {}).get("num_tokens"))
            if n:
                self.job(job_id).tokens_trained += int(n)
        elif method is M.SYNC_WEIGHTS:
            self.synced(job_id, result)
        elif (
            method is M.OPERATION
            and isinstance(body, Mapping)
            and body.get("operation_type") == "weight-sync"
        ):
            inner = result.get("result")
            self.synced(job_id, inner if isinstance(inner, Mapping) else result)

    def sampled(self, job_id: str, result: Mapping[str, Any]) -> None:
        n = sampled_tokens(result)
        if n:
            self.job(job_id).tokens_sampled += n

    def synced(self, job_id: str, result: Mapping[str, Any]) -> None:
        seconds = _num(result.get("seconds"))
        nbytes = _num(result.get("num_bytes"))
        m = self.job(job_id)
        m.syncs += 1
        m.sync_seconds += seconds or 0.0
        m.sync_bytes += int(nbytes or 0)
        m.last_sync = {"seconds": seconds or 0.0, "bytes": nbytes or 0.0, "at": time.time()}
