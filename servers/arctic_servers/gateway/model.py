"""Jobs and sub-jobs of the gateway: their API form (`jobs.proto` Job) and the jobs table.

The jobs table lives in the gateway's SQLite file beside the protocol layer's `requests`,
`chunk_groups` and `chunks` tables: every job, with its sub-jobs and their workers, as one JSON
document a row. Every write commits (WAL, synchronous=FULL) before it returns, so a job is on
disk before CreateJob answers and a state change before anyone is told about it.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..protocol.errors import ProtocolError

TERMINAL = frozenset({"cancelled", "terminated", "failed"})
STATES = ("pending", "placing", "initializing", "running", "cancelled", "terminated", "failed")


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


@dataclass
class SubJob:
    sub_job_id: str
    role: str
    index: int
    model_name: str
    dtype: str
    seed: int
    config: dict[str, Any]
    n_gpus: int = 1
    state: str = "pending"
    reason: str = ""
    weight_version: int = 0
    # The worker's record (supervisor.py): backend, address, authkey, pid, log, spec, info.
    worker: dict[str, Any] = field(default_factory=dict)

    @property
    def max_seq_len(self) -> int:
        return int(self.config.get("max_seq_len") or 0)

    @property
    def vocab_size(self) -> int:
        return int((self.worker.get("info") or {}).get("vocab_size") or 0)

    def to_json(self) -> dict[str, Any]:
        return {
            "sub_job_id": self.sub_job_id,
            "job_type": self.role,
            "state": self.state,
            "reason": self.reason,
            "model_name": self.model_name,
        }


@dataclass
class Job:
    job_id: str
    owner: str  # sha256 of the token that created it ("" without auth)
    sub_jobs: list[SubJob]
    labels: dict[str, str]
    comment: str
    experiment_name: str
    lease_seconds: int
    create_key: str = ""  # the CreateJob Idempotency-Key (scope: the owner)
    state: str = "pending"
    reason: str = ""
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    ended_at: float = 0.0
    lease_expires: float = 0.0
    placed: bool = False  # holds capacity (from placing until its workers stopped)
    history: list[dict[str, Any]] = field(default_factory=list)
    global_step: int = 0
    weight_version: int = 0
    last_loss: float = 0.0
    # request id -> the weight version its sync assigns (stored before the sync loads weights,
    # so a sync collected after a restart assigns the same version)
    pending_syncs: dict[str, int] = field(default_factory=dict)
    purged: bool = False  # its requests and chunk groups were dropped after the retention window

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    @property
    def n_gpus(self) -> int:
        return sum(s.n_gpus for s in self.sub_jobs)

    def sub_job(self, role: str) -> SubJob | None:
        return next((s for s in self.sub_jobs if s.role == role), None)

    def find_sub_job(self, sub_job_id: str) -> SubJob | None:
        return next((s for s in self.sub_jobs if s.sub_job_id == sub_job_id), None)

    def enter(self, state: str, reason: str = "") -> None:
        self.state, self.reason = state, reason
        self.updated_at = time.time()
        if state in TERMINAL:
            self.ended_at = self.updated_at
        self.history.append({"state": state, "reason": reason, "at": rfc3339(self.updated_at)})

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "state": self.state,
            "reason": self.reason,
            "sub_jobs": [s.to_json() for s in self.sub_jobs],
            "labels": dict(self.labels),
            "comment": self.comment,
            "experiment_name": self.experiment_name,
            "created_at": rfc3339(self.created_at),
            "updated_at": rfc3339(self.updated_at),
            "lease_expires_at": rfc3339(self.lease_expires) if self.lease_expires else "",
            "global_step": self.global_step,
            "weight_version": self.weight_version,
        }

    def to_doc(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_doc(doc: dict[str, Any]) -> Job:
        doc = dict(doc)
        subs = [SubJob(**s) for s in doc.pop("sub_jobs")]
        return Job(sub_jobs=subs, **doc)


def terminal_error(job: Job) -> ProtocolError:
    return ProtocolError(
        "job_terminal",
        f"job {job.job_id} has ended ({job.state}: {job.reason or 'no reason'})",
        job_id=job.job_id,
        state=job.state,
        reason=job.reason,
    )


def not_running_error(job: Job) -> ProtocolError:
    why = f" ({job.reason})" if job.reason else ""
    return ProtocolError(
        "job_not_running",
        f"job {job.job_id} is {job.state}, not running{why}",
        job_id=job.job_id,
        state=job.state,
        reason=job.reason,
    )


_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
  job_id TEXT PRIMARY KEY, owner TEXT NOT NULL, state TEXT NOT NULL, create_key TEXT NOT NULL,
  created_at REAL NOT NULL, ended_at REAL NOT NULL, doc TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS jobs_key ON jobs (owner, create_key);
"""


class JobStore:
    def __init__(self, path: str | Path) -> None:
        self.conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=FULL")
        self.conn.executescript(_SCHEMA)
        self.lock = threading.Lock()

    def close(self) -> None:
        self.conn.close()

    def put(self, job: Job) -> None:
        doc = json.dumps(job.to_doc(), separators=(",", ":"))
        with self.lock:
            self.conn.execute(
                "INSERT OR REPLACE INTO jobs VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    job.job_id,
                    job.owner,
                    job.state,
                    job.create_key,
                    job.created_at,
                    job.ended_at,
                    doc,
                ),
            )

    def all(self) -> list[Job]:
        with self.lock:
            rows = self.conn.execute("SELECT doc FROM jobs ORDER BY created_at").fetchall()
        return [Job.from_doc(json.loads(r[0])) for r in rows]

    def delete(self, job_id: str) -> None:
        with self.lock:
            self.conn.execute("DELETE FROM jobs WHERE job_id = ?", (job_id,))
