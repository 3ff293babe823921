"""Control-plane bodies of the fake gateway: CreateJob, over the fake engine's config checks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from arctic_servers.engines.fake.config import bad, sub_jobs_of
from arctic_servers.engines.fake.state import Job

from .jobs import JobManager


def create(jobs: JobManager, owner: str | None, body: Mapping[str, Any]) -> Job:
    sub_jobs = sub_jobs_of(body, jobs.max_total_gpus)
    labels = dict(body.get("labels") or {})
    for k in labels:
        if not k:
            raise bad("labels", "a label key is empty", expected="non-empty keys")
    lease = int(body.get("lease_seconds") or 0)
    jobs.check_lease(lease, "lease_seconds")
    return jobs.create(
        owner,
        sub_jobs,
        labels=labels,
        comment=str(body.get("comment") or ""),
        experiment_name=str(body.get("experiment_name") or ""),
        lease_seconds=lease or jobs.lease_default_seconds,
    )
