"""Jobs (PROTOCOL.md §10): waiting for `running` with the state shown, and lease renewal.

`wait_running` polls `GetJob` with the poll backoff until the job is `running`, reporting each
state change (`pending`, `placing`, `initializing`) as progress; a terminal state raises
`JobTerminalError` (`job_terminal`) with the job's reason and its sub-jobs' states, and running
out of time raises `ArcticTimeoutError` naming the last state seen. Both `wait_until_running` and
a data-plane call refused with `job_not_running` (`retry.exchange`) wait this way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from ..config import PollConfig
from ..errors import ArcticTimeoutError, error_from_code
from ..spec.tables import methods as M
from ..spec.tables.error_codes import ErrorCode
from .effects import Flow, Progress, Sleep
from .replies import Exchange, Reply, Value

log = logging.getLogger("arctic_sdk")

TERMINAL = frozenset({"cancelled", "terminated", "failed"})
_SYNONYMS = {"canceled": "cancelled", "done": "terminated"}


def job_state(raw: Any) -> str:
    """`"JOB_STATE_RUNNING"`, `"Running"`... -> `"running"`."""
    s = str(raw or "").strip().lower().removeprefix("job_state_")
    return _SYNONYMS.get(s, s)


def job_of(value: Any) -> Mapping[str, Any]:
    """The `Job` object of a `GetJobResponse` (or a bare job, as some servers answer)."""
    if isinstance(value, Mapping):
        inner = value.get("job")
        return inner if isinstance(inner, Mapping) else value
    return {}


def describe(job: Mapping[str, Any]) -> str:
    """`initializing (training: running, sampling: initializing)`."""
    state = job_state(job.get("state"))
    subs = [
        f"{job_state(s.get('job_type')) or s.get('sub_job_id', '?')}: {job_state(s.get('state'))}"
        for s in job.get("sub_jobs") or ()
        if isinstance(s, Mapping)
    ]
    text = state or "unknown"
    if subs:
        text += f" ({', '.join(subs)})"
    if job.get("reason"):
        text += f" - {job['reason']}"
    return text


def get_job_exchange(job_id: str) -> Exchange:
    return Exchange(
        method=M.GET_JOB, job_id=job_id, path_params={"job_id": job_id}, message={"job_id": job_id}
    )


def wait_running(
    job_id: str,
    *,
    send: Callable[[Exchange], Flow[Reply]],
    cfg: PollConfig,
    clock: Callable[[], float],
    timeout: float,
) -> Flow[dict[str, Any]]:
    """Poll the job until it is running; returns the `Job` object."""
    deadline = clock() + timeout
    delay = cfg.initial
    last = ""
    key = f"job:{job_id}"
    yield Progress(key, "start", desc=f"job {job_id}: waiting", unit="s")
    started = clock()
    text, state = "", ""
    while True:
        try:
            reply = yield from send(get_job_exchange(job_id))
        except ArcticTimeoutError:
            yield Progress(key, "close")
            raise ArcticTimeoutError(
                f"job {job_id} is not running after {timeout:g} s "
                f"(last state: {text or 'unknown, GetJob never answered'})",
                details={"state": state},
            ) from None
        job = dict(job_of(reply.value if isinstance(reply, Value) else {}))
        state = job_state(job.get("state"))
        text = describe(job)
        if text != last:
            log.info(
                "job %s: %s",
                job_id,
                text,
                extra={"arctic_job_id": job_id, "arctic_job_state": state},
            )
            yield Progress(key, "update", desc=f"job {job_id}: {text}", n=clock() - started)
            started = clock()
            last = text
        if state == "running":
            yield Progress(key, "close")
            return job
        if state in TERMINAL:
            yield Progress(key, "close")
            raise error_from_code(
                ErrorCode.JOB_TERMINAL,
                f"job {job_id} ended while starting: {text}",
                details={"state": state, "reason": job.get("reason", ""), "job": job},
            )
        remaining = deadline - clock()
        if remaining <= 0:
            yield Progress(key, "close")
            raise ArcticTimeoutError(
                f"job {job_id} is not running after {timeout:g} s (state: {text})",
                details={"state": state},
            )
        yield Sleep(min(delay, remaining))
        delay = min(delay * cfg.multiplier, cfg.max_interval)
