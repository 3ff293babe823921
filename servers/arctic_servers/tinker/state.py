"""Sessions, training models, sampling sessions and futures of the Tinker surface (in memory).

Every Tinker op is a future: the submit answers `{"request_id"}` at once and the op runs as a
task; `retrieve_future` long-polls it. A model's ops run one at a time in `seq_id` order
(the SDK numbers them from 1 and may send a forward_backward's later chunks first).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from .errors import TinkerError

__all__ = ["Future", "Model", "SamplerRef", "Session", "State"]

FUTURE_TTL_S = 3600.0
MAX_FUTURES = 100_000


@dataclass
class Session:
    session_id: str
    token: str | None
    created: float = field(default_factory=time.time)
    last_heartbeat: float = field(default_factory=time.time)
    finished: bool = False


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

    async def in_turn(self, seq_id: int, op: Callable[[], Awaitable[Any]]) -> Any:
        """Run `op` when every earlier seq_id of this model has run."""
        async with self.turn:
            await self.turn.wait_for(lambda: self.next_seq >= seq_id)
        try:
            return await op()
        finally:
            async with self.turn:
                self.next_seq = max(self.next_seq, seq_id + 1)
                self.last_request = time.time()
                self.turn.notify_all()


@dataclass
class Future:
    request_id: str
    token: str | None
    task: asyncio.Task[Any]
    created: float = field(default_factory=time.time)


class State:
    def __init__(self) -> None:
        self.sessions: dict[str, Session] = {}
        self.models: dict[str, Model] = {}
        self.samplers: dict[str, SamplerRef] = {}
        self.futures: dict[str, Future] = {}

    def session(self, session_id: str, token: str | None) -> Session:
        s = self.sessions.get(str(session_id))
        if s is None or s.token != token:
            raise TinkerError(
                404, f"session_id {session_id!r} does not exist", "not_found", field="session_id"
            )
        return s

    def model(self, model_id: str, token: str | None) -> Model:
        m = self.models.get(str(model_id))
        if m is None or m.token != token:
            raise TinkerError(
                404, f"model_id {model_id!r} does not exist", "not_found", field="model_id"
            )
        return m

    def sampler(self, sampling_session_id: str, token: str | None) -> SamplerRef:
        ref = self.samplers.get(str(sampling_session_id))
        if ref is None or self.models[ref.model_id].token != token:
            raise TinkerError(
                404,
                f"sampling_session_id {sampling_session_id!r} does not exist",
                "not_found",
                field="sampling_session_id",
            )
        return ref

    def submit(self, token: str | None, coro: Awaitable[Any]) -> dict[str, Any]:
        self._expire()
        if len(self.futures) >= MAX_FUTURES:
            raise TinkerError(429, "too many unretrieved futures", "resource_exhausted")
        rid = f"fut-{uuid.uuid4().hex}"
        task = asyncio.ensure_future(coro)
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # no "never retrieved"
        self.futures[rid] = Future(rid, token, task)
        return {"request_id": rid}

    def future(self, request_id: str, token: str | None) -> Future:
        f = self.futures.get(str(request_id))
        if f is None or f.token != token:
            raise TinkerError(
                404, f"request_id {request_id!r} does not exist", "not_found", field="request_id"
            )
        return f

    def _expire(self) -> None:
        now = time.time()
        for rid, f in list(self.futures.items()):
            if f.task.done() and now - f.created > FUTURE_TTL_S:
                del self.futures[rid]
