"""Storage interfaces of the protocol layer, and their in-memory implementation.

The protocol core keeps every piece of state that must survive a retry (requests, their results,
idempotency identities, chunk groups) behind these two interfaces, so a server chooses memory
(fake gateway, on-prem) or SQLite (`sqlite_store.py`, the Cortex gateway) without touching protocol
logic. Writes happen before the client is acknowledged.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..rules.states import REQUEST

TERMINAL = REQUEST.terminal  # the moves: `states.py`


@dataclass
class RequestRecord:
    """One data-plane request and, once it ended, its outcome."""

    job_id: str
    request_id: str
    op: str
    status: str = "pending"  # `states.REQUEST`
    identity_kind: str = ""  # "key" (Idempotency-Key), "group" (chunk group) or ""
    identity: str = ""
    body_hash: str = ""
    seq: int | None = None
    result_frame: bytes | None = None  # DSSST1 frame of the result value
    error: dict[str, Any] | None = None  # the error object of an ErrorBody
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    token_hash: str = ""
    # The DSSST1 frame of the body, kept by durable stores until the request ends, so that a
    # restarted server can run a request that had not started yet.
    body_frame: bytes | None = None
    sub_job_id: str = ""  # X-Arctic-Sub-Job of the call
    fetched_at: float | None = None  # when a terminal answer was first delivered
    expired: bool = False  # the result was dropped after its retention window

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


@dataclass
class GroupRecord:
    """A request chunk group the server has seen (PROTOCOL.md §3.5)."""

    job_id: str
    group_id: str
    frame_sha256: str
    total_chunks: int
    frame_size_bytes: int
    operation: str
    received: set[int] = field(default_factory=set)
    complete: bool = False
    request_id: str = ""
    created_at: float = field(default_factory=time.time)


class RequestStore(Protocol):
    # True when records survive a restart (bodies are then kept until a request ends).
    durable: bool

    def create(self, rec: RequestRecord) -> None: ...
    def update(self, rec: RequestRecord) -> None: ...
    def get(self, job_id: str, request_id: str) -> RequestRecord | None: ...
    def find_identity(self, job_id: str, kind: str, identity: str) -> RequestRecord | None: ...
    def find_seq(self, job_id: str, seq: int) -> RequestRecord | None: ...
    def delete_job(self, job_id: str) -> None: ...
    # Requests still pending or running (oldest first), for a restart.
    def unfinished(self) -> list[RequestRecord]: ...
    # A sequence number refused for good (no request recorded, never run): it counts as executed,
    # so the job's next number does not wait for it, also after a restart.
    def refuse_seq(self, job_id: str, seq: int) -> None: ...
    # Per job, the sequence numbers of requests that ended, and the refused ones, for a restart.
    def executed_seqs(self) -> dict[str, set[int]]: ...
    def mark_fetched(self, job_id: str, request_id: str, ts: float) -> None: ...
    # Drop results (and bodies) fetched before `fetched_before`; the records stay as `expired`
    # so a replay of their identity is refused rather than run again. Returns how many.
    def expire(self, fetched_before: float) -> int: ...


class ChunkStore(Protocol):
    # True when chunk frames are persisted (and reloaded after a restart); a non-durable store
    # leaves the bytes to the in-memory assembler.
    durable: bool

    def get_group(self, job_id: str, group_id: str) -> GroupRecord | None: ...
    def put_group(self, rec: GroupRecord) -> None: ...
    def save_chunk(self, job_id: str, group_id: str, idx: int, frame: bytes) -> None: ...
    def load_chunks(self, job_id: str, group_id: str) -> list[bytes]: ...
    def drop_chunks(self, job_id: str, group_id: str) -> None: ...
    def delete_job(self, job_id: str) -> None: ...


class MemoryRequestStore:
    """Requests in a dict; records are copied in and out so callers cannot alias them."""

    durable = False

    def __init__(self) -> None:
        self._by_id: dict[tuple[str, str], RequestRecord] = {}
        self._by_identity: dict[tuple[str, str, str], str] = {}
        self._by_seq: dict[tuple[str, int], str] = {}
        self._refused: set[tuple[str, int]] = set()

    def create(self, rec: RequestRecord) -> None:
        key = (rec.job_id, rec.request_id)
        if key in self._by_id:
            raise KeyError(f"request {rec.request_id} exists in job {rec.job_id}")
        self._store(rec)

    def update(self, rec: RequestRecord) -> None:
        rec.updated_at = time.time()
        self._store(rec)

    def _store(self, rec: RequestRecord) -> None:
        self._by_id[(rec.job_id, rec.request_id)] = copy.copy(rec)
        if rec.identity_kind:
            self._by_identity[(rec.job_id, rec.identity_kind, rec.identity)] = rec.request_id
        if rec.seq is not None:
            self._by_seq[(rec.job_id, rec.seq)] = rec.request_id

    def get(self, job_id: str, request_id: str) -> RequestRecord | None:
        rec = self._by_id.get((job_id, request_id))
        return copy.copy(rec) if rec is not None else None

    def find_identity(self, job_id: str, kind: str, identity: str) -> RequestRecord | None:
        rid = self._by_identity.get((job_id, kind, identity))
        return self.get(job_id, rid) if rid is not None else None

    def find_seq(self, job_id: str, seq: int) -> RequestRecord | None:
        rid = self._by_seq.get((job_id, seq))
        return self.get(job_id, rid) if rid is not None else None

    def delete_job(self, job_id: str) -> None:
        self._by_id = {k: v for k, v in self._by_id.items() if k[0] != job_id}
        self._by_identity = {k: v for k, v in self._by_identity.items() if k[0] != job_id}
        self._by_seq = {k: v for k, v in self._by_seq.items() if k[0] != job_id}
        self._refused = {k for k in self._refused if k[0] != job_id}

    def unfinished(self) -> list[RequestRecord]:
        out = [copy.copy(r) for r in self._by_id.values() if not r.terminal]
        return sorted(out, key=lambda r: r.created_at)

    def refuse_seq(self, job_id: str, seq: int) -> None:
        self._refused.add((job_id, seq))

    def executed_seqs(self) -> dict[str, set[int]]:
        out: dict[str, set[int]] = {}
        for r in self._by_id.values():
            if r.seq is not None and r.terminal:
                out.setdefault(r.job_id, set()).add(r.seq)
        for job_id, seq in self._refused:
            out.setdefault(job_id, set()).add(seq)
        return out

    def mark_fetched(self, job_id: str, request_id: str, ts: float) -> None:
        rec = self._by_id.get((job_id, request_id))
        if rec is not None and rec.fetched_at is None:
            rec.fetched_at = ts

    def expire(self, fetched_before: float) -> int:
        n = 0
        for rec in self._by_id.values():
            if not rec.expired and rec.fetched_at is not None and rec.fetched_at < fetched_before:
                rec.result_frame, rec.body_frame, rec.expired = None, None, True
                n += 1
        return n


class MemoryChunkStore:
    """Group records in a dict; chunk bytes stay in the core's assemblers (not durable)."""

    durable = False

    def __init__(self) -> None:
        self._groups: dict[tuple[str, str], GroupRecord] = {}

    def get_group(self, job_id: str, group_id: str) -> GroupRecord | None:
        rec = self._groups.get((job_id, group_id))
        return copy.deepcopy(rec) if rec is not None else None

    def put_group(self, rec: GroupRecord) -> None:
        self._groups[(rec.job_id, rec.group_id)] = copy.deepcopy(rec)

    def save_chunk(self, job_id: str, group_id: str, idx: int, frame: bytes) -> None:
        pass

    def load_chunks(self, job_id: str, group_id: str) -> list[bytes]:
        return []

    def drop_chunks(self, job_id: str, group_id: str) -> None:
        pass

    def delete_job(self, job_id: str) -> None:
        for k in [k for k in self._groups if k[0] == job_id]:
            del self._groups[k]
