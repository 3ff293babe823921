"""The Tinker surface's state on disk (`TinkerSettings.state_path`: the on-prem server's and
the gateway's data directories), so that sessions, models, sampling sessions, sampled
sequences and futures survive a restart of the server, as the protocol's jobs do.

One SQLite file (WAL), written as things change: sessions, models and samplers (a few per
client) are rewritten whole on every change; futures and sequences row by row. Tokens are
never written: ownership is the token's sha256 (`state.owner_of`), and a model's clear token
comes back with its owner's next request.

After a restart (`load`): the run id is the stored one (so every id handed out before still
resolves), sessions get a fresh heartbeat grace, and a future that had completed answers its
result; one that was running is re-driven on its owner's next `retrieve_future`
(`TinkerRoutes.redrive`): ops without effects (forward, sample) run again, keyed ones
(create_model, optim_step) are resent under the same Idempotency-Key (the protocol answers the
first execution's result, or runs it if it never ran), and a forward_backward, whose
gradients may or may not have been added, fails saying so.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

from .errors import TinkerError, failure_body
from .state import Future, Model, SamplerRef, Session, State

__all__ = ["Store"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS objects (kind TEXT, id TEXT, body TEXT NOT NULL, PRIMARY KEY (kind, id));
CREATE TABLE IF NOT EXISTS futures (id TEXT PRIMARY KEY, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sequences (id TEXT PRIMARY KEY, body TEXT NOT NULL);
"""
MEMORY_ONLY = {"token", "turn", "queued"}


def _fields(obj: Any) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(obj):
        if f.name not in MEMORY_ONLY:
            v = getattr(obj, f.name)
            out[f.name] = sorted(v) if isinstance(v, set) else v
    return out


def _result(f: Future) -> dict[str, Any]:
    """A finished future's row: its result (bytes as base64) or its failure body."""
    if f.task is None or not f.task.done():
        return {"status": "pending"}
    if f.task.cancelled():
        return {"status": "failed", "error": {"error": "cancelled", "category": "server"}}
    exc = f.task.exception()
    if exc is not None:
        return {"status": "failed", "error": failure_body(exc)}
    res = f.task.result()
    if isinstance(res, bytes):
        return {"status": "done", "bytes": base64.b64encode(res).decode()}
    return {"status": "done", "json": res}


class Store:
    def __init__(self, path: str | Path, state: State) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)
        self.state = state

    # ------------------------------------------------------------------ writing

    def save(self, futures: tuple[str, ...] = (), sequences: tuple[str, ...] = ()) -> None:
        """Write the sessions, models and samplers, and the named futures and sequences."""
        st = self.state
        rows = [("session", k, _fields(v)) for k, v in st.sessions.items()]
        rows += [("model", k, _fields(v)) for k, v in st.models.items()]
        rows += [("sampler", k, _fields(v)) for k, v in st.samplers.items()]
        with self.db:
            self.db.execute("BEGIN")
            self.db.execute("DELETE FROM objects")
            self.db.executemany(
                "INSERT INTO objects VALUES (?, ?, ?)", [(a, b, json.dumps(c)) for a, b, c in rows]
            )
            for rid in futures:
                f = st.futures.get(rid)
                if f is None:
                    self.db.execute("DELETE FROM futures WHERE id = ?", (rid,))
                    continue
                body = {"owner": f.owner, "created": f.created, "kind": f.kind, "spec": f.spec}
                body.update(_result(f))
                self.db.execute(
                    "INSERT OR REPLACE INTO futures VALUES (?, ?)", (rid, json.dumps(body))
                )
            for sid in sequences:
                info = st.sequences.get(sid)
                if info is not None:
                    self.db.execute(
                        "INSERT OR REPLACE INTO sequences VALUES (?, ?)", (sid, json.dumps(info))
                    )

    # ------------------------------------------------------------------ reading

    def load(self) -> dict[str, int]:
        """Restore a previous run's state into `self.state` (nothing when the file is new);
        the number of each kind restored."""
        st = self.state
        row = self.db.execute("SELECT value FROM meta WHERE key = 'run'").fetchone()
        if row is None:
            self.db.execute("INSERT INTO meta VALUES ('run', ?)", (st.run,))
            return {}
        st.run = str(row[0])
        now = time.time()
        counts = {"sessions": 0, "models": 0, "samplers": 0, "futures": 0, "sequences": 0}
        for kind, oid, body in self.db.execute("SELECT kind, id, body FROM objects"):
            d = json.loads(body)
            if kind == "session":
                s = Session(**d)
                s.last_heartbeat = max(s.last_heartbeat, now)  # a grace after the restart
                st.sessions[oid] = s
                counts["sessions"] += 1
            elif kind == "model":
                d["refused"] = set(d.get("refused") or ())
                st.models[oid] = Model(**d)
                counts["models"] += 1
            elif kind == "sampler":
                st.samplers[oid] = SamplerRef(**d)
                counts["samplers"] += 1
        for rid, body in self.db.execute("SELECT id, body FROM futures"):
            d = json.loads(body)
            f = Future(rid, d["owner"], None, d["created"], d.get("kind", ""), d.get("spec", {}))
            if d["status"] != "pending":
                f.task = _done(d)
            st.futures[rid] = f
            counts["futures"] += 1
        for sid, body in self.db.execute("SELECT id, body FROM sequences"):
            st.sequences[sid] = json.loads(body)
            counts["sequences"] += 1
        return counts

    def close(self) -> None:
        self.db.close()


def _done(d: dict[str, Any]) -> Any:
    """An already finished asyncio future holding a stored result or failure."""
    import asyncio

    fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    if d["status"] == "done":
        fut.set_result(base64.b64decode(d["bytes"]) if "bytes" in d else d.get("json"))
    else:
        err = d.get("error") or {}
        fut.set_exception(Restored(str(err.get("error", "")), str(err.get("category", "server"))))
    return fut


class Restored(TinkerError):
    """A failure stored by an earlier run, answered as it was."""

    def __init__(self, error: str, category: str) -> None:
        code, _, message = error.partition(": ")
        super().__init__(400 if category == "user" else 500, message or error, code or "internal")
