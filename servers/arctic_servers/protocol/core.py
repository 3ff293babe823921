"""The protocol core: one transport-neutral handler for every call of every arctic.v1 server.

The HTTP app and the gRPC bridge turn their requests into an `IncomingCall` and render the
`Outcome`; everything in between — auth, chunk groups, idempotency, sequencing, validation,
execution with inline or polled answers, polls, cancellation, capabilities — happens here, once,
driven by the generated method table. A server supplies only a servicer (business logic).

`ProtocolCore` is composed of one part a job, each its own object: `core_state.CoreState` (the
servicer, stores, config, hooks and metrics; auth, capabilities, bodies), `execution.Execution`
(the request queue: record, sequence, run, answer, cancel, hand off), `polls.Polls` (GetRequest,
CancelRequest) and `recovery.Recovery` (restart recovery, retention). This module is the entry
point, the control and data planes' call handling, and what the rest of a server reads of the
core.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import uuid
from typing import Any

import dssst1
from arctic_sdk.spec.model import BodyKind, GrpcShape, Idempotency, MethodInfo
from arctic_sdk.spec.tables import methods as M
from arctic_sdk.spec.tables.error_codes import ERRORS

from ..rules import limits as input_limits
from ..rules.errors import ProtocolError
from ..rules.states import REQUEST
from ..telemetry import tracing
from ..telemetry.metrics import ServerMetrics
from .calls import IncomingCall, Outcome, call_span
from .chunk_groups import ChunkGroups, ChunkStep
from .config import ProtocolConfig
from .context import CallContext
from .core_state import CoreState
from .execution import Execution, resubmittable
from .faultpoints import CoreHooks
from .polls import Polls
from .recovery import Recovery
from .sampling_queue import SamplingQueue
from .servicer_hooks import ServicerHooks
from .stores import ChunkStore, RequestRecord, RequestStore

__all__ = ["IncomingCall", "Outcome", "ProtocolCore"]


def _hash_json(op: str, body: Any) -> str:
    text = json.dumps([op, body], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


class ProtocolCore:
    """The handler of every call of one server (`handle`), over its servicer."""

    def __init__(
        self,
        servicer: ServicerHooks,
        config: ProtocolConfig | None = None,
        *,
        request_store: RequestStore | None = None,
        chunk_store: ChunkStore | None = None,
        hooks: CoreHooks | None = None,
    ) -> None:
        self.state = CoreState(
            servicer, config, request_store=request_store, chunk_store=chunk_store, hooks=hooks
        )
        self.execution = Execution(self.state)
        self.polls = Polls(self.state, self.execution)
        self.recovery = Recovery(self.state, self.execution)

    # ------------------------------------------------------------------ what a server reads

    @property
    def servicer(self) -> ServicerHooks:
        return self.state.servicer

    @property
    def config(self) -> ProtocolConfig:
        return self.state.config

    @property
    def hooks(self) -> CoreHooks:
        """The declared fault points (`faultpoints.CoreHooks`); a server may replace them."""
        return self.state.hooks

    @hooks.setter
    def hooks(self, hooks: CoreHooks) -> None:
        self.state.hooks = hooks

    @property
    def requests(self) -> RequestStore:
        return self.state.requests

    @property
    def groups(self) -> ChunkGroups:
        return self.state.groups

    @property
    def sampling(self) -> SamplingQueue:
        return self.state.sampling

    @property
    def metrics(self) -> ServerMetrics:
        return self.state.metrics

    @property
    def codec_limits(self) -> dssst1.Limits:
        return self.state.codec_limits

    @property
    def draining(self) -> bool:
        return self.state.draining

    @property
    def auth_on(self) -> bool:
        return self.state.auth_on

    def authenticate(self, authorization: str) -> str | None:
        return self.state.authenticate(authorization)

    def capabilities(self) -> dict[str, Any]:
        return self.state.capabilities()

    def implemented(self) -> list[MethodInfo]:
        return self.state.implemented()

    def drain_event(self) -> asyncio.Event:
        return self.state.drain_event()

    def start_draining(self) -> None:
        self.state.start_draining()

    async def restore(self) -> dict[str, int]:
        return await self.recovery.restore()

    def sweep(self, now: float | None = None) -> int:
        return self.recovery.sweep(now)

    async def hand_off(self, timeout: float) -> int:
        return await self.execution.hand_off(timeout)

    async def drain(self) -> None:
        await self.execution.drain()

    def abandon(self, rec: RequestRecord, ctx: CallContext) -> None:
        self.execution.abandon(rec, ctx)

    async def wait_terminal(self, rec: RequestRecord) -> RequestRecord:
        return await self.execution.wait_terminal(rec)

    def result_events(self, rec: RequestRecord) -> list[bytes]:
        return self.execution.result_events(rec)

    # ------------------------------------------------------------------ entry point

    async def handle(self, call: IncomingCall) -> Outcome:
        """Answer one call; its metrics (`arctic_calls_total`, latency) and, when tracing, its
        span (`arctic.server <op>`, the caller's trace continued from its `traceparent`)."""
        t0 = time.perf_counter()
        span = call_span(call)
        code = "internal"
        try:
            with tracing.use_span(span):
                outcome = await self._handle(call)
                code = outcome.code()
                tracing.answered(span, outcome.request_id(call), code)
            return outcome
        except ProtocolError as exc:
            code = exc.code
            raise
        except asyncio.CancelledError:
            code = "request_cancelled"  # the caller went away
            raise
        finally:
            self.state.metrics.call_done(
                call.method, call.transport, code, time.perf_counter() - t0
            )

    async def _handle(self, call: IncomingCall) -> Outcome:
        method = call.method
        ctx = self._context(call)
        if method is M.GET_CAPABILITIES:
            return Outcome(200, method, value=self.state.capabilities())
        await self._admit_call(ctx)
        if method is M.GET_REQUEST:
            return self.polls.poll(
                call if self.state.hooks.poll is None else self.state.hooks.poll(call), ctx
            )
        if method is M.CANCEL_REQUEST:
            return await self.polls.cancel(call, ctx)
        if method.grpc_shape is GrpcShape.UNARY:
            return await self._control(call, ctx)
        try:
            return await self._data_plane(call, ctx)
        except ProtocolError as exc:
            await self._release_refused_seq(ctx, exc)
            raise

    def _context(self, call: IncomingCall) -> CallContext:
        """The call's context: its caller authenticated, its headers under the input limits."""
        try:
            token = self.state.authenticate_call(call)
        except ProtocolError as exc:
            if self.state.hooks.auth_refused is None:
                raise
            token = self.state.hooks.auth_refused(call, exc)
        input_limits.check_headers(call.headers)
        return CallContext(
            method=call.method,
            job_id=call.path_params.get("job_id") or call.headers.get("x-arctic-job-id"),
            sub_job_id=call.headers.get("x-arctic-sub-job"),
            token=token,
            idempotency_key=call.headers.get("idempotency-key"),
            seq=self.state.parse_seq(call.headers.get("x-arctic-seq")),
            transport=call.transport,
            headers=dict(call.headers),
            query={k: v for k, v in call.query.items()},
            result_box=call.result_box,
        )

    async def _admit_call(self, ctx: CallContext) -> None:
        """A call this server takes now: not draining, its op implemented, its job the
        caller's (and running, for an engine op)."""
        method = ctx.method
        if self.state.draining and method is not M.GET_REQUEST and method.http_method != "GET":
            raise ProtocolError(
                "unavailable",
                f"{self.state.config.server} is shutting down and accepts no new work; retry "
                "against the restarted server",
                retry_after_s=2,
            )
        if not method.protocol and method not in self.state.implemented_ops:
            raise ProtocolError(
                "unimplemented",
                f"this server ({self.state.config.server}) does not implement {method.name}",
                op=method.name,
            )
        if method.job_scoped:
            if not ctx.job_id:
                raise ProtocolError(
                    "missing_field", "no job id in the route or metadata", field="job_id"
                )
            await self.state.authorize_job(ctx, running=not method.protocol)

    async def checked(self, call: IncomingCall) -> tuple[CallContext, dict[str, Any]]:
        """Admit an in-process call its surface runs itself, not as a request (a streamed
        sample: arctic.v1 has no streaming op): everything `handle` checks before a request is
        recorded — auth, the input limits, the job, the field rules (`validate.py`) and the
        servicer's `check_request` — and answer its context and body; nothing is recorded,
        sequenced or run."""
        if not call.carries_values:
            raise ProtocolError("internal", "checked() takes in-process calls (a result box)")
        ctx = self._context(call)
        await self._admit_call(ctx)
        body = self._inproc_body(call)
        self.state.validate(call.method, body)
        self.state.servicer.check_request(ctx, body)
        return ctx, body

    async def _release_refused_seq(self, ctx: CallContext, exc: ProtocolError) -> None:
        """A sequenced call refused for good (never run, never retried as is) counts as executed,
        so the job's next number does not wait out the gap timeout for it."""
        if ctx.seq is None or not ctx.job_id or not self.state.config.sequencing:
            return
        if ERRORS[exc.code].retryable or exc.code == "sequence_conflict":
            return
        if self.state.requests.find_seq(ctx.job_id, ctx.seq) is None:
            self.state.requests.refuse_seq(
                ctx.job_id, ctx.seq
            )  # durable stores: kept for a restart
            await self.state.sequencer().mark_done(ctx.job_id, ctx.seq)

    # ------------------------------------------------------------------ control plane

    async def _control(self, call: IncomingCall, ctx: CallContext) -> Outcome:
        method = call.method
        body = self.state.params_body(call, dict(self.state.json_body(call)))
        self.state.validate(method, body)
        if method is M.CREATE_JOB:
            input_limits.check_sub_jobs(body, self.state.config.limits.max_sub_jobs)
        scope = "token:" + hashlib.sha256((ctx.token or "").encode()).hexdigest()[:16]
        key = ctx.idempotency_key if method.idempotency is Idempotency.KEYED else None
        body_hash = _hash_json(method.name, body)
        if key:
            old = self.state.requests.find_identity(scope, "key", f"{method.name}:{key}")
            if old is not None:
                if old.body_hash != body_hash:
                    raise self.state.key_conflict(key)
                if old.result_frame is not None:
                    return Outcome(200, method, value=dssst1.loads(old.result_frame))
        value = await self.state.op(method)(ctx, body)
        if key:
            self.state.requests.create(
                RequestRecord(
                    job_id=scope,
                    request_id=uuid.uuid4().hex,
                    op=method.name,
                    status=REQUEST.start("completed"),
                    identity_kind="key",
                    identity=f"{method.name}:{key}",
                    body_hash=body_hash,
                    result_frame=dssst1.dumps(value),
                )
            )
        return Outcome(200, method, value=value)

    # ------------------------------------------------------------------ data plane

    async def _data_plane(self, call: IncomingCall, ctx: CallContext) -> Outcome:
        method = call.method
        assert ctx.job_id is not None
        kind, identity, body_hash, group = "", "", "", ""
        ctx_frame: bytes | None = None  # the body's frame, kept by a durable store
        # gRPC carries every op's body as chunk frames, a JSON body as a tensor-free value (§4.3);
        # an in-process call (`inproc.py`) its body as values: the limits on a decoded body
        if call.carries_values:
            body = self._inproc_body(call)
        elif method.body is BodyKind.DSSST1 or call.transport == "grpc":
            if call.body is None:
                raise ProtocolError("missing_field", "the DSSST1 body is empty", field="body")
            step = self._accept_chunk(ctx.job_id, method, call.body)
            if step.replay_group:
                rec = self._group_request(ctx.job_id, step.replay_group)
                if rec is not None and resubmittable(rec):  # it never ran: take the group anew
                    self.state.groups.reset(ctx.job_id, step.replay_group)
                    step = self._accept_chunk(ctx.job_id, method, call.body)
            if step.cached is not None:
                return Outcome(200, method, value=step.cached)
            if step.replay_group:
                rec = self._group_request(ctx.job_id, step.replay_group)
                if rec is None:  # the group completed but its request was never recorded
                    self.state.groups.reset(ctx.job_id, step.replay_group)
                    raise ProtocolError(
                        "chunk_group_restart_required",
                        f"chunk group {step.replay_group!r} has no request; replay from chunk 0",
                        chunk_group_id=step.replay_group,
                        expected_start_chunk=0,
                    )
                if rec.expired:
                    raise self.state.expired(rec)
                return await self.execution.answer(rec, method, call, ctx)
            assert step.frame is not None
            body = self.state.decode(step.frame)
            if method.body is BodyKind.DSSST1 and self.state.requests.durable:
                ctx_frame = bytes(step.frame)
            group = step.group_id
            if step.group_id:
                kind, identity, body_hash = "group", step.group_id, step.frame_sha256
            if method.body is not BodyKind.DSSST1:
                if not isinstance(body, dict):
                    raise ProtocolError(
                        "invalid_json", f"the body must be an object, got {type(body).__name__}"
                    )
                body = self.state.params_body(call, dict(body))
        else:
            body = self.state.params_body(call, dict(self.state.json_body(call)))
        keyed = ctx.idempotency_key and method.idempotency is Idempotency.KEYED
        if keyed and method.body is not BodyKind.DSSST1:
            kind, identity = "key", str(ctx.idempotency_key)
            body_hash = _hash_json(method.name, body)
        self.state.validate(method, body)
        self.state.servicer.check_request(ctx, body)  # semantic checks: refused (4xx), never run
        if method.response_type == "":
            return Outcome(200, method, raw=await self.execution.invoke(method, ctx, body))
        if self.state.requests.durable and ctx_frame is None:
            ctx_frame = dssst1.dumps(body)
        try:
            return await self.execution.submit(
                call, ctx, body, kind, identity, body_hash, group, ctx_frame
            )
        except ProtocolError as exc:
            if group and exc.code == "rate_limited":
                # refused before it was recorded: the client's retry (the same chunk again) must
                # start the group afresh, not find it completed with no request
                self.state.groups.reset(ctx.job_id, group)
            raise

    def _inproc_body(self, call: IncomingCall) -> dict[str, Any]:
        """The body of an in-process call: a value, under the limits a decoded body meets."""
        if not isinstance(call.value, dict):
            raise ProtocolError(
                "invalid_json", f"the body must be an object, got {type(call.value).__name__}"
            )
        input_limits.check_value(call.value, self.state.config.limits.max_depth + 1)
        body = dict(call.value)
        return body if call.method.body is BodyKind.DSSST1 else self.state.params_body(call, body)

    def _accept_chunk(
        self, job_id: str, method: MethodInfo, frame: bytes | memoryview
    ) -> ChunkStep:
        if self.state.hooks.chunk_accept is not None:
            return self.state.hooks.chunk_accept(self.state.groups, job_id, method, frame)
        return self.state.groups.accept(job_id, method, frame)

    def _group_request(self, job_id: str, group_id: str) -> RequestRecord | None:
        """The request a completed chunk group led to (also when it is keyed by its key)."""
        rec = self.state.requests.find_identity(job_id, "group", group_id)
        if rec is None:
            grp = self.state.groups.store.get_group(job_id, group_id)
            if grp is not None and grp.request_id:
                rec = self.state.requests.get(job_id, grp.request_id)
        return rec
