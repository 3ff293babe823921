"""A call as a transport hands it to the protocol core, the `Outcome` the core answers, and the
call's server span (`telemetry/tracing.py` has the whole trace)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from arctic_sdk import tracing as t
from arctic_sdk.spec.model import MethodInfo
from arctic_sdk.tracing import extract

from .stores import RequestRecord


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
    # a call of the in-process binding (`inproc.py`, transport "inproc"): `value` is the body as
    # decoded values (tensors as arrays, no frame), and the result value is put in this box as
    # the servicer answered it. The SDK's in-process transport (`arctic_sdk.transports.inproc`)
    # is "inproc" too but carries wire bodies, as HTTP does, and no box.
    result_box: dict[str, Any] | None = None

    @property
    def carries_values(self) -> bool:
        """The body is `value`, decoded values (the in-process binding), not a wire body."""
        return self.result_box is not None

    # The server's id of this call (`X-Request-Id`, logs, spans); a recorded request answers
    # its own id instead (`Outcome.request_id`).
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)


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

    def request_id(self, call: IncomingCall) -> str:
        """The id an answer names: its request's (a status or a submit), else the call's."""
        return self.record.request_id if self.record is not None else call.request_id

    def code(self) -> str:
        """The answer as a metrics `code`: "ok", or the error of a request that ended failed."""
        rec = self.record
        if rec is None or not rec.terminal or rec.status == "completed":
            return "ok"
        return str((rec.error or {}).get("code") or "internal")


def call_span(call: IncomingCall) -> Any:
    """The span of one call to the core (None when tracing is off)."""
    if not t.enabled():
        return None
    return t.start_span(
        f"arctic.server {call.method.name}",
        kind="server",
        parent=extract(call.headers),
        attributes={
            "arctic.op": call.method.name,
            "arctic.transport": call.transport,
            "arctic.job_id": call.path_params.get("job_id") or call.headers.get("x-arctic-job-id"),
        },
    )
