"""Sessions, training models, sampling sessions and futures of the Tinker surface (in memory).

They do not survive a restart of the server: every id carries the server run it was made by
(`sess-<run>-...`, `fut-<run>-...`; model and sampling ids start with their session's), so a
call after a restart answers 404 naming the lost id, that the server restarted and what to do
(a heartbeat: 410, which stops the SDK's heartbeat loop) instead of a bare "does not exist".
A session whose heartbeats stop (`session_timeout_s`, the SDK beats every 10 s) expires: its
heartbeat answers 410 and its models' calls 410 naming it, and its jobs are cancelled.

Every Tinker op is a future: the submit answers `{"request_id"}` at once and the op runs as a
task; `retrieve_future` long-polls it. A model's ops run one at a time in `seq_id` order
(the SDK numbers them from 1 and may send a forward_backward's later chunks first).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from .errors import TinkerError

__all__ = ["Future", "Model", "SamplerRef", "Session", "State"]

FUTURE_TTL_S = 3600.0
MAX_FUTURES = 100_000
RUN_ID = re.compile(r"^(?:sess|fut)-([0-9a-f]{8})-")


@dataclass
class Session:
    session_id: str
    token: str | None
    created: float = field(default_factory=time.time)
    last_heartbeat: float = field(default_factory=time.time)
    finished: bool = False
    expired: bool = False  # no heartbeat for session_timeout_s


@dataclass
class SamplerRef:
    """Weights a sampling session samples from: a model's sampler at one weight version."""

    model_id: str
    weight_version: int
    path: str | None = None


@dataclass
class Model:
    model_id: str
    session_id: str
    token: str | None
    base_model: str
    lora_rank: int | None
    job_id: str
    adam: dict[str, float]
    created: float = field(default_factory=time.time)
    last_request: float = field(default_factory=time.time)
    next_seq: int = 1
    turn: asyncio.Condition = field(default_factory=asyncio.Condition)
    checkpoints: dict[str, dict[str, Any]] = field(default_factory=dict)  # tinker path -> info
    user_metadata: dict[str, str] = field(default_factory=dict)
    lora_config: dict[str, Any] | None = None  # Tinker's LoraConfig as created

    refused: set[int] = field(default_factory=set)  # seq_ids refused at submit

    async def in_turn(self, seq_id: int, op: Callable[[], Awaitable[Any]]) -> Any:
        """Run `op` when every earlier seq_id of this model has run (or was refused)."""
        async with self.turn:
            await self.turn.wait_for(lambda: self.next_seq >= seq_id)
        try:
            return await op()
        finally:
            async with self.turn:
                self.next_seq = max(self.next_seq, seq_id + 1)
                self._advance()
                self.last_request = time.time()
                self.turn.notify_all()

    def _advance(self) -> None:
        while self.next_seq in self.refused:
            self.refused.discard(self.next_seq)
            self.next_seq += 1

    @contextlib.asynccontextmanager
    async def submitting(self, seq_id: int | None) -> AsyncIterator[None]:
        """A refusal at submit still used up the SDK's turn `seq_id`: later ones must not wait
        for it (the SDK numbers every call, refused or not)."""
        try:
            yield
        except TinkerError:
            if seq_id:
                async with self.turn:
                    if seq_id >= self.next_seq:
                        self.refused.add(seq_id)
                    self._advance()
                    self.turn.notify_all()
            raise


@dataclass
class Future:
    request_id: str
    token: str | None
    task: asyncio.Task[Any]
    created: float = field(default_factory=time.time)


class State:
    def __init__(self, session_timeout_s: float = 180.0) -> None:
        self.sessions: dict[str, Session] = {}
        self.models: dict[str, Model] = {}
        self.samplers: dict[str, SamplerRef] = {}
        self.futures: dict[str, Future] = {}
        self.session_timeout_s = session_timeout_s
        self.run = uuid.uuid4().hex[:8]  # this server run: in every id it hands out
        self.started = time.time()

    def new_session_id(self) -> str:
        return f"sess-{self.run}-{uuid.uuid4().hex[:12]}"

    def missing(self, what: str, value: str, status: int = 404) -> TinkerError:
        """The answer for an id this server run does not hold: one an earlier run made (the
        server restarted: named, with what to do), or one that never existed / is another
        token's (the same answer for both, so ids of others are not revealed)."""
        m = RUN_ID.match(str(value))
        if m and m.group(1) != self.run:
            since = datetime.fromtimestamp(self.started, UTC).isoformat(timespec="seconds")
            return TinkerError(
                status,
                f"{what} {value!r} was made by an earlier run of this server ({m.group(1)}); "
                f"the server restarted at {since} and Tinker sessions, training and sampling "
                "clients, futures and tinker:// paths are kept in its memory, so it is lost: "
                "create a new ServiceClient and training client (the protocol's jobs and "
                "checkpoints are the server's, README 'Tinker users')",
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
            else "has finished (ServiceClient closed)"
        )
        return TinkerError(
            410,
            f"{what} {value!r}: session {s.session_id!r} {why}; create a new ServiceClient",
            "gone",
            field=what,
        )

    def session(self, session_id: str, token: str | None, *, live: bool = True) -> Session:
        s = self.sessions.get(str(session_id))
        if s is None or s.token != token:
            raise self.missing("session_id", session_id)
        if live and s.expired:
            raise self.gone(s, "session_id", session_id)
        return s

    def model(self, model_id: str, token: str | None, *, live: bool = True) -> Model:
        """`live=False`: also a model of an expired session (its listings, its checkpoints)."""
        m = self.models.get(str(model_id))
        if m is None or m.token != token:
            raise self.missing("model_id", model_id)
        s = self.sessions.get(m.session_id)
        if live and s is not None and s.expired:
            raise self.gone(s, "model_id", model_id)
        return m

    def sampler(self, sampling_session_id: str, token: str | None) -> SamplerRef:
        ref = self.samplers.get(str(sampling_session_id))
        if ref is None or self.models[ref.model_id].token != token:
            raise self.missing("sampling_session_id", sampling_session_id)
        return ref

    def expire_sessions(self, on_expire: Callable[[Session], None]) -> None:
        """Mark the sessions whose heartbeats stopped as expired, `on_expire` each once."""
        now = time.time()
        for s in self.sessions.values():
            if not s.expired and now - s.last_heartbeat > self.session_timeout_s:
                s.expired = True
                on_expire(s)

    def submit(self, token: str | None, coro: Awaitable[Any]) -> dict[str, Any]:
        self._expire()
        if len(self.futures) >= MAX_FUTURES:
            raise TinkerError(429, "too many unretrieved futures", "resource_exhausted")
        rid = f"fut-{self.run}-{uuid.uuid4().hex}"
        task = asyncio.ensure_future(coro)
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # no "never retrieved"
        self.futures[rid] = Future(rid, token, task)
        return {"request_id": rid}

    def future(self, request_id: str, token: str | None) -> Future:
        f = self.futures.get(str(request_id))
        if f is None or f.token != token:
            raise self.missing("request_id", request_id)
        return f

    def _expire(self) -> None:
        now = time.time()
        for rid, f in list(self.futures.items()):
            if f.task.done() and now - f.created > FUTURE_TTL_S:
                del self.futures[rid]
