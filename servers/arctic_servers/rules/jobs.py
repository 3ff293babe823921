"""Job bookkeeping every server shares: states, sub-job ids and targeting, visibility, answers.

One source of truth for what `jobs.proto` and PROTOCOL.md §3.4 and §10 say of jobs, used by the
fake gateway, the on-prem server and the Cortex gateway: the job states and which of them are
terminal, role names, the sub-job id `{job_id}:{role}:{index}`, the owner check (another token's
job is `job_not_found`, a 404), the sub-job an op runs on (`X-Arctic-Sub-Job`, else the op's
role), and the JSON of a `Job`, a `SubJob`, a `ListJobs` page, `CancelJob` and `GetCapacity`.
Each server keeps its own scheduling, workers and storage; `JobRecord` holds the fields a `Job`
answer is made of and is the base of each server's job.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, Protocol, TypeVar

from arctic_sdk.spec.model import STANDARD_CONFIG_KEYS, MethodInfo, Role
from arctic_sdk.spec.tables import methods as M

from .errors import ProtocolError
from .states import JOB, move_sub_job

STATES = JOB.states  # the moves between them: `states.py`
TERMINAL = JOB.terminal
ROLES = {
    "training": "training",
    "sampling": "sampling",
    "log_prob": "log_prob",
    "log_probability": "log_prob",
}
# The keys of a sub-job's `training_config` / `inference_config` every server knows (jobs.proto);
# a server may accept more (and advertises them), and refuses the rest with `unsupported_option`.
TRAINING_KEYS = STANDARD_CONFIG_KEYS["training"]
INFERENCE_KEYS = STANDARD_CONFIG_KEYS["sampling"]


def config_keys_json(keys: Mapping[str, frozenset[str]] | None = None) -> dict[str, list[str]]:
    """The capabilities' `config_keys` (jobs.proto `SubJobConfigKeys`): per role, the keys a
    server accepts (default: the standard ones)."""
    return {role: sorted((keys or STANDARD_CONFIG_KEYS)[role]) for role in STANDARD_CONFIG_KEYS}


CANCEL_REASON = "cancelled by CancelJob"
LEASE_EXPIRED = "lease expired"
# Data-plane ops a job that is not running may still serve (checkpoint files outlive compute).
ANY_STATE = frozenset(
    {M.LIST_CHECKPOINTS, M.EXPORT_CHECKPOINT, M.DOWNLOAD_CHECKPOINT_FILE, M.DELETE_CHECKPOINT}
)
# Roles an op may be pointed at with X-Arctic-Sub-Job (default: its own role only).
TARGETS: dict[MethodInfo, frozenset[str]] = {
    M.FORWARD: frozenset({"training", "log_prob", "sampling"}),
    M.LOG_PROBS: frozenset({"training", "log_prob", "sampling"}),
    M.GENERATE: frozenset({"sampling"}),
    M.RESET_PREFIX_CACHE: frozenset({"sampling", "log_prob"}),
    M.SLEEP_INFERENCE: frozenset({"sampling", "log_prob"}),
    M.WAKE_INFERENCE: frozenset({"sampling", "log_prob"}),
}


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def role_of(value: Any) -> str | None:
    """ "training" / "TRAINING" / "SUB_JOB_TYPE_TRAINING" / "log_probability" -> role name."""
    if not isinstance(value, str):
        return None
    return ROLES.get(value.lower().removeprefix("sub_job_type_"))


def state_name(value: Any) -> str:
    """A `ListJobs` `state` filter ("running", "JOB_STATE_RUNNING", "canceled") -> state name."""
    s = str(value).lower().removeprefix("job_state_")
    s = {"canceled": "cancelled"}.get(s, s)
    if s not in STATES:
        raise ProtocolError(
            "invalid_argument",
            f"field state: {value!r} is not one of {list(STATES)}",
            field="state",
            expected=list(STATES),
        )
    return s


def sub_job_ids(job_id: str, roles: Iterable[str]) -> list[tuple[str, int]]:
    """`(sub_job_id, index)` of each sub-job, in order: the index counts within its role."""
    counts: dict[str, int] = {}
    out = []
    for role in roles:
        index = counts.get(role, 0)
        counts[role] = index + 1
        out.append((f"{job_id}:{role}:{index}", index))
    return out


class SubJobLike(Protocol):
    @property
    def sub_job_id(self) -> str: ...

    @property
    def role(self) -> str: ...


S = TypeVar("S", bound=SubJobLike)


@dataclass
class SubJobRecord:
    """What every server records of a sub-job; each server's sub-job adds its own fields."""

    sub_job_id: str
    role: str  # training, sampling or log_prob
    index: int  # its position among the job's sub-jobs of its role
    model_name: str
    config: dict[str, Any]  # its training_config / inference_config, checked

    @property
    def max_seq_len(self) -> int:
        return int(self.config.get("max_seq_len") or 0)


def sub_job_json(
    sub_job_id: str, role: str, state: str, reason: str, model_name: str
) -> dict[str, Any]:
    """The JSON of a `SubJob` (jobs.proto)."""
    return {
        "sub_job_id": sub_job_id,
        "job_type": role,
        "state": state,
        "reason": reason,
        "model_name": model_name,
    }


@dataclass
class JobRecord(Generic[S]):
    """The fields of a `Job` answer; each server's job extends it (`sub_job_json` too)."""

    job_id: str
    owner: str | None  # the token (or its digest) that created it; None: visible to every token
    sub_jobs: list[S]
    labels: dict[str, str]
    comment: str
    experiment_name: str
    lease_seconds: int
    state: str = "pending"
    reason: str = ""
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    lease_expires: float = 0.0
    placed: bool = False  # holds capacity
    history: list[dict[str, Any]] = field(default_factory=list)
    global_step: int = 0
    weight_version: int = 0
    last_loss: float = 0.0

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    def sub_job(self, role: str) -> S | None:
        return next((s for s in self.sub_jobs if s.role == role), None)

    def find_sub_job(self, sub_job_id: str) -> S | None:
        return next((s for s in self.sub_jobs if s.sub_job_id == sub_job_id), None)

    def enter(self, state: str, reason: str = "") -> None:
        """Move to `state` (checked against `states.JOB`; the first entry starts the job),
        recorded in `history`."""
        self.state = JOB.check(self.state, state) if self.history else JOB.start(state)
        self.reason = reason
        self.updated_at = time.time()
        self.history.append({"state": state, "reason": reason, "at": rfc3339(self.updated_at)})

    def sub_job_json(self, sub: S) -> dict[str, Any]:
        raise NotImplementedError

    def to_json(self) -> dict[str, Any]:
        """The JSON of a `Job` (jobs.proto)."""
        return {
            "job_id": self.job_id,
            "state": self.state,
            "reason": self.reason,
            "sub_jobs": [self.sub_job_json(s) for s in self.sub_jobs],
            "labels": dict(self.labels),
            "comment": self.comment,
            "experiment_name": self.experiment_name,
            "created_at": rfc3339(self.created_at),
            "updated_at": rfc3339(self.updated_at),
            "lease_expires_at": rfc3339(self.lease_expires) if self.lease_expires else "",
            "global_step": self.global_step,
            "weight_version": self.weight_version,
        }


J = TypeVar("J", bound=JobRecord[Any])


class StatefulSubJob(Protocol):
    state: str
    reason: str


# ---------------------------------------------------------------------- visibility and state


def owns(job: JobRecord[Any], owner: str | None) -> bool:
    return job.owner is None or job.owner == owner


def visible_job(jobs: Mapping[str, J], job_id: str, owner: str | None) -> J:
    """The job, if `owner` may see it; another token's job does not exist for it (404)."""
    job = jobs.get(job_id)
    if job is None or not owns(job, owner):
        raise ProtocolError(
            "job_not_found", f"no job {job_id!r} is visible to this token", job_id=job_id
        )
    return job


def _job_error(code: str, message: str, job: JobRecord[Any]) -> ProtocolError:
    return ProtocolError(code, message, job_id=job.job_id, state=job.state, reason=job.reason)


def terminal_error(job: JobRecord[Any]) -> ProtocolError:
    why = job.reason or "no reason"
    return _job_error("job_terminal", f"job {job.job_id} has ended ({job.state}: {why})", job)


def not_running_error(job: JobRecord[Any]) -> ProtocolError:
    why = f" ({job.reason})" if job.reason else ""
    return _job_error("job_not_running", f"job {job.job_id} is {job.state}, not running{why}", job)


def require_running(job: JobRecord[Any], method: MethodInfo) -> None:
    """Data-plane ops need a running job, except the checkpoint ops of `ANY_STATE`."""
    if method in ANY_STATE:
        return
    if job.terminal:
        raise terminal_error(job)
    if job.state != "running":
        raise not_running_error(job)


def sub_job_by_id(job: JobRecord[S], sub_job_id: Any) -> S:
    """The sub-job `sub_job_id` names, or `sub_job_not_found`."""
    sub = job.find_sub_job(str(sub_job_id))
    if sub is None:
        raise ProtocolError(
            "sub_job_not_found",
            f"no sub-job {sub_job_id!r} in job {job.job_id}",
            sub_job_id=sub_job_id,
            job_id=job.job_id,
        )
    return sub


def target(job: JobRecord[S], method: MethodInfo, sub_job_id: str | None) -> S:
    """The sub-job an op runs on: `X-Arctic-Sub-Job`, else the op's role (PROTOCOL.md §3.4)."""
    m = method
    role = "training" if m.role is Role.GATEWAY else m.role.value
    allowed = TARGETS.get(m, frozenset({role}))
    if sub_job_id:
        sub = sub_job_by_id(job, sub_job_id)
        if sub.role not in allowed:
            raise ProtocolError(
                "invalid_argument",
                f"header X-Arctic-Sub-Job: {m.name} cannot run on {sub.role} sub-job "
                f"{sub.sub_job_id}",
                field="X-Arctic-Sub-Job",
                expected=sorted(allowed),
            )
        return sub
    found = job.sub_job(role)
    if found is None and role == "log_prob":
        found = job.sub_job("training")
    if found is None:
        raise ProtocolError(
            "sub_job_not_found",
            f"job {job.job_id} has no {role} sub-job for {m.name}",
            job_id=job.job_id,
            role=role,
        )
    return found


def end_sub_jobs(subs: Iterable[StatefulSubJob], state: str, reason: str) -> None:
    """A job ends: its sub-jobs that had not failed end with it (`terminated` when it failed)."""
    for s in subs:
        if s.state != "failed":
            move_sub_job(s, "terminated" if state == "failed" else state, s.reason or reason)


# ---------------------------------------------------------------------- control-plane answers


def list_jobs(
    jobs: Iterable[JobRecord[Any]], owner: str | None, body: Mapping[str, Any]
) -> dict[str, Any]:
    """A `ListJobs` page: the jobs `owner` may see, filtered by `state` and `label=key=value`."""
    state = state_name(body["state"]) if body.get("state") else ""
    wanted: list[tuple[str, str]] = []
    for item in body.get("label") or []:
        key, sep, value = str(item).partition("=")
        if not sep or not key:
            raise ProtocolError(
                "invalid_argument",
                f"field label: {item!r} is not key=value",
                field="label",
                expected="key=value",
            )
        wanted.append((key, value))
    return {
        "jobs": [
            job.to_json()
            for job in jobs
            if owns(job, owner)
            and (not state or job.state == state)
            and all(job.labels.get(k) == v for k, v in wanted)
        ]
    }


def cancel_job(job: J, end: Callable[[J, str, str], None]) -> dict[str, Any]:
    """`CancelJob`: an ended job answers `job_terminal`; else it ends `cancelled`."""
    if job.terminal:
        raise terminal_error(job)
    end(job, "cancelled", CANCEL_REASON)
    return {"job": job.to_json()}


def capacity(total: int, in_use: int, queued: int) -> dict[str, Any]:
    """The `GetCapacity` answer."""
    return {
        "has_reservation": True,
        "max_total_gpus": total,
        "in_use_gpus": in_use,
        "available_gpus": max(0, total - in_use),
        "queued_jobs": queued,
    }


def check_lease(seconds: int, field_name: str, maximum: int) -> None:
    if seconds < 0 or seconds > maximum:
        raise ProtocolError(
            "invalid_argument",
            f"field {field_name}: {seconds} is not in [0, {maximum}]",
            field=field_name,
            expected=f"0..{maximum}",
        )
