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
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import descriptor_pool

import arctic_sdk._generated.arctic.v1 as _pb  # noqa: F401  (registers the spec's messages)
import dssst1
from arctic_sdk._generated import methods as M
from arctic_sdk._spec import BodyKind, GrpcShape, Idempotency, MethodInfo

from .._generated.servicer import ServicerBase
from .chunk_groups import ChunkGroups
from .config import ProtocolConfig
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
        return await self._data_plane(call, ctx)

    # ------------------------------------------------------------------ auth and jobs

    def _authenticate(self, call: IncomingCall) -> str | None:
        auth = call.headers.get("authorization", "")
        token = auth[7:].strip() if auth[:7].lower() == "bearer " else None
        if self.config.tokens and call.method is not M.GET_CAPABILITIES:
            if not token:
                raise ProtocolError("unauthenticated", "missing Authorization: Bearer <token>")
            if token not in self.config.tokens:
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
                    raise ProtocolError(
                        "chunk_group_restart_required",
                        f"chunk group {step.replay_group!r} has no request; replay from chunk 0",
                        chunk_group_id=step.replay_group,
                        expected_start_chunk=0,
                    )
                return await self._answer(rec, method, call)
            assert step.frame is not None
            body = self._decode(step.frame)
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
        return await self._submit(call, ctx, body, kind, identity, body_hash, group)

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
        rec = RequestRecord(
            job_id=job_id,
            request_id=uuid.uuid4().hex,
            op=method.name,
            identity_kind=kind,
            identity=identity,
            body_hash=body_hash,
            seq=ctx.seq if self.config.sequencing else None,
            token_hash=hashlib.sha256((ctx.token or "").encode()).hexdigest()[:16],
        )
        self.requests.create(rec)  # recorded before anything executes
        if group:
            self.groups.bind_request(job_id, group, rec.request_id)
        ctx.request_id = rec.request_id
        key = (job_id, rec.request_id)
        self._done[key] = asyncio.Event()
        self._tasks[key] = asyncio.get_running_loop().create_task(self._run(rec, method, ctx, body))
        return await self._answer(rec, method, call)

    def _sequencer(self) -> Sequencer:
        if self._seq is None:  # created inside the running loop
            self._seq = Sequencer(self.config.limits.sequence_gap_timeout_seconds)
        return self._seq

    async def _run(
        self, rec: RequestRecord, method: MethodInfo, ctx: CallContext, body: Any
    ) -> None:
        key = (rec.job_id, rec.request_id)
        seq = self._sequencer()
        try:
            if rec.seq is not None:
                await seq.wait_turn(rec.job_id, rec.seq)
            rec.status = "running"
            self.requests.update(rec)
            result = await self._invoke(method, ctx, body)
            rec.result_frame = dssst1.dumps(result)
            rec.status = "completed"
        except ProtocolError as exc:
            rec.status, rec.error = "failed", exc.body()["error"]
        except asyncio.CancelledError:
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
        finally:
            self.requests.update(rec)
            if rec.seq is not None:
                await seq.mark_done(rec.job_id, rec.seq)
            self._tasks.pop(key, None)
            event = self._done.pop(key, None)
            if event is not None:
                event.set()

    async def _answer(self, rec: RequestRecord, method: MethodInfo, call: IncomingCall) -> Outcome:
        event = self._done.get((rec.job_id, rec.request_id))
        mode = self.config.answer_mode
        if event is not None and not rec.terminal:
            if mode == "inline":
                await event.wait()
            elif mode == "auto" or method.inline_preferred:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), self.config.inline_wait_seconds)
        fresh = self.requests.get(rec.job_id, rec.request_id) or rec
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
        return rec

    async def _cancel_request(self, call: IncomingCall, ctx: CallContext) -> Outcome:
        body = self._params_body(call, dict(self._json_body(call)))
        self._validate(call.method, body)
        rec = self._record(ctx.job_id or "", str(body.get("request_id", "")))
        cancelled = False
        if not rec.terminal:
            task = self._tasks.get((rec.job_id, rec.request_id))
            hook = getattr(self.servicer, "cancel_running", None)
            if rec.status == "running" and hook is not None:
                await hook(ctx, rec.request_id)
            if task is not None:
                task.cancel()
                event = self._done.get((rec.job_id, rec.request_id))
                if event is not None:
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
