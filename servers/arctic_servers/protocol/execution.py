"""Running data-plane requests: recorded before they run, queued by sequence number, limited per
token, answered inline (200) or polled (202), with their results as chunk events."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import time
import uuid
from typing import Any

import dssst1
from arctic_sdk.spec.model import MethodInfo

from ..rules.errors import ProtocolError
from ..rules.request_scope import RUNNING_REQUEST
from ..rules.states import move_request
from ..telemetry import tracing
from ..telemetry.metrics import outcome_code
from . import faultpoints
from .calls import IncomingCall, Outcome
from .context import CallContext
from .core_state import CoreState
from .sampling_queue import counts
from .stores import RequestRecord

log = logging.getLogger("arctic_servers.protocol")
CANCEL_WAIT_S = 1.0
"""How long CancelRequest waits for a running request its servicer ends by itself (a sample
stops at its engine's next step) before answering its status: a training call that runs to its
end answers `running` then, well inside the SDK's 2 s bound for an abandoned call."""


def resubmittable(rec: RequestRecord) -> bool:
    """Failed with `not_executed`: it provably never ran, so its identity may run it anew."""
    return rec.status == "failed" and (rec.error or {}).get("code") == "not_executed"


class Execution:
    """The request queue of one core: records run as tasks, in sequence order, answered inline
    or polled; cancelled, abandoned, handed off at shutdown."""

    def __init__(self, state: CoreState) -> None:
        self.state = state
        self._done: dict[tuple[str, str], asyncio.Event] = {}
        self._tasks: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._events: dict[tuple[str, str], list[bytes]] = {}  # result chunk frames (a cache)
        # requests whose servicer call has begun (a cancel then goes through `cancel_running`)
        self._started: set[tuple[str, str]] = set()
        self._inflight: dict[str, int] = {}  # token hash -> pending or running requests
        self._durations: dict[str, float] = {}  # token hash -> mean request seconds (EWMA)
        self._sampling_held: dict[tuple[str, str], float] = {}  # request -> admitted at
        self._handing_off = False

    async def invoke(self, method: MethodInfo, ctx: CallContext, body: Any) -> Any:
        hooks = self.state.hooks
        if hooks.request_body is not None:
            body = hooks.request_body(method, ctx, body)
        result = await self.state.op(method)(ctx, body)
        if hooks.result is not None:
            result = hooks.result(method, ctx, body, result)
        self.state.metrics.result(method, ctx.job_id, body, result)  # tokens, weight syncs
        return result

    async def submit(
        self,
        call: IncomingCall,
        ctx: CallContext,
        body: Any,
        kind: str,
        identity: str,
        body_hash: str,
        group: str = "",
        body_frame: bytes | None = None,
    ) -> Outcome:
        method = call.method
        job_id = ctx.job_id
        assert job_id is not None
        if kind and self.state.hooks.identity is not None:
            kind, identity = self.state.hooks.identity(method, kind, identity)
        if kind:
            old = self.state.requests.find_identity(job_id, kind, identity)
            if old is not None:
                if old.body_hash != body_hash:
                    if kind == "key":
                        raise self.state.key_conflict(identity)
                    raise ProtocolError(
                        "chunk_group_conflict",
                        f"chunk group {identity!r} was used with different content",
                        chunk_group_id=identity,
                    )
                if old.expired:
                    raise self.state.expired(old)
                if resubmittable(old):
                    self._supersede(old)  # it never ran: this submission runs it
                else:
                    if group and group != identity:  # a keyed retry in a new group
                        self.state.groups.bind_request(job_id, group, old.request_id)
                    return await self.answer(old, method, call, ctx)
        if ctx.seq is not None and self.state.config.sequencing:
            taken = self.state.requests.find_seq(job_id, ctx.seq)
            if taken is not None:
                raise ProtocolError(
                    "sequence_conflict",
                    f"X-Arctic-Seq {ctx.seq} was already used in job {job_id} by request "
                    f"{taken.request_id}",
                    seq=ctx.seq,
                    request_id=taken.request_id,
                )
        token_hash = hashlib.sha256((ctx.token or "").encode()).hexdigest()[:16]
        self._admit(token_hash)
        admitted = self.state.sampling.acquire(job_id) if counts(method) else None
        rec = RequestRecord(
            job_id=job_id,
            request_id=uuid.uuid4().hex,
            op=method.name,
            identity_kind=kind,
            identity=identity,
            body_hash=body_hash,
            seq=ctx.seq if self.state.config.sequencing else None,
            token_hash=token_hash,
            body_frame=body_frame,
            sub_job_id=ctx.sub_job_id or "",
        )
        try:
            self.state.requests.create(rec)  # recorded before anything executes
        except BaseException:
            if admitted is not None:
                self.state.sampling.release(job_id, admitted)
            raise
        if admitted is not None:  # released when the request ends (`_run`)
            self._sampling_held[(job_id, rec.request_id)] = admitted
        if group:
            self.state.groups.bind_request(job_id, group, rec.request_id)
        faultpoints.hit("request_recorded")
        ctx.request_id = rec.request_id
        self.start(rec, method, ctx, body)
        return await self.answer(rec, method, call, ctx)

    def _supersede(self, old: RequestRecord) -> None:
        """A request that failed `not_executed` gives its identity and sequence number up to
        its resubmission (it stays pollable under its own id)."""
        old.identity_kind, old.identity = "", f"superseded:{old.identity_kind}:{old.identity}"
        old.seq = None
        self.state.requests.update(old)

    def start(self, rec: RequestRecord, method: MethodInfo, ctx: CallContext, body: Any) -> None:
        key = (rec.job_id, rec.request_id)
        self._inflight[rec.token_hash] = self._inflight.get(rec.token_hash, 0) + 1
        self._done[key] = asyncio.Event()
        self.state.metrics.request_queued(key, method.name, ctx.transport)
        self._tasks[key] = asyncio.get_running_loop().create_task(self._run(rec, method, ctx, body))

    def _admit(self, token_hash: str) -> None:
        """Per-token concurrency limit: 429 with Retry-After and the queue position."""
        limit = self.state.config.max_inflight_per_token
        n = self._inflight.get(token_hash, 0)
        if limit <= 0 or n < limit:
            return
        position = n - limit + 1  # requests of this token that must end before one is admitted
        mean = self._durations.get(token_hash, 1.0)
        retry = max(1, math.ceil(mean * position / limit))
        raise ProtocolError(
            "rate_limited",
            f"this token has {n} requests pending or running, its limit is {limit}; retry in "
            f"about {retry} s (queue position {position})",
            limit=limit,
            in_flight=n,
            queue_position=position,
            retry_after_s=retry,
        )

    async def _run(
        self, rec: RequestRecord, method: MethodInfo, ctx: CallContext, body: Any
    ) -> None:
        attrs = {"arctic.op": method.name, "arctic.request_id": rec.request_id,
                 "arctic.job_id": rec.job_id}  # fmt: skip
        with tracing.span(f"arctic.request {method.name}", attributes=attrs) as span:
            await self._run_request(rec, method, ctx, body)
            if span is not None and rec.terminal:
                tracing.answered(span, rec.request_id, outcome_code(rec.error, rec.status))

    async def _run_request(
        self, rec: RequestRecord, method: MethodInfo, ctx: CallContext, body: Any
    ) -> None:
        key = (rec.job_id, rec.request_id)
        seq = self.state.sequencer()
        t0 = time.monotonic()
        try:
            with tracing.span("arctic.queue"):
                if rec.seq is not None and not ctx.recovered:
                    await seq.wait_turn(rec.job_id, rec.seq, method.concurrent)
                elif rec.seq is not None:
                    await seq.mark_started(rec.job_id, rec.seq, method.concurrent)
            self._started.add(key)
            self.state.metrics.request_started(key)
            if rec.status != "running":
                move_request(rec, "running")
                self.state.requests.update(rec)
                faultpoints.hit("request_started")
            RUNNING_REQUEST.set(rec.request_id)  # this task's: what its engine commands serve
            with tracing.span("arctic.execute"):
                result = await self.invoke(method, ctx, body)
            if ctx.result_box is not None:  # an in-process caller reads the value itself
                ctx.result_box["value"] = result
            faultpoints.hit("request_executed")
            rec.result_frame = dssst1.dumps(result)
            move_request(rec, "completed")
        except ProtocolError as exc:
            move_request(rec, "cancelled" if exc.code == "request_cancelled" else "failed")
            rec.error = exc.body()["error"]
        except asyncio.CancelledError:
            if self._handing_off:  # shutting down: the record stays pending/running for a restart
                self._tasks.pop(key, None)
                self._started.discard(key)
                self.state.metrics.request_ended(key, None)
                raise
            move_request(rec, "cancelled")
            rec.error = ProtocolError(
                "request_cancelled", f"request {rec.request_id} was cancelled"
            ).body()["error"]
        except dssst1.DSSError as exc:
            log.exception("result of %s could not be encoded", method.name)
            move_request(rec, "failed")
            rec.error = ProtocolError(
                "internal", f"the server could not encode the result of {method.name}: {exc}"
            ).body()["error"]
        except Exception as exc:  # a servicer bug must become a failed request, not a hang
            log.exception("%s failed", method.name)
            move_request(rec, "failed")
            rec.error = ProtocolError(
                "internal", f"{method.name} failed: {type(exc).__name__}: {exc}"
            ).body()["error"]
        if not rec.terminal:  # handed off (re-raised above)
            return
        code = outcome_code(rec.error, rec.status)
        self.state.metrics.request_ended(key, code)
        if code != "ok":  # the log line of a failed request names it
            log.warning(
                "request %s (%s, job %s) %s: [%s] %s",
                rec.request_id,
                method.name,
                rec.job_id,
                rec.status,
                code,
                (rec.error or {}).get("message", ""),
            )
        rec.body_frame = None
        self.state.requests.update(rec)
        self._started.discard(key)
        n = self._inflight.get(rec.token_hash, 1) - 1
        if n > 0:
            self._inflight[rec.token_hash] = n
        else:
            self._inflight.pop(rec.token_hash, None)
        old = self._durations.get(rec.token_hash)
        took = time.monotonic() - t0
        self._durations[rec.token_hash] = took if old is None else 0.8 * old + 0.2 * took
        admitted = self._sampling_held.pop(key, None)
        if admitted is not None:
            self.state.sampling.release(rec.job_id, admitted)
        if rec.seq is not None:
            await seq.mark_done(rec.job_id, rec.seq)
        self._tasks.pop(key, None)
        event = self._done.pop(key, None)
        if event is not None:
            event.set()

    async def _inline_wait(self, rec: RequestRecord, event: asyncio.Event) -> None:
        """Inline mode: wait for the request to end, unless it stays queued (a sequenced request
        waiting for an earlier number) longer than `inline_wait_seconds`: that one answers 202,
        so it can be polled and cancelled instead of holding the connection."""
        if rec.seq is None:
            await event.wait()
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.state.config.inline_wait_seconds
        while not event.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), 0.05)
            cur = self.state.requests.get(rec.job_id, rec.request_id) or rec
            if cur.status != "pending":
                await event.wait()
                return
            if loop.time() > deadline:
                return

    async def answer(
        self, rec: RequestRecord, method: MethodInfo, call: IncomingCall, ctx: CallContext
    ) -> Outcome:
        event = self._done.get((rec.job_id, rec.request_id))
        mode = self.state.config.answer_mode
        # `Prefer: respond-async` (RFC 7240): 202 at once (how a client that abandons a call
        # while its answer is held learns the request id it must cancel)
        hold = "respond-async" not in call.headers.get("prefer", "").lower()
        try:
            if event is not None and not rec.terminal and hold:
                if mode == "inline":
                    await self._inline_wait(rec, event)
                elif mode == "auto" or method.inline_preferred:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(event.wait(), self.state.config.inline_wait_seconds)
        except asyncio.CancelledError:
            # a gRPC call cancelled while its answer is held: its caller abandoned it (gRPC's
            # cancellation), so the request is cancelled too; so is an in-process caller's
            # (`inproc.py`: a Tinker future cancelled, an OpenAI client gone). An HTTP
            # connection that drops is not a cancel (a proxy's idle timeout, a retried
            # attempt): cancel-request is.
            if call.transport == "grpc" or call.carries_values:
                self.abandon(rec, ctx)
            raise
        fresh = self.state.requests.get(rec.job_id, rec.request_id) or rec
        if fresh.terminal and fresh.fetched_at is None:
            self.state.requests.mark_fetched(fresh.job_id, fresh.request_id, time.time())
        return Outcome(
            200 if fresh.terminal else 202,
            method,
            record=fresh,
            max_events=self.state.config.limits.default_max_events,
        )

    def abandon(self, rec: RequestRecord, ctx: CallContext) -> None:
        """The caller that held `rec`'s answer gave up on it: cancel the request in the
        background (nothing awaits the outcome; a hand-off at shutdown keeps it for a restart)."""
        if self._handing_off or rec.terminal:
            return
        task = asyncio.get_running_loop().create_task(self.cancel_record(rec, ctx))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def cancel_record(self, rec: RequestRecord, ctx: CallContext) -> RequestRecord:
        """Cancel a request (CancelRequest, an abandoned gRPC call): a queued one never runs; a
        running one ends at its engine's next safe point (a servicer whose `cancel_running`
        answers True ends it itself: a sampler aborts it, a training call finishes and the
        cancel is recorded), else its task is cancelled. The record as it stands after."""
        if rec.terminal:
            return rec
        key = (rec.job_id, rec.request_id)
        task = self._tasks.get(key)
        event = self._done.get(key)
        handled = False
        if key in self._started:
            handled = bool(await self.state.servicer.cancel_running(ctx, rec.request_id))
        if task is not None and not handled:
            task.cancel()
        if event is not None and handled:  # a sample stops soon; a training call may run on
            wait = min(CANCEL_WAIT_S, self.state.config.inline_wait_seconds)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), wait)
        elif event is not None:
            await event.wait()
        return self.state.record(rec.job_id, rec.request_id)

    async def wait_terminal(self, rec: RequestRecord) -> RequestRecord:
        """The request `rec` once it ended (an in-process caller's wait: no poll interval while
        it runs here), marked fetched as a poll that saw it end would."""
        event = self._done.get((rec.job_id, rec.request_id))
        if event is not None:
            await event.wait()
        fresh = self.state.requests.get(rec.job_id, rec.request_id) or rec
        while not fresh.terminal:  # not run by this process's task (taken up after a restart)
            await asyncio.sleep(0.05)
            fresh = self.state.requests.get(rec.job_id, rec.request_id) or fresh
        if fresh.fetched_at is None:
            self.state.requests.mark_fetched(fresh.job_id, fresh.request_id, time.time())
        return fresh

    # ------------------------------------------------------------------ result events

    def result_events(self, rec: RequestRecord) -> list[bytes]:
        """The result chunk frames of a large result (cached, deterministic)."""
        key = (rec.job_id, rec.request_id)
        chunks = self._events.get(key)
        if chunks is None:
            assert rec.result_frame is not None
            chunks = [
                bytes(c)
                for c in dssst1.encode_chunks(
                    rec.result_frame,
                    kind="result",
                    max_bytes=self.state.config.limits.result_chunk_bytes,
                )
            ]
            self._events[key] = chunks
        return chunks

    async def drain(self) -> None:
        """Wait for every running request to finish (graceful shutdown)."""
        tasks = list(self._tasks.values())
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def hand_off(self, timeout: float) -> int:
        """Graceful shutdown of a durable server: stop accepting, let running requests finish
        for up to `timeout` seconds, then stop waiting. What has not ended stays pending or
        running in the store for the next start (`restore`). Returns how many were handed off."""
        self.state.start_draining()
        pending = [t for k, t in self._tasks.items() if k not in self._started]
        self._handing_off = True
        for task in pending:
            task.cancel()
        running = [t for k, t in self._tasks.items() if k in self._started]
        if running:
            await asyncio.wait(running, timeout=timeout)
        left = [t for t in running if not t.done()]
        for task in left:
            task.cancel()
        if left or pending:
            await asyncio.gather(*left, *pending, return_exceptions=True)
        for event in self._done.values():  # callers waiting inline: answer 202, poll after
            event.set()
        return len(left) + len(pending)

    def forget_result_events(self) -> None:
        """Drop the cached result chunk frames (rebuilt on demand; the retention sweep)."""
        self._events.clear()
