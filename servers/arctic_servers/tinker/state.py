"""Sessions, training models, sampling sessions, sampled sequences and futures of the Tinker
surface.

They are the surface's own (the jobs and checkpoints behind them are the protocol's) and are
kept in memory and, when the server gives a state file (`TinkerSettings.state_path`,
`store.py`), on disk, so that a restarted server goes on serving the sessions, models,
samplers and futures of the clients that were running. Every id carries the run of the store
that made it (`sess-<run>-...`, `fut-<run>-...`; model and sampling ids start with their
session's), so an id of a run whose state is gone (a server without a state file, or another
one) answers 404 saying the server restarted and what to do, not a bare "does not exist".
A session whose heartbeats stop (`session_timeout_s`, the SDK beats every 10 s) expires: its
heartbeat answers 410, its models' calls 410 naming it, its jobs are cancelled and so are its
samples still running (on a sampler of another session's model too).

Ownership is kept as the sha256 of the caller's token (`owner`): the clear token is only held
in memory, learnt again from the owner's next request after a restart.

Every Tinker op is a future: the submit answers `{"request_id"}` at once and the op runs as a
task; `retrieve_future` long-polls it; `cancel_future` (the SDK sends it for a sample future it
abandons) cancels a sample's task, and with it its protocol request (aborted in the engine). A
model's ops run one at a time in `seq_id` order (the SDK numbers them from 1 and may send a
forward_backward's later chunks first).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from .errors import TinkerError

__all__ = ["Future", "Model", "SamplerRef", "Session", "State", "owner_of"]

FUTURE_TTL_S = 3600.0
MAX_FUTURES = 100_000
SEQUENCE_TTL_S = 24 * 3600.0  # Tinker keeps a sampled sequence referable for a day
MAX_SEQUENCES = 1_000_000
RUN_ID = re.compile(r"^(?:sess|fut)-([0-9a-f]{8})-")


def owner_of(token: str | None) -> str:
    """The owner every object of a token carries: the token's sha256 (never the token)."""
    return hashlib.sha256((token or "").encode()).hexdigest()


@dataclass
class Session:
    session_id: str
    owner: str
    created: float = field(default_factory=time.time)
    last_heartbeat: float = field(default_factory=time.time)
    finished: bool = False
    expired: bool = False  # no heartbeat for session_timeout_s
    ended: bool = False  # its jobs were cancelled (finish or expiry)


@dataclass
class SamplerRef:
    """What a sampling session samples: a training model's sampler at one weight version
    (`inflight`: its newest weights), or a base model's own sampling job (`model_id` None)."""

    owner: str
    session_id: str
    job_id: str
    base_model: str
    context_length: int
    model_id: str | None = None
    weight_version: int = 0
    path: str | None = None
    inflight: bool = False
    token: str | None = field(default=None, repr=False, compare=False)  # memory only


@dataclass
class Model:
    model_id: str
    session_id: str
    owner: str
    base_model: str
    lora_rank: int | None
    job_id: str
    context_length: int
    created: float = field(default_factory=time.time)
    last_request: float = field(default_factory=time.time)
    next_seq: int = 1
    checkpoints: dict[str, dict[str, Any]] = field(default_factory=dict)  # tinker path -> info
    user_metadata: dict[str, str] = field(default_factory=dict)
    lora_config: dict[str, Any] | None = None  # Tinker's LoraConfig as created
    weight_version: int = 0  # of the weights its sampler holds (the last sync)
    token: str | None = field(default=None, repr=False, compare=False)  # memory only

    turn: asyncio.Condition = field(default_factory=asyncio.Condition, repr=False, compare=False)
    refused: set[int] = field(default_factory=set)  # seq_ids answered without running
    queued: set[int] = field(default_factory=set)  # seq_ids submitted, not yet run

    def enqueue(self, seq_id: int | None, op: Callable[[], Awaitable[Any]]) -> Awaitable[Any]:
        """Queue `op` as the SDK's turn `seq_id` (none: the next one): it runs when every
        earlier seq_id of this model has run or was answered without running."""
        seq = int(seq_id or self.next_seq)
        self.queued.add(seq)
        return self._in_turn(seq, op)

    async def _in_turn(self, seq_id: int, op: Callable[[], Awaitable[Any]]) -> Any:
        async with self.turn:
            await self.turn.wait_for(lambda: self.next_seq >= seq_id)
        try:
            return await op()
        finally:
            async with self.turn:
                self.queued.discard(seq_id)
                self.next_seq = max(self.next_seq, seq_id + 1)
                self._advance()
                self.last_request = time.time()
                self.turn.notify_all()

    def _advance(self) -> None:
        while self.next_seq in self.refused:
            self.refused.discard(self.next_seq)
            self.next_seq += 1

    async def release(self, seq_id: int) -> None:
        """The SDK's turn `seq_id` was answered without running (refused at submit, by any
        route, known or not): the SDK numbers every call, so later ones must not wait for it."""
        async with self.turn:
            if seq_id >= self.next_seq and seq_id not in self.queued:
                self.refused.add(seq_id)
            self._advance()
            self.turn.notify_all()


@dataclass
class Future:
    request_id: str
    owner: str
    task: asyncio.Future[Any] | None  # None: running when the server stopped (store.py)
    created: float = field(default_factory=time.time)
    kind: str = ""  # what it runs (store.py re-drives a pending one after a restart)
    spec: dict[str, Any] = field(default_factory=dict)


class State:
    def __init__(self, session_timeout_s: float = 180.0) -> None:
        self.sessions: dict[str, Session] = {}
        self.models: dict[str, Model] = {}
        self.samplers: dict[str, SamplerRef] = {}
        self.futures: dict[str, Future] = {}
        # sequence_id -> {sampling_session_id, model_id, weight_version, created}
        self.sequences: dict[str, dict[str, Any]] = {}
        self.session_timeout_s = session_timeout_s
        self.run = uuid.uuid4().hex[:8]  # the store's run: in every id it hands out
        self.started = time.time()
        # store.py saves on it: the sessions, models and samplers, and the futures and
        # sequences named
        self.changed: Callable[..., None] = lambda futures=(), sequences=(): None

    def new_session_id(self) -> str:
        return f"sess-{self.run}-{uuid.uuid4().hex[:12]}"

    def missing(self, what: str, value: str, status: int = 404) -> TinkerError:
        """The answer for an id this server does not hold: one an earlier run made whose state
        is gone (the server restarted: named, with what to do), or one that never existed /
        is another token's (the same answer for both, so ids of others are not revealed)."""
        m = RUN_ID.match(str(value))
        if m and m.group(1) != self.run:
            since = datetime.fromtimestamp(self.started, UTC).isoformat(timespec="seconds")
            return TinkerError(
                status,
                f"{what} {value!r} was made by an earlier run of this server ({m.group(1)}); "
                f"the server restarted at {since} without that run's Tinker state (sessions, "
                "training and sampling clients, futures and tinker:// paths; a server keeps "
                "them across restarts only with a state file), so it is lost: create a new "
                "ServiceClient and training client (the protocol's jobs and checkpoints are the "
                "server's, servers/TINKER.md)",
                "not_found",
                field=what,
                reason="server_restarted",
            )
        return TinkerError(status, f"{what} {value!r} does not exist", "not_found", field=what)

    def gone(self, s: Session, what: str, value: str) -> TinkerError:
        why = (
            f"sent no heartbeat for over {self.session_timeout_s:g} s (the SDK sends one every "
            "10 s); its jobs were cancelled"
            if s.expired
            else "has finished (ServiceClient closed); its jobs were cancelled"
        )
        return TinkerError(
            410,
            f"{what} {value!r}: session {s.session_id!r} {why}; create a new ServiceClient",
            "gone",
            field=what,
        )

    def session(self, session_id: str, token: str | None, *, live: bool = True) -> Session:
        s = self.sessions.get(str(session_id))
        if s is None or s.owner != owner_of(token):
            raise self.missing("session_id", session_id)
        if live and (s.expired or s.finished):
            raise self.gone(s, "session_id", session_id)
        return s

    def model(self, model_id: str, token: str | None, *, live: bool = True) -> Model:
        """`live=False`: also a model of an ended session (its listings, its checkpoints)."""
        m = self.models.get(str(model_id))
        if m is None or m.owner != owner_of(token):
            raise self.missing("model_id", model_id)
        m.token = token  # learnt again after a restart
        s = self.sessions.get(m.session_id)
        if live and s is not None and (s.expired or s.finished):
            raise self.gone(s, "model_id", model_id)
        return m

    def sampler(
        self, sampling_session_id: str, token: str | None, *, live: bool = True
    ) -> SamplerRef:
        """`live=False`: also a sampler of an ended session (`GET /samplers/{id}`)."""
        ref = self.samplers.get(str(sampling_session_id))
        if ref is None or ref.owner != owner_of(token):
            raise self.missing("sampling_session_id", sampling_session_id)
        ref.token = token  # learnt again after a restart
        s = self.sessions.get(ref.session_id)
        if live and s is not None and (s.expired or s.finished):
            raise self.gone(s, "sampling_session_id", sampling_session_id)
        return ref

    def sequence(self, sequence_id: str, token: str | None) -> dict[str, Any]:
        info = self.sequences.get(str(sequence_id))
        if info is None or info["owner"] != owner_of(token):
            raise self.missing("sequence_id", sequence_id)
        return info

    def record_sequences(self, ids: list[str], info: dict[str, Any]) -> None:
        now = time.time()
        if len(self.sequences) + len(ids) > MAX_SEQUENCES:
            old = [k for k, v in self.sequences.items() if now - v["created"] > SEQUENCE_TTL_S]
            for k in old or list(self.sequences)[: len(ids)]:
                del self.sequences[k]
        for sid in ids:
            self.sequences[sid] = {**info, "created": now}
        self.changed(sequences=tuple(ids))

    def expire_sessions(self, on_end: Callable[[Session], None]) -> None:
        """Mark the sessions whose heartbeats stopped as expired; `on_end` each ended session
        (expired or finished) once."""
        now = time.time()
        for s in list(self.sessions.values()):
            if not s.expired and not s.finished and now - s.last_heartbeat > self.session_timeout_s:
                s.expired = True
            if (s.expired or s.finished) and not s.ended:
                s.ended = True
                on_end(s)
                self.changed()

    def new_future_id(self) -> str:
        return f"fut-{self.run}-{uuid.uuid4().hex}"

    def submit(
        self,
        token: str | None,
        coro: Awaitable[Any],
        kind: str = "",
        spec: dict[str, Any] | None = None,
        rid: str | None = None,
    ) -> dict[str, Any]:
        self.room()
        rid = rid or self.new_future_id()
        self.futures[rid] = Future(rid, owner_of(token), None, kind=kind, spec=dict(spec or {}))
        self.start(self.futures[rid], coro)
        return {"request_id": rid}

    def room(self) -> None:
        """Refuse a new future (429) when too many are kept."""
        self._expire()
        if len(self.futures) >= MAX_FUTURES:
            raise TinkerError(429, "too many unretrieved futures", "resource_exhausted")

    def start(self, f: Future, coro: Awaitable[Any]) -> None:
        """Run `coro` as the future `f` (a new one, or one re-driven after a restart)."""
        task = asyncio.ensure_future(coro)
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # no "never retrieved"
        task.add_done_callback(lambda _: self.changed(futures=(f.request_id,)))
        f.task = task
        self.changed(futures=(f.request_id,))

    def session_samples(self, session_id: str) -> list[Future]:
        """The sample futures of a session's sampling sessions that are still running."""
        out = []
        for f in self.futures.values():
            ref = self.samplers.get(str(f.spec.get("sampling_session_id") or ""))
            running = f.task is not None and not f.task.done()
            if f.kind == "sample" and running and ref is not None and ref.session_id == session_id:
                out.append(f)
        return out

    def future(self, request_id: str, token: str | None) -> Future:
        f = self.futures.get(str(request_id))
        if f is None or f.owner != owner_of(token):
            raise self.missing("request_id", request_id)
        return f

    def _expire(self) -> None:
        now = time.time()
        gone = [
            rid
            for rid, f in self.futures.items()
            if (f.task is None or f.task.done()) and now - f.created > FUTURE_TTL_S
        ]
        for rid in gone:
            del self.futures[rid]
        if gone:
            self.changed(futures=tuple(gone))
