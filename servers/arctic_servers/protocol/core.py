"""The protocol core: one transport-neutral handler for every call of every arctic.v1 server.

The HTTP app and the gRPC bridge turn their requests into an `IncomingCall` and render the
`Outcome`; everything in between — auth, chunk groups, idempotency, sequencing, validation,
execution with inline or polled answers, polls, cancellation, capabilities — happens here, once,
driven by the generated method table. A server supplies only a servicer (business logic).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import descriptor_pool

import arctic_sdk._generated.arctic.v1 as _pb  # noqa: F401  (registers the spec's messages)
import dssst1
from arctic_sdk._generated import methods as M
from arctic_sdk._generated.error_codes import ERRORS
from arctic_sdk._spec import BodyKind, GrpcShape, Idempotency, MethodInfo

from .._generated.servicer import ServicerBase
from . import faultpoints
from .chunk_groups import ChunkGroups
from .config import ProtocolConfig, token_digest
from .context import CallContext
from .errors import ProtocolError
from .sequencer import Sequencer
from .stores import (
    ChunkStore,
    MemoryChunkStore,
    MemoryRequestStore,
    RequestRecord,
    RequestStore,
)
from .validate import validate_body

log = logging.getLogger("arctic_servers.protocol")


@dataclass
class IncomingCall:
    """A call as it arrived, on any transport."""

    method: MethodInfo
    transport: str = "http"
    headers: Mapping[str, str] = field(default_factory=dict)  # lower-case names
    path_params: Mapping[str, str] = field(default_factory=dict)
    query: Mapping[str, list[str]] = field(default_factory=dict)
    body: bytes | memoryview | None = None  # JSON text or one DSSST1 frame
    value: Any = None  # an already-decoded body (gRPC unary messages)
    accept_octet: bool = False


@dataclass
class Outcome:
    """What the core answers; transports render it."""

    http_status: int
    method: MethodInfo
    record: RequestRecord | None = None  # a RequestStatus answer (200) or SubmitResponse (202)
    value: Any = None  # a direct answer (control plane, chunk_cached, capabilities)
    raw: bytes | None = None  # a raw download
    cursor: int = 0
    max_events: int = 16


def _hash_json(op: str, body: Any) -> str:
    text = json.dumps([op, body], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


class ProtocolCore:
    def __init__(
        self,
        servicer: ServicerBase,
        config: ProtocolConfig | None = None,
        *,
        request_store: RequestStore | None = None,
        chunk_store: ChunkStore | None = None,
    ) -> None:
        self.servicer = servicer
        self.config = config or ProtocolConfig()
        self.requests: RequestStore = request_store or MemoryRequestStore()
        limits = self.config.limits
        self.codec_limits = dssst1.Limits(
            max_header_bytes=limits.max_header_bytes,
            max_tensors=limits.max_tensors,
            max_depth=limits.max_depth,
            max_frame_bytes=limits.max_frame_bytes,
            max_chunks=limits.max_chunks,
        )
        self.groups = ChunkGroups(chunk_store or MemoryChunkStore(), self.codec_limits)
        self._seq: Sequencer | None = None
        self._done: dict[tuple[str, str], asyncio.Event] = {}
        self._tasks: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._events: dict[tuple[str, str], list[bytes]] = {}
        self._pool = descriptor_pool.Default()
        self._implemented = frozenset(self.implemented())
        # requests whose servicer call has begun (a cancel then goes through `cancel_running`)
        self._started: set[tuple[str, str]] = set()
        self._inflight: dict[str, int] = {}  # token hash -> pending or running requests
        self._durations: dict[str, float] = {}  # token hash -> mean request seconds (EWMA)
        self.draining = False  # refuse new work (503) while a server shuts down
        self._handing_off = False

    # ------------------------------------------------------------------ entry point

    async def handle(self, call: IncomingCall) -> Outcome:
        method = call.method
        ctx = CallContext(
            method=method,
            job_id=call.path_params.get("job_id") or call.headers.get("x-arctic-job-id"),
            sub_job_id=call.headers.get("x-arctic-sub-job"),
            token=self._authenticate(call),
            idempotency_key=call.headers.get("idempotency-key"),
            seq=self._parse_seq(call.headers.get("x-arctic-seq")),
            transport=call.transport,
            headers=dict(call.headers),
            query={k: v for k, v in call.query.items()},
        )
        if method is M.GET_CAPABILITIES:
            return Outcome(200, method, value=self.capabilities())
        if self.draining and method is not M.GET_REQUEST and method.http_method != "GET":
            raise ProtocolError(
                "unavailable",
                f"{self.config.server} is shutting down and accepts no new work; retry against "
                "the restarted server",
                retry_after_s=2,
            )
        if not method.protocol and method not in self._implemented:
            raise ProtocolError(
                "unimplemented",
                f"this server ({self.config.server}) does not implement {method.name}",
                op=method.name,
            )
        if method.job_scoped:
            if not ctx.job_id:
                raise ProtocolError(
                    "missing_field", "no job id in the route or metadata", field="job_id"
                )
            await self._authorize_job(ctx, running=not method.protocol)
        if method is M.GET_REQUEST:
            return self._poll(call, ctx)
        if method is M.CANCEL_REQUEST:
            return await self._cancel_request(call, ctx)
        if method.grpc_shape is GrpcShape.UNARY:
            return await self._control(call, ctx)
        try:
            return await self._data_plane(call, ctx)
        except ProtocolError as exc:
            await self._release_refused_seq(ctx, exc)
            raise

    async def _release_refused_seq(self, ctx: CallContext, exc: ProtocolError) -> None:
        """A sequenced call refused for good (never run, never retried as is) counts as executed,
        so the job's next number does not wait out the gap timeout for it."""
        if ctx.seq is None or not ctx.job_id or not self.config.sequencing:
            return
        if ERRORS[exc.code].retryable or exc.code == "sequence_conflict":
            return
        if self.requests.find_seq(ctx.job_id, ctx.seq) is None:
            await self._sequencer().mark_done(ctx.job_id, ctx.seq)

    # ------------------------------------------------------------------ auth and jobs

    def _authenticate(self, call: IncomingCall) -> str | None:
        auth = call.headers.get("authorization", "")
        token = auth[7:].strip() if auth[:7].lower() == "bearer " else None
        c = self.config
        if (c.tokens or c.token_sha256) and call.method is not M.GET_CAPABILITIES:
            if not token:
                raise ProtocolError("unauthenticated", "missing Authorization: Bearer <token>")
            if token not in c.tokens and token_digest(token) not in c.token_sha256:
                raise ProtocolError("unauthenticated", "the bearer token is not accepted")
        return token

    @staticmethod
    def _parse_seq(raw: str | None) -> int | None:
        if raw is None or raw == "":
            return None
        try:
            seq = int(raw)
        except ValueError:
            seq = 0
        if seq < 1:
            raise ProtocolError(
                "invalid_argument",
                f"header X-Arctic-Seq: {raw!r} is not an integer >= 1",
                field="X-Arctic-Seq",
                expected="an integer >= 1",
            )
        return seq

    async def _authorize_job(self, ctx: CallContext, *, running: bool) -> None:
        hook = getattr(self.servicer, "authorize_job", None)
        if hook is not None:
            await hook(ctx, running=running)

    # ------------------------------------------------------------------ capabilities

    def implemented(self) -> list[MethodInfo]:
        out = []
        for m in M.METHODS:
            if m.protocol:
                out.append(m)
                continue
            mine = getattr(type(self.servicer), m.python_name, None)
            if mine is not None and mine is not getattr(ServicerBase, m.python_name, None):
                out.append(m)
        return out

    def capabilities(self) -> dict[str, Any]:
        c, lim = self.config, self.config.limits
        return {
            "spec_version": "arctic.v1",
            "wire_formats": ["DSSST1"],
            "routes": [m.name for m in self.implemented()],
            "operation_types": list(getattr(self.servicer, "operation_types", ())),
            "features": {
                "idempotency": c.idempotency,
                "sequencing": c.sequencing,
                "octet_results": c.octet_results,
                "grpc": c.grpc_port > 0,
                "grpc_port": c.grpc_port,
                "openai": c.openai,
                "chunk_checksum": c.chunk_checksum,
                "leases": c.leases,
                "lease_default_seconds": c.lease_default_seconds,
                "lease_max_seconds": c.lease_max_seconds,
            },
            "limits": {
                "max_body_bytes": lim.max_body_bytes,
                "max_chunk_bytes": lim.max_chunk_bytes,
                "max_header_bytes": lim.max_header_bytes,
                "max_frame_bytes": lim.max_frame_bytes,
                "max_chunks": lim.max_chunks,
                "max_tensors": lim.max_tensors,
                "max_depth": lim.max_depth,
                "max_grpc_message_bytes": lim.max_grpc_message_bytes,
                "retention_seconds": lim.retention_seconds,
                "sequence_gap_timeout_seconds": int(lim.sequence_gap_timeout_seconds),
            },
            "server": c.server,
            "server_version": c.server_version,
        }

    # ------------------------------------------------------------------ bodies

    def _json_body(self, call: IncomingCall) -> Any:
        if call.value is not None:
            return call.value
        if call.body is None or len(call.body) == 0:
            return {}
        try:
            value = json.loads(bytes(call.body))
        except (UnicodeDecodeError, ValueError) as exc:
            raise ProtocolError("invalid_json", f"the body is not JSON: {exc}") from None
        if not isinstance(value, dict):
            raise ProtocolError(
                "invalid_json", f"the body must be a JSON object, got {type(value).__name__}"
            )
        return value

    def _params_body(self, call: IncomingCall, body: dict[str, Any]) -> dict[str, Any]:
        """Bind path parameters and query parameters into the body (PROTOCOL.md §3.1)."""
        desc = self._pool.FindMessageTypeByName(call.method.request_type)
        for name, value in call.path_params.items():
            if name in desc.fields_by_name:
                body[name] = value
        for name, values in call.query.items():
            fd = desc.fields_by_name.get(name)
            if fd is None:
                continue  # unknown query parameters are ignored, as HTTP servers do
            typed: list[Any] = []
            for v in values:
                if fd.cpp_type in (fd.CPPTYPE_INT64, fd.CPPTYPE_INT32):
                    try:
                        typed.append(int(v))
                    except ValueError:
                        raise ProtocolError(
                            "invalid_argument",
                            f"query parameter {name}={v!r} is not an integer",
                            field=name,
                        ) from None
                else:
                    typed.append(v)
            body[name] = typed if fd.is_repeated else typed[-1]
        return body

    def _validate(self, method: MethodInfo, body: Any) -> None:
        validate_body(self._pool.FindMessageTypeByName(method.request_type), body)

    # ------------------------------------------------------------------ control plane

    async def _control(self, call: IncomingCall, ctx: CallContext) -> Outcome:
        method = call.method
        body = self._params_body(call, dict(self._json_body(call)))
        self._validate(method, body)
        scope = "token:" + hashlib.sha256((ctx.token or "").encode()).hexdigest()[:16]
        key = ctx.idempotency_key if method.idempotency is Idempotency.KEYED else None
        body_hash = _hash_json(method.name, body)
        if key:
            old = self.requests.find_identity(scope, "key", f"{method.name}:{key}")
            if old is not None:
                if old.body_hash != body_hash:
                    raise self._key_conflict(key)
                if old.result_frame is not None:
                    return Outcome(200, method, value=dssst1.loads(old.result_frame))
        value = await getattr(self.servicer, method.python_name)(ctx, body)
        if key:
            self.requests.create(
                RequestRecord(
                    job_id=scope,
                    request_id=uuid.uuid4().hex,
                    op=method.name,
                    status="completed",
                    identity_kind="key",
                    identity=f"{method.name}:{key}",
                    body_hash=body_hash,
                    result_frame=dssst1.dumps(value),
                )
            )
        return Outcome(200, method, value=value)

    @staticmethod
    def _key_conflict(key: str) -> ProtocolError:
        return ProtocolError(
            "idempotency_key_conflict",
            f"Idempotency-Key {key!r} was already used in this scope with a different body",
            idempotency_key=key,
        )

    # ------------------------------------------------------------------ data plane

    async def _data_plane(self, call: IncomingCall, ctx: CallContext) -> Outcome:
        method = call.method
        assert ctx.job_id is not None
        kind, identity, body_hash, group = "", "", "", ""
        # gRPC carries every op's body as chunk frames, a JSON body as a tensor-free value (§4.3).
        if method.body is BodyKind.DSSST1 or call.transport == "grpc":
            if call.body is None:
                raise ProtocolError("missing_field", "the DSSST1 body is empty", field="body")
            step = self.groups.accept(ctx.job_id, method, call.body)
            if step.cached is not None:
                return Outcome(200, method, value=step.cached)
            if step.replay_group:
                rec = self._group_request(ctx.job_id, step.replay_group)
                if rec is None:  # the group completed but its request was never recorded
                    self.groups.reset(ctx.job_id, step.replay_group)
                    raise ProtocolError(
                        "chunk_group_restart_required",
                        f"chunk group {step.replay_group!r} has no request; replay from chunk 0",
                        chunk_group_id=step.replay_group,
                        expected_start_chunk=0,
                    )
                if rec.expired:
                    raise self._expired(rec)
                return await self._answer(rec, method, call)
            assert step.frame is not None
            body = self._decode(step.frame)
            if method.body is BodyKind.DSSST1 and self.requests.durable:
                ctx_frame: bytes | None = bytes(step.frame)
            else:
                ctx_frame = None
            group = step.group_id
            if step.group_id:
                kind, identity, body_hash = "group", step.group_id, step.frame_sha256
            if method.body is not BodyKind.DSSST1:
                if not isinstance(body, dict):
                    raise ProtocolError(
                        "invalid_json", f"the body must be an object, got {type(body).__name__}"
                    )
                body = self._params_body(call, dict(body))
        else:
            body = self._params_body(call, dict(self._json_body(call)))
            ctx_frame = None
        keyed = ctx.idempotency_key and method.idempotency is Idempotency.KEYED
        if keyed and method.body is not BodyKind.DSSST1:
            kind, identity = "key", str(ctx.idempotency_key)
            body_hash = _hash_json(method.name, body)
        self._validate(method, body)
        check = getattr(self.servicer, "check_request", None)
        if check is not None:  # the servicer's semantic checks: refused (4xx), never run
            check(ctx, body)
        if method.response_type == "":
            return Outcome(200, method, raw=await self._invoke(method, ctx, body))
        if self.requests.durable and ctx_frame is None:
            ctx_frame = dssst1.dumps(body)
        return await self._submit(call, ctx, body, kind, identity, body_hash, group, ctx_frame)

    def _group_request(self, job_id: str, group_id: str) -> RequestRecord | None:
        """The request a completed chunk group led to (also when it is keyed by its key)."""
        rec = self.requests.find_identity(job_id, "group", group_id)
        if rec is None:
            grp = self.groups.store.get_group(job_id, group_id)
            if grp is not None and grp.request_id:
                rec = self.requests.get(job_id, grp.request_id)
        return rec

    def _decode(self, frame: bytes | memoryview) -> Any:
        try:
            return dssst1.loads(frame, limits=self.codec_limits)
        except dssst1.DSSError as exc:
            raise ProtocolError(exc.code, str(exc), field=exc.path or "body") from None

    async def _invoke(self, method: MethodInfo, ctx: CallContext, body: Any) -> Any:
        return await getattr(self.servicer, method.python_name)(ctx, body)

    async def _submit(
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
        if kind:
            old = self.requests.find_identity(job_id, kind, identity)
            if old is not None:
                if old.body_hash != body_hash:
                    if kind == "key":
                        raise self._key_conflict(identity)
                    raise ProtocolError(
                        "chunk_group_conflict",
                        f"chunk group {identity!r} was used with different content",
                        chunk_group_id=identity,
                    )
                if old.expired:
                    raise self._expired(old)
                if group and group != identity:  # a keyed retry in a new group
                    self.groups.bind_request(job_id, group, old.request_id)
                return await self._answer(old, method, call)
        if ctx.seq is not None and self.config.sequencing:
            taken = self.requests.find_seq(job_id, ctx.seq)
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
        rec = RequestRecord(
            job_id=job_id,
            request_id=uuid.uuid4().hex,
            op=method.name,
            identity_kind=kind,
            identity=identity,
            body_hash=body_hash,
            seq=ctx.seq if self.config.sequencing else None,
            token_hash=token_hash,
            body_frame=body_frame,
            sub_job_id=ctx.sub_job_id or "",
        )
        self.requests.create(rec)  # recorded before anything executes
        if group:
            self.groups.bind_request(job_id, group, rec.request_id)
        faultpoints.hit("request_recorded")
        ctx.request_id = rec.request_id
        self._start(rec, method, ctx, body)
        return await self._answer(rec, method, call)

    def _start(self, rec: RequestRecord, method: MethodInfo, ctx: CallContext, body: Any) -> None:
        key = (rec.job_id, rec.request_id)
        self._inflight[rec.token_hash] = self._inflight.get(rec.token_hash, 0) + 1
        self._done[key] = asyncio.Event()
        self._tasks[key] = asyncio.get_running_loop().create_task(self._run(rec, method, ctx, body))

    def _admit(self, token_hash: str) -> None:
        """Per-token concurrency limit: 429 with Retry-After and the queue position."""
        limit = self.config.max_inflight_per_token
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

    def _sequencer(self) -> Sequencer:
        if self._seq is None:  # created inside the running loop
            self._seq = Sequencer(self.config.limits.sequence_gap_timeout_seconds)
        return self._seq

    async def _run(
        self, rec: RequestRecord, method: MethodInfo, ctx: CallContext, body: Any
    ) -> None:
        key = (rec.job_id, rec.request_id)
        seq = self._sequencer()
        t0 = time.monotonic()
        try:
            if rec.seq is not None and not ctx.recovered:
                await seq.wait_turn(rec.job_id, rec.seq)
            self._started.add(key)
            if rec.status != "running":
                rec.status = "running"
                self.requests.update(rec)
                faultpoints.hit("request_started")
            result = await self._invoke(method, ctx, body)
            faultpoints.hit("request_executed")
            rec.result_frame = dssst1.dumps(result)
            rec.status = "completed"
        except ProtocolError as exc:
            rec.status = "cancelled" if exc.code == "request_cancelled" else "failed"
            rec.error = exc.body()["error"]
        except asyncio.CancelledError:
            if self._handing_off:  # shutting down: the record stays pending/running for a restart
                self._tasks.pop(key, None)
                self._started.discard(key)
                raise
            rec.status = "cancelled"
            rec.error = ProtocolError(
                "request_cancelled", f"request {rec.request_id} was cancelled"
            ).body()["error"]
        except dssst1.DSSError as exc:
            log.exception("result of %s could not be encoded", method.name)
            rec.status = "failed"
            rec.error = ProtocolError(
                "internal", f"the server could not encode the result of {method.name}: {exc}"
            ).body()["error"]
        except Exception as exc:  # a servicer bug must become a failed request, not a hang
            log.exception("%s failed", method.name)
            rec.status = "failed"
            rec.error = ProtocolError(
                "internal", f"{method.name} failed: {type(exc).__name__}: {exc}"
            ).body()["error"]
        if not rec.terminal:  # handed off (re-raised above)
            return
        rec.body_frame = None
        self.requests.update(rec)
        self._started.discard(key)
        n = self._inflight.get(rec.token_hash, 1) - 1
        if n > 0:
            self._inflight[rec.token_hash] = n
        else:
            self._inflight.pop(rec.token_hash, None)
        old = self._durations.get(rec.token_hash)
        took = time.monotonic() - t0
        self._durations[rec.token_hash] = took if old is None else 0.8 * old + 0.2 * took
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
        deadline = loop.time() + self.config.inline_wait_seconds
        while not event.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), 0.05)
            cur = self.requests.get(rec.job_id, rec.request_id) or rec
            if cur.status != "pending":
                await event.wait()
                return
            if loop.time() > deadline:
                return

    async def _answer(self, rec: RequestRecord, method: MethodInfo, call: IncomingCall) -> Outcome:
        event = self._done.get((rec.job_id, rec.request_id))
        mode = self.config.answer_mode
        if event is not None and not rec.terminal:
            if mode == "inline":
                await self._inline_wait(rec, event)
            elif mode == "auto" or method.inline_preferred:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), self.config.inline_wait_seconds)
        fresh = self.requests.get(rec.job_id, rec.request_id) or rec
        if fresh.terminal and fresh.fetched_at is None:
            self.requests.mark_fetched(fresh.job_id, fresh.request_id, time.time())
        return Outcome(
            200 if fresh.terminal else 202,
            method,
            record=fresh,
            max_events=self.config.limits.default_max_events,
        )

    # ------------------------------------------------------------------ polls and cancel

    def _poll(self, call: IncomingCall, ctx: CallContext) -> Outcome:
        body = self._params_body(call, dict(self._json_body(call)))
        self._validate(call.method, body)
        rec = self._record(ctx.job_id or "", str(body.get("request_id", "")))
        lim = self.config.limits
        cursor_raw = str(body.get("cursor") or "0")
        try:
            cursor = int(cursor_raw)
        except ValueError:
            cursor = -1
        if cursor < 0:
            raise ProtocolError(
                "invalid_argument",
                f"cursor {cursor_raw!r} is not a cursor this server issued",
                field="cursor",
            )
        max_events = int(body.get("max_events") or lim.default_max_events)
        max_events = max(1, min(max_events, lim.max_events))
        method = M.BY_NAME.get(rec.op, call.method)
        if rec.terminal and rec.fetched_at is None:
            self.requests.mark_fetched(rec.job_id, rec.request_id, time.time())
        return Outcome(200, method, record=rec, cursor=cursor, max_events=max_events)

    def _record(self, job_id: str, request_id: str) -> RequestRecord:
        rec = self.requests.get(job_id, request_id)
        if rec is None:
            raise ProtocolError(
                "request_not_found",
                f"no request {request_id!r} in job {job_id!r}",
                request_id=request_id,
                job_id=job_id,
            )
        if rec.expired:
            raise self._expired(rec)
        return rec

    def _expired(self, rec: RequestRecord) -> ProtocolError:
        return ProtocolError(
            "request_not_found",
            f"request {rec.request_id} of job {rec.job_id} ended and its result was dropped "
            f"{self.config.limits.retention_seconds} s after it was first fetched (retention); "
            "it is not run again",
            request_id=rec.request_id,
            job_id=rec.job_id,
            expired=True,
        )

    async def _cancel_request(self, call: IncomingCall, ctx: CallContext) -> Outcome:
        body = self._params_body(call, dict(self._json_body(call)))
        self._validate(call.method, body)
        rec = self._record(ctx.job_id or "", str(body.get("request_id", "")))
        cancelled = False
        if not rec.terminal:
            key = (rec.job_id, rec.request_id)
            task = self._tasks.get(key)
            event = self._done.get(key)
            hook = getattr(self.servicer, "cancel_running", None)
            # A servicer whose `cancel_running` answers True ends a running request itself, at
            # its engine's next safe point (completed if it finished first); else the task stops.
            handled = False
            if key in self._started and hook is not None:
                handled = bool(await hook(ctx, rec.request_id))
            if task is not None and not handled:
                task.cancel()
            if event is not None and handled:  # a running engine call may take a while
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), self.config.inline_wait_seconds)
            elif event is not None:
                await event.wait()
            rec = self._record(rec.job_id, rec.request_id)
            cancelled = rec.status == "cancelled"
        return Outcome(
            200,
            call.method,
            value={"request_id": rec.request_id, "cancelled": cancelled, "status": rec.status},
        )

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
                    max_bytes=self.config.limits.result_chunk_bytes,
                )
            ]
            self._events[key] = chunks
        return chunks

    async def drain(self) -> None:
        """Wait for every running request to finish (graceful shutdown)."""
        tasks = list(self._tasks.values())
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # ------------------------------------------------------------------ durable servers

    async def restore(self) -> dict[str, int]:
        """After a restart on a durable request store, take up the requests that had not ended.

        Sequence numbers that executed are marked done. A request that was pending runs from its
        stored body, in its sequence order. A request that was running is handed to the
        servicer with `ctx.recovered` set, when the servicer declares `recovers_running = True`
        (it then collects the outcome from its engine and never runs the request again);
        otherwise it fails with a reason. Call it once, before serving.
        """
        seq = self._sequencer()
        for job_id, seqs in self.requests.executed_seqs().items():
            seq.restore(job_id, seqs)
        counts = {"pending": 0, "running": 0, "failed": 0}
        recovers = bool(getattr(self.servicer, "recovers_running", False))
        for rec in self.requests.unfinished():
            method = M.BY_NAME.get(rec.op)
            running = rec.status != "pending"
            reason = ""
            if method is None:
                reason = f"op {rec.op!r} is unknown to the restarted server"
            elif running and not recovers:
                reason = "the server restarted while the request was running; it is not run again"
            elif rec.body_frame is None:
                reason = "the server restarted and the request's body was not kept"
            if reason:
                rec.status = "failed"
                rec.error = ProtocolError("internal", reason, request_id=rec.request_id).body()[
                    "error"
                ]
                rec.body_frame = None
                self.requests.update(rec)
                if rec.seq is not None:
                    await seq.mark_done(rec.job_id, rec.seq)
                counts["failed"] += 1
                continue
            assert method is not None and rec.body_frame is not None
            body = self._decode(rec.body_frame)
            key_id = rec.identity if rec.identity_kind == "key" else None
            ctx = CallContext(
                method=method,
                job_id=rec.job_id,
                sub_job_id=rec.sub_job_id or None,
                request_id=rec.request_id,
                idempotency_key=key_id,
                seq=rec.seq,
                resumed=True,
                recovered=running,
            )
            self._start(rec, method, ctx, body)
            counts["running" if running else "pending"] += 1
        return counts

    async def hand_off(self, timeout: float) -> int:
        """Graceful shutdown of a durable server: stop accepting, let running requests finish
        for up to `timeout` seconds, then stop waiting. What has not ended stays pending or
        running in the store for the next start (`restore`). Returns how many were handed off."""
        self.draining = True
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
        return len(left) + len(pending)

    def sweep(self, now: float | None = None) -> int:
        """Drop results fetched more than `retention_seconds` ago (their records stay)."""
        now = time.time() if now is None else now
        n = self.requests.expire(now - self.config.limits.retention_seconds)
        if n:
            self._events.clear()  # a cache of result chunks; rebuilt on demand
        return n
