"""SQLite implementations of the request and chunk stores (durable across restarts).

Every write commits before it returns, so state is on disk before the client is acknowledged.
One connection per store, used from the server's event-loop thread.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path

from ..rules.states import REQUEST
from .stores import GroupRecord, RequestRecord

_SCHEMA = """
CREATE TABLE IF NOT EXISTS requests (
  job_id TEXT NOT NULL, request_id TEXT NOT NULL, op TEXT NOT NULL, status TEXT NOT NULL,
  identity_kind TEXT NOT NULL, identity TEXT NOT NULL, body_hash TEXT NOT NULL, seq INTEGER,
  result_frame BLOB, error TEXT, created_at REAL NOT NULL, updated_at REAL NOT NULL,
  token_hash TEXT NOT NULL, body_frame BLOB, sub_job_id TEXT NOT NULL DEFAULT '',
  fetched_at REAL, expired INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (job_id, request_id));
CREATE INDEX IF NOT EXISTS requests_identity ON requests (job_id, identity_kind, identity);
CREATE INDEX IF NOT EXISTS requests_seq ON requests (job_id, seq);
CREATE INDEX IF NOT EXISTS requests_status ON requests (status);
CREATE TABLE IF NOT EXISTS chunk_groups (
  job_id TEXT NOT NULL, group_id TEXT NOT NULL, frame_sha256 TEXT NOT NULL,
  total_chunks INTEGER NOT NULL, frame_size_bytes INTEGER NOT NULL, operation TEXT NOT NULL,
  received TEXT NOT NULL, complete INTEGER NOT NULL, request_id TEXT NOT NULL,
  created_at REAL NOT NULL, PRIMARY KEY (job_id, group_id));
-- sequence numbers refused for good (never run): they count as executed after a restart
CREATE TABLE IF NOT EXISTS refused_seqs (
  job_id TEXT NOT NULL, seq INTEGER NOT NULL, PRIMARY KEY (job_id, seq));
CREATE TABLE IF NOT EXISTS chunks (
  job_id TEXT NOT NULL, group_id TEXT NOT NULL, idx INTEGER NOT NULL, frame BLOB NOT NULL,
  PRIMARY KEY (job_id, group_id, idx));
"""

_REQ_COLS = (
    "job_id, request_id, op, status, identity_kind, identity, body_hash, seq, result_frame, "
    "error, created_at, updated_at, token_hash, body_frame, sub_job_id, fetched_at, expired"
)
_NCOLS = 17
_OPEN = "status IN ({})".format(
    ", ".join(f"'{s}'" for s in REQUEST.states if s not in REQUEST.terminal)
)


class SqliteDb:
    """One SQLite connection of a server's state file: WAL, every commit synced (a crash loses
    no acknowledged write), `schema` created if missing, one lock for its users' threads. The
    request and chunk stores here and the gateway's job table (`gateway/model.py`) open it."""

    def __init__(self, path: str | Path, schema: str = _SCHEMA) -> None:
        self.conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=FULL")
        self.conn.executescript(schema)
        self.lock = threading.Lock()

    def close(self) -> None:
        self.conn.close()


def _row_to_request(row: tuple[object, ...]) -> RequestRecord:
    (job_id, request_id, op, status, kind, identity, body_hash, seq, frame, error, c, u, tok) = row[
        :13
    ]
    body, sub_job_id, fetched, expired = row[13:]
    return RequestRecord(
        job_id=str(job_id),
        request_id=str(request_id),
        op=str(op),
        status=str(status),
        identity_kind=str(kind),
        identity=str(identity),
        body_hash=str(body_hash),
        seq=int(seq) if isinstance(seq, int) else None,
        result_frame=bytes(frame) if isinstance(frame, bytes | bytearray | memoryview) else None,
        error=json.loads(error) if isinstance(error, str) else None,
        created_at=float(c) if isinstance(c, int | float) else 0.0,
        updated_at=float(u) if isinstance(u, int | float) else 0.0,
        token_hash=str(tok),
        body_frame=bytes(body) if isinstance(body, bytes | bytearray | memoryview) else None,
        sub_job_id=str(sub_job_id or ""),
        fetched_at=float(fetched) if isinstance(fetched, int | float) else None,
        expired=bool(expired),
    )


class SqliteRequestStore:
    durable = True

    def __init__(self, path: str | Path) -> None:
        self._db = SqliteDb(path)

    def close(self) -> None:
        self._db.close()

    def _write(self, rec: RequestRecord, verb: str) -> None:
        values = (
            rec.job_id,
            rec.request_id,
            rec.op,
            rec.status,
            rec.identity_kind,
            rec.identity,
            rec.body_hash,
            rec.seq,
            rec.result_frame,
            json.dumps(rec.error) if rec.error is not None else None,
            rec.created_at,
            rec.updated_at,
            rec.token_hash,
            rec.body_frame,
            rec.sub_job_id,
            rec.fetched_at,
            int(rec.expired),
        )
        with self._db.lock:
            self._db.conn.execute(
                f"{verb} INTO requests ({_REQ_COLS}) VALUES ({', '.join('?' * _NCOLS)})", values
            )

    def create(self, rec: RequestRecord) -> None:
        try:
            self._write(rec, "INSERT")
        except sqlite3.IntegrityError as exc:
            raise KeyError(f"request {rec.request_id} exists in job {rec.job_id}") from exc

    def update(self, rec: RequestRecord) -> None:
        import time

        rec.updated_at = time.time()
        self._write(rec, "INSERT OR REPLACE")

    def _one(self, where: str, args: tuple[object, ...]) -> RequestRecord | None:
        with self._db.lock:
            row = self._db.conn.execute(
                f"SELECT {_REQ_COLS} FROM requests WHERE {where} LIMIT 1", args
            ).fetchone()
        return _row_to_request(row) if row is not None else None

    def get(self, job_id: str, request_id: str) -> RequestRecord | None:
        return self._one("job_id = ? AND request_id = ?", (job_id, request_id))

    def find_identity(self, job_id: str, kind: str, identity: str) -> RequestRecord | None:
        return self._one(
            "job_id = ? AND identity_kind = ? AND identity = ?", (job_id, kind, identity)
        )

    def find_seq(self, job_id: str, seq: int) -> RequestRecord | None:
        return self._one("job_id = ? AND seq = ?", (job_id, seq))

    def delete_job(self, job_id: str) -> None:
        with self._db.lock:
            self._db.conn.execute("DELETE FROM requests WHERE job_id = ?", (job_id,))
            self._db.conn.execute("DELETE FROM refused_seqs WHERE job_id = ?", (job_id,))

    def unfinished(self) -> list[RequestRecord]:
        with self._db.lock:
            rows = self._db.conn.execute(
                f"SELECT {_REQ_COLS} FROM requests WHERE {_OPEN} ORDER BY created_at"
            ).fetchall()
        return [_row_to_request(r) for r in rows]

    def refuse_seq(self, job_id: str, seq: int) -> None:
        """Record `seq` as refused for good (committed before the refusal is answered)."""
        with self._db.lock:
            self._db.conn.execute(
                "INSERT OR IGNORE INTO refused_seqs (job_id, seq) VALUES (?, ?)", (job_id, seq)
            )

    def executed_seqs(self) -> dict[str, set[int]]:
        with self._db.lock:
            rows = self._db.conn.execute(
                f"SELECT job_id, seq FROM requests WHERE seq IS NOT NULL AND NOT {_OPEN} "
                "UNION SELECT job_id, seq FROM refused_seqs"
            ).fetchall()
        out: dict[str, set[int]] = {}
        for job_id, seq in rows:
            out.setdefault(str(job_id), set()).add(int(seq))
        return out

    def mark_fetched(self, job_id: str, request_id: str, ts: float) -> None:
        with self._db.lock:
            self._db.conn.execute(
                "UPDATE requests SET fetched_at = ? "
                "WHERE job_id = ? AND request_id = ? AND fetched_at IS NULL",
                (ts, job_id, request_id),
            )

    def expire(self, fetched_before: float) -> int:
        with self._db.lock:
            cur = self._db.conn.execute(
                "UPDATE requests SET result_frame = NULL, body_frame = NULL, expired = 1 "
                "WHERE expired = 0 AND fetched_at IS NOT NULL AND fetched_at < ?",
                (fetched_before,),
            )
        return int(cur.rowcount)


class SqliteChunkStore:
    durable = True

    def __init__(self, path: str | Path) -> None:
        self._db = SqliteDb(path)

    def close(self) -> None:
        self._db.close()

    def get_group(self, job_id: str, group_id: str) -> GroupRecord | None:
        with self._db.lock:
            row = self._db.conn.execute(
                "SELECT frame_sha256, total_chunks, frame_size_bytes, operation, received, "
                "complete, request_id, created_at FROM chunk_groups "
                "WHERE job_id = ? AND group_id = ?",
                (job_id, group_id),
            ).fetchone()
        if row is None:
            return None
        sha, total, size, op, received, complete, rid, created = row
        return GroupRecord(
            job_id=job_id,
            group_id=group_id,
            frame_sha256=sha,
            total_chunks=int(total),
            frame_size_bytes=int(size),
            operation=op,
            received=set(json.loads(received)),
            complete=bool(complete),
            request_id=rid,
            created_at=float(created),
        )

    def put_group(self, rec: GroupRecord) -> None:
        with self._db.lock:
            self._db.conn.execute(
                "INSERT OR REPLACE INTO chunk_groups VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    rec.job_id,
                    rec.group_id,
                    rec.frame_sha256,
                    rec.total_chunks,
                    rec.frame_size_bytes,
                    rec.operation,
                    json.dumps(sorted(rec.received)),
                    int(rec.complete),
                    rec.request_id,
                    rec.created_at,
                ),
            )

    def save_chunk(self, job_id: str, group_id: str, idx: int, frame: bytes) -> None:
        with self._db.lock:
            self._db.conn.execute(
                "INSERT OR REPLACE INTO chunks VALUES (?, ?, ?, ?)",
                (job_id, group_id, idx, bytes(frame)),
            )

    def load_chunks(self, job_id: str, group_id: str) -> list[bytes]:
        with self._db.lock:
            rows = self._db.conn.execute(
                "SELECT frame FROM chunks WHERE job_id = ? AND group_id = ? ORDER BY idx",
                (job_id, group_id),
            ).fetchall()
        return [bytes(r[0]) for r in rows]

    def drop_chunks(self, job_id: str, group_id: str) -> None:
        with self._db.lock:
            self._db.conn.execute(
                "DELETE FROM chunks WHERE job_id = ? AND group_id = ?", (job_id, group_id)
            )

    def delete_job(self, job_id: str) -> None:
        with self._db.lock:
            self._db.conn.execute("DELETE FROM chunks WHERE job_id = ?", (job_id,))
            self._db.conn.execute("DELETE FROM chunk_groups WHERE job_id = ?", (job_id,))
