"""Jobs and sub-jobs of the gateway: their API form (`jobs.proto` Job) and the jobs table.

The jobs table lives in the gateway's SQLite file beside the protocol layer's `requests`,
`chunk_groups` and `chunks` tables: every job, with its sub-jobs and their workers, as one JSON
document a row. Every write commits (WAL, synchronous=FULL) before it returns, so a job is on
disk before CreateJob answers and a state change before anyone is told about it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..protocol.sqlite_store import SqliteDb
from ..rules import jobs as pj
from ..rules.jobs import JobRecord, SubJobRecord


@dataclass
class SubJob(SubJobRecord):
    dtype: str = "float32"
    seed: int = 0
    n_gpus: int = 1
    state: str = "pending"
    reason: str = ""
    weight_version: int = 0
    # The worker's record (supervisor.py): backend, address, authkey, pid, log, spec, info.
    worker: dict[str, Any] = field(default_factory=dict)

    @property
    def vocab_size(self) -> int:
        return int((self.worker.get("info") or {}).get("vocab_size") or 0)


@dataclass
class Job(JobRecord[SubJob]):
    owner: str  # sha256 of the token that created it ("" without auth)
    create_key: str = ""  # the CreateJob Idempotency-Key (scope: the owner)
    ended_at: float = 0.0
    # request id -> the weight version its sync assigns (stored before the sync loads weights,
    # so a sync collected after a restart assigns the same version)
    pending_syncs: dict[str, int] = field(default_factory=dict)
    purged: bool = False  # its requests and chunk groups were dropped after the retention window
    pool: str = ""  # the LoRA pool its adapter trains and samples in ("": its own workers)

    @property
    def n_gpus(self) -> int:
        return sum(s.n_gpus for s in self.sub_jobs)

    def enter(self, state: str, reason: str = "") -> None:
        super().enter(state, reason)
        if self.terminal:
            self.ended_at = self.updated_at

    def sub_job_json(self, sub: SubJob) -> dict[str, Any]:
        return pj.sub_job_json(sub.sub_job_id, sub.role, sub.state, sub.reason, sub.model_name)

    def to_doc(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_doc(doc: dict[str, Any]) -> Job:
        doc = dict(doc)
        subs = [SubJob(**s) for s in doc.pop("sub_jobs")]
        return Job(sub_jobs=subs, **doc)


_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
  job_id TEXT PRIMARY KEY, owner TEXT NOT NULL, state TEXT NOT NULL, create_key TEXT NOT NULL,
  created_at REAL NOT NULL, ended_at REAL NOT NULL, doc TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS jobs_key ON jobs (owner, create_key);
CREATE TABLE IF NOT EXISTS lora_pools (pool_id TEXT PRIMARY KEY, doc TEXT NOT NULL);
"""


class JobStore(SqliteDb):
    """The gateway's job table, in the server's state file (`protocol.sqlite_store.SqliteDb`)."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(path, _SCHEMA)

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

    # the LoRA pools (gateway/lora_pools.py): one JSON document a pool, its engines' workers in it

    def put_pool(self, pool_id: str, doc: dict[str, Any]) -> None:
        text = json.dumps(doc, separators=(",", ":"))
        with self.lock:
            self.conn.execute("INSERT OR REPLACE INTO lora_pools VALUES (?, ?)", (pool_id, text))

    def pools(self) -> list[dict[str, Any]]:
        with self.lock:
            rows = self.conn.execute("SELECT doc FROM lora_pools").fetchall()
        return [dict(json.loads(r[0])) for r in rows]

    def delete_pool(self, pool_id: str) -> None:
        with self.lock:
            self.conn.execute("DELETE FROM lora_pools WHERE pool_id = ?", (pool_id,))
