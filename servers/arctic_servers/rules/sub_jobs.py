"""Sub-jobs named in a request body, as every server checks them: a training sub-job by id
(`jobs.sub_job_by_id`: `sub_job_not_found` when there is none), and the source and targets of a
weight sync (PROTOCOL.md §3.4, training.proto `SyncWeightsRequest`): one training sub-job into
sampling or log_prob ones; and the 4xx naming the body field it is about (`field_error`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .errors import ProtocolError
from .jobs import JobRecord, S, sub_job_by_id


def field_error(
    path: str, message: str, code: str = "invalid_argument", **details: Any
) -> ProtocolError:
    """A 4xx naming the body field it is about: `field {path}: {message}`."""
    return ProtocolError(code, f"field {path}: {message}", field=path, **details)


def refuse_unknown_keys(
    value: Mapping[str, Any], known: Iterable[str], path: str, what: str
) -> None:
    """`unsupported_option` naming every key of the object at `path` outside `known`."""
    names = sorted(known)
    unknown = sorted(str(k) for k in value if k not in names)
    if unknown:
        opts = [f"{path}.{k}" for k in unknown]
        raise ProtocolError(
            "unsupported_option",
            f"unknown {what} key(s): {', '.join(opts)}; known: {names}",
            options=opts,
            field=opts[0],
        )


def check_training_sub_job(job: JobRecord[S], sub_job_id: Any, path: str) -> S:
    """The sub-job `sub_job_id` names, which must exist and be a training one."""
    sub = sub_job_by_id(job, sub_job_id)
    if sub.role != "training":
        raise field_error(
            path, f"{sub_job_id} is a {sub.role} sub-job", expected="a training sub-job"
        )
    return sub


def check_sync_sub_jobs(job: JobRecord[Any], body: Mapping[str, Any], path: str) -> None:
    """A weight sync's `source_sub_job_id` (training) and `target_sub_job_ids` (not training);
    `path` is the prefix of their field names (`payload.` in the `/operation` envelope)."""
    src = body.get("source_sub_job_id")
    if src:
        check_training_sub_job(job, src, path + "source_sub_job_id")
    for i, tid in enumerate(body.get("target_sub_job_ids") or []):
        if sub_job_by_id(job, tid).role == "training":
            raise field_error(
                f"{path}target_sub_job_ids[{i}]",
                f"{tid} is a training sub-job",
                expected="sampling or log_prob sub-jobs",
            )


def sync_sub_jobs(job: JobRecord[S], body: Mapping[str, Any]) -> tuple[S, list[S]]:
    """A weight sync's source (default: the training sub-job) and the targets that exist
    (default: every sampling sub-job; a log_prob sub-job — the reference model — only when the
    body names it, so it stays frozen unless a caller asks)."""
    src_id = body.get("source_sub_job_id")
    src = job.find_sub_job(str(src_id)) if src_id else job.sub_job("training")
    if src is None:
        raise ProtocolError(
            "sub_job_not_found",
            f"job {job.job_id} has no training sub-job",
            job_id=job.job_id,
            role="training",
        )
    ids = body.get("target_sub_job_ids") or [
        s.sub_job_id for s in job.sub_jobs if s.role == "sampling"
    ]
    targets = [t for t in (job.find_sub_job(str(i)) for i in ids) if t is not None]
    return src, targets
