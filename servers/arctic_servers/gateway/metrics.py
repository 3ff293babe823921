"""The gateway's own metric families: its worker hosts and what happened to them.

The gateway never restarts a lost worker (its sub-job fails, and with it the job); what it does
is launch worker hosts, re-attach to them after its own restart, and reconnect to a live one
whose link broke. `Supervisor.events` counts each; `WorkerHostsCollector` reads them and the
worker hosts of the jobs that have not ended at scrape time (servers/METRICS.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

if TYPE_CHECKING:
    from .jobs import JobManager

EVENTS = ("launched", "reattached", "reconnected", "lost")
HOST_STATES = ("connected", "reconnecting", "lost", "unattached")


class WorkerHostsCollector:
    def __init__(self, jobs: JobManager) -> None:
        self.jobs = jobs

    def collect(self) -> Iterator[Metric]:
        sup = self.jobs.supervisor
        hosts = GaugeMetricFamily(
            "arctic_gateway_worker_hosts",
            "Worker hosts of the jobs that have not ended, by backend (local, ray) and the "
            "state of the gateway's link to them: connected, reconnecting (the link broke, the "
            "worker lives), lost (the worker is gone) or unattached (not connected yet).",
            labels=["backend", "state"],
        )
        counts: dict[tuple[str, str], int] = {}
        for job in self.jobs.jobs.values():
            if job.terminal:
                continue
            for sub in job.sub_jobs:
                if not sub.worker:
                    continue
                backend = str(sub.worker.get("backend") or "local")
                client = sup.client(sub)
                if client is None:
                    state = "unattached"
                elif client.failure is not None:
                    state = "lost"
                else:
                    state = "connected" if client.connected else "reconnecting"
                counts[(backend, state)] = counts.get((backend, state), 0) + 1
        for (backend, state), n in sorted(counts.items()):
            hosts.add_metric([backend, state], n)
        yield hosts
        events = CounterMetricFamily(
            "arctic_gateway_worker_events",
            "What happened to worker hosts since this gateway started: launched, reattached "
            "(after a gateway restart), reconnected (a broken link to a live worker), lost (a "
            "worker gone: its sub-job and job failed; the gateway does not restart it).",
            labels=["event"],
        )
        for event in EVENTS:
            events.add_metric([event], sup.events.get(event, 0))
        yield events
