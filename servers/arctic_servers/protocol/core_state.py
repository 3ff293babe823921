"""The state of the protocol core and what every step of a call uses: auth, the capabilities
answer, bodies (JSON, path and query parameters, DSSST1 frames, validation) and request look-up."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from google.protobuf import descriptor_pool

import arctic_sdk.spec.pb.arctic.v1 as _pb  # noqa: F401  (registers the spec's messages)
import dssst1
from arctic_sdk.spec.model import MethodInfo
from arctic_sdk.spec.tables import methods as M

from ..rules import limits as input_limits
from ..rules.errors import ProtocolError
from ..rules.jobs import config_keys_json
from ..rules.validate import validate_body
from ..telemetry.metrics import ServerMetrics
from .auth import accepted_token
from .calls import IncomingCall
from .chunk_groups import ChunkBudget, ChunkGroups
from .config import ProtocolConfig
from .context import CallContext
from .faultpoints import CoreHooks
from .metrics_live import LiveCollector
from .sampling_queue import SamplingQueue
from .sequencer import Sequencer
from .servicer_hooks import ServicerHooks
from .stores import (
    ChunkStore,
    MemoryChunkStore,
    MemoryRequestStore,
    RequestRecord,
    RequestStore,
)

Op = Callable[[CallContext, Any], Awaitable[Any]]


class CoreState:
    """What every part of the core shares: the servicer, the stores, the config, the hooks and
    the metrics, with the steps every call uses (auth, bodies, validation, request look-up)."""

    def __init__(
        self,
        servicer: ServicerHooks,
        config: ProtocolConfig | None = None,
        *,
        request_store: RequestStore | None = None,
        chunk_store: ChunkStore | None = None,
        hooks: CoreHooks | None = None,
    ) -> None:
        self.servicer = servicer
        self.hooks = hooks or CoreHooks()  # declared fault points (`faultpoints.CoreHooks`)
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
        budget = ChunkBudget(
            per_job_bytes=limits.max_open_chunk_bytes_per_job,
            server_bytes=limits.max_open_chunk_bytes,
            ttl_seconds=limits.chunk_group_ttl_seconds,
        )
        self.groups = ChunkGroups(chunk_store or MemoryChunkStore(), self.codec_limits, budget)
        self._seq: Sequencer | None = None
        self._pool = descriptor_pool.Default()
        self.implemented_ops = frozenset(self.implemented())
        # op -> the servicer method that serves it, built once from the method table
        self._ops: dict[MethodInfo, Op] = {
            m: getattr(servicer, m.python_name) for m in self.implemented_ops if not m.protocol
        }
        self.sampling = SamplingQueue(limits.max_sampling_requests_per_job)
        self.draining = False  # refuse new work (503) while a server shuts down
        # Prometheus families (`metrics.py`), and those read from live state at scrape time
        self.metrics = ServerMetrics(self.config.server, self.config.server_version)
        self.metrics.add_collector(LiveCollector(self))
        self._drain_event: asyncio.Event | None = None

    def drain_event(self) -> asyncio.Event:
        """Set when the server starts draining (created inside the running loop)."""
        if self._drain_event is None:
            self._drain_event = asyncio.Event()
            if self.draining:
                self._drain_event.set()
        return self._drain_event

    def start_draining(self) -> None:
        """Refuse new work from now on, and give up reading bodies still arriving (503)."""
        self.draining = True
        self.drain_event().set()

    # ------------------------------------------------------------------ auth and jobs

    def op(self, method: MethodInfo) -> Op:
        """The servicer method that serves `method` (`unimplemented` where it has none)."""
        op = self._ops.get(method)
        if op is None:
            raise ProtocolError(
                "unimplemented",
                f"this server ({self.config.server}) does not implement {method.name}",
                op=method.name,
            )
        return op

    def authenticate_call(self, call: IncomingCall) -> str | None:
        if call.method is M.GET_CAPABILITIES:
            return None  # no token needed, none read
        return self.authenticate(call.headers.get("authorization", ""))

    def authenticate(self, authorization: str) -> str | None:
        """The caller's token of an `Authorization` header value, under the server's tokens
        (`auth.accepted_token`: `unauthenticated` when auth is on and it is not one of them)."""
        return accepted_token(authorization, self.config.tokens, self.config.token_sha256)

    @property
    def auth_on(self) -> bool:
        """The server has tokens: its callers are told apart by them."""
        return bool(self.config.tokens or self.config.token_sha256)

    @staticmethod
    def parse_seq(raw: str | None) -> int | None:
        return input_limits.check_seq(raw)

    async def authorize_job(self, ctx: CallContext, *, running: bool) -> None:
        await self.servicer.authorize_job(ctx, running=running)

    # ------------------------------------------------------------------ capabilities

    def implemented(self) -> list[MethodInfo]:
        out = []
        for m in M.METHODS:
            if m.protocol:
                out.append(m)
                continue
            if self.servicer.implements(m):
                out.append(m)
        return out

    def capabilities(self) -> dict[str, Any]:
        c, lim = self.config, self.config.limits
        return {
            "spec_version": "arctic.v1",
            "wire_formats": ["DSSST1"],
            "routes": [m.name for m in self.implemented()],
            "operation_types": list(self.servicer.operation_types),
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
                "max_frame_bytes": lim.frame_bytes,  # what the chunk budgets let through
                "max_chunks": lim.max_chunks,
                "max_tensors": lim.max_tensors,
                "max_depth": lim.max_depth,
                "max_grpc_message_bytes": lim.max_grpc_message_bytes,
                "retention_seconds": lim.retention_seconds,
                "sequence_gap_timeout_seconds": int(lim.sequence_gap_timeout_seconds),
                "max_inline_result_bytes": lim.max_inline_result_bytes,
                "max_open_chunk_bytes_per_job": lim.max_open_chunk_bytes_per_job,
                "max_open_chunk_bytes": lim.max_open_chunk_bytes,
                "chunk_group_ttl_seconds": lim.chunk_group_ttl_seconds,
                "header_read_timeout_seconds": int(lim.header_read_timeout_seconds),
                "body_read_timeout_seconds": int(lim.body_read_timeout_seconds),
                "max_sub_jobs": lim.max_sub_jobs,
                "max_sampling_requests_per_job": lim.max_sampling_requests_per_job,
            },
            "server": c.server,
            "server_version": c.server_version,
            # the sub-job config keys accepted: the standard ones and the server's extensions
            "config_keys": self.servicer.config_keys or config_keys_json(),
            # LoRA support (jobs.proto `LoraSupport`; absent: no LoRA jobs)
            **({"lora": lora} if (lora := self.servicer.lora_support) else {}),
        }

    # ------------------------------------------------------------------ bodies

    def json_body(self, call: IncomingCall) -> Any:
        """A JSON body (or a gRPC message's JSON form) under the input limits (`limits.py`)."""
        depth = self.config.limits.max_depth
        if call.value is not None:
            input_limits.check_value(call.value, depth)
            return call.value
        if call.body is None or len(call.body) == 0:
            return {}
        value = input_limits.load_json(call.body, depth)
        if not isinstance(value, dict):
            raise ProtocolError(
                "invalid_json", f"the body must be a JSON object, got {type(value).__name__}"
            )
        return value

    def params_body(self, call: IncomingCall, body: dict[str, Any]) -> dict[str, Any]:
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

    def validate(self, method: MethodInfo, body: Any) -> None:
        try:
            validate_body(self._pool.FindMessageTypeByName(method.request_type), body)
        except ProtocolError as exc:
            if self.hooks.body_refused is None:
                raise
            self.hooks.body_refused(method, body, exc)

    def decode(self, frame: bytes | memoryview) -> Any:
        """A DSSST1 body: the codec's checks, then the input limits on its non-tensor values."""
        try:
            value = dssst1.loads(frame, limits=self.codec_limits)
        except dssst1.DSSError as exc:
            raise ProtocolError(exc.code, str(exc), field=exc.path or "body") from None
        input_limits.check_value(value, self.config.limits.max_depth + 1)
        return value

    # ------------------------------------------------------------------ requests

    def record(self, job_id: str, request_id: str) -> RequestRecord:
        rec = self.requests.get(job_id, request_id)
        if rec is None:
            raise ProtocolError(
                "request_not_found",
                f"no request {request_id!r} in job {job_id!r}",
                request_id=request_id,
                job_id=job_id,
            )
        if rec.expired:
            raise self.expired(rec)
        return rec

    def expired(self, rec: RequestRecord) -> ProtocolError:
        return ProtocolError(
            "request_not_found",
            f"request {rec.request_id} of job {rec.job_id} ended and its result was dropped "
            f"{self.config.limits.retention_seconds} s after it was first fetched (retention); "
            "it is not run again",
            request_id=rec.request_id,
            job_id=rec.job_id,
            expired=True,
        )

    @staticmethod
    def key_conflict(key: str) -> ProtocolError:
        return ProtocolError(
            "idempotency_key_conflict",
            f"Idempotency-Key {key!r} was already used in this scope with a different body",
            idempotency_key=key,
        )

    def sequencer(self) -> Sequencer:
        if self._seq is None:  # created inside the running loop
            self._seq = Sequencer(self.config.limits.sequence_gap_timeout_seconds)
        if self.hooks.sequencer is not None:
            return self.hooks.sequencer(self._seq)
        return self._seq
