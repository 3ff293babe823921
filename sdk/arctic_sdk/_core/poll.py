"""Polling a submitted request, and decoding its result (PROTOCOL.md §3.3).

The poll state machine: while the request is in flight, wait with capped exponential backoff
(0.5 s x1.25, capped at 6 s, never past the deadline); while an answer has a `next_cursor`, poll
again at once with it (cursor draining, no sleep); collect `result_chunk` events, checking each
`payload_sha256`, into a `dssst1.ChunkAssembler`. A result arrives as a JSON value, an inline
base64 envelope, result chunk events, or in place (octet answers and gRPC).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import dssst1

from ..config import PollConfig
from ..errors import ArcticError, ArcticTimeoutError, ServerError, error_from_code
from ..spec.model import MethodInfo
from ..spec.tables import methods as M
from ..spec.tables.error_codes import ErrorCode
from .effects import Flow, Progress, Sleep
from .errors_parse import parse_error, to_exception
from .replies import Exchange, Reply, Status, Submitted, Value

log = logging.getLogger("arctic_sdk")

IN_FLIGHT = frozenset({"pending", "running", "streaming", "queued"})
_SYNONYMS = {
    "succeeded": "completed",
    "done": "completed",
    "success": "completed",
    "canceled": "cancelled",
    "error": "failed",
}
PROGRESS_AFTER_S = 2.0  # show a waiting bar once a request has been pending this long
PROGRESS_BYTES = 32 * 1024 * 1024  # show a download bar for results from this size


def request_state(raw: Any) -> str:
    """`"REQUEST_STATE_COMPLETED"`, `"succeeded"`, `"done"`... -> `"completed"`."""
    s = str(raw or "").strip().lower().removeprefix("request_state_")
    return _SYNONYMS.get(s, s)


def is_envelope(value: Any) -> bool:
    return (
        isinstance(value, Mapping)
        and value.get("wire_format") == "DSSST1"
        and "payload_b64" in value
    )


def request_error(
    status: Mapping[str, Any], method: MethodInfo, redact: Callable[[str], str]
) -> ArcticError:
    """The exception of a failed or cancelled request."""
    rid = str(status.get("request_id") or "") or None
    state = request_state(status.get("status"))
    raw = status.get("error")
    if state == "cancelled" and not raw:
        return error_from_code(
            ErrorCode.REQUEST_CANCELLED,
            f"request {rid} was cancelled",
            request_id=rid,
            op=method.name,
            failed=True,
        )
    parsed = parse_error(raw if raw not in (None, "", {}) else f"request {rid} {state}", None)
    if state == "cancelled" and parsed.code != ErrorCode.REQUEST_CANCELLED:
        parsed = type(parsed)(
            ErrorCode.REQUEST_CANCELLED, parsed.message, parsed.details, parsed.body
        )
    return to_exception(
        parsed, status=None, op=method.name, request_id=rid, failed=True, redact=redact
    )


class ResultCollector:
    """Accumulates `result_chunk` events and decodes the final result."""

    def __init__(self, tensors: str) -> None:
        self._tensors = tensors
        self._asm: dssst1.ChunkAssembler | None = None
        self._frame: memoryview | None = None
        self.bytes_received = 0

    def add_events(self, events: Any) -> None:
        for event in events or ():
            if not isinstance(event, Mapping) or event.get("type") != "result_chunk":
                continue  # readers ignore event types they do not know
            chunk = dssst1.decode_result_chunk_event(event)
            self.bytes_received += len(chunk)
            if self._asm is None:
                self._asm = dssst1.ChunkAssembler("result")
            frame = self._asm.feed(chunk)
            if frame is not None:
                self._frame = frame

    @property
    def frame_size(self) -> int:
        """The size of the result frame being received (0 before its first chunk)."""
        desc = self._asm.descriptor if self._asm is not None else None
        return desc.frame_size_bytes if desc is not None else 0

    def result(self, status: Mapping[str, Any], in_place: bool) -> Any:
        if self._asm is not None:
            frame = self._frame if self._frame is not None else self._asm.finish()
            return dssst1.loads(frame, tensors=self._tensors)  # type: ignore[arg-type]
        value = status.get("result")
        if not in_place and is_envelope(value):
            frame_bytes = dssst1.decode_inline_envelope(value)
            return dssst1.loads(frame_bytes, tensors=self._tensors)  # type: ignore[arg-type]
        return value


def poll_exchange(
    method: MethodInfo,
    job_id: str,
    request_id: str,
    cursor: str,
    cfg: PollConfig,
    accept_octet: bool,
) -> Exchange:
    """The `GetRequest` exchange of one poll."""
    query: list[tuple[str, str]] = []
    message: dict[str, Any] = {"job_id": job_id, "request_id": request_id}
    if cursor:
        query.append(("cursor", cursor))
        message["cursor"] = cursor
    if cfg.max_events:
        query.append(("max_events", str(cfg.max_events)))
        message["max_events"] = cfg.max_events
    return Exchange(
        method=M.GET_REQUEST,
        job_id=job_id,
        path_params={"job_id": job_id, "request_id": request_id},
        query=query,
        message=message,
        accept_octet=accept_octet,
    )


def await_result(
    first: Reply,
    *,
    method: MethodInfo,
    job_id: str,
    send_poll: Callable[[Exchange], Flow[Reply]],
    cfg: PollConfig,
    clock: Callable[[], float],
    deadline_at: float,
    tensors: str,
    accept_octet: bool,
    redact: Callable[[str], str],
    seen: Callable[[str], None] | None = None,
) -> Flow[Any]:
    """From the first answer of a data-plane call to its result: poll, drain, decode.

    `seen` is told the request's id as soon as an answer names it (what an abandoned call
    cancels). Progress bars this flow starts are closed by the driver when the flow ends.
    """
    collector = ResultCollector(tensors)
    delay = cfg.initial
    cursor = ""
    started = clock()
    bar = False
    reply = first
    request_id = ""
    while True:
        if isinstance(reply, Value):
            return reply.value
        if isinstance(reply, Submitted):
            request_id = reply.request_id or request_id
            status: Mapping[str, Any] = {"status": "pending", "request_id": request_id}
            in_place = False
        elif isinstance(reply, Status):
            status, in_place = reply.status, reply.in_place
            request_id = str(status.get("request_id") or request_id)
        else:  # pragma: no cover - exchange() only returns the kinds above here
            raise ServerError(f"unexpected answer {type(reply).__name__} to {method.name}")
        if seen is not None and request_id:
            seen(request_id)
        before = collector.bytes_received
        try:
            collector.add_events(status.get("events"))
        except dssst1.DSSError as exc:
            raise ServerError(
                f"result chunk of request {request_id} is corrupt: {exc}",
                code="internal",
                request_id=request_id,
                op=method.name,
                details={"codec_code": exc.code},
            ) from None
        size = collector.frame_size
        if size >= PROGRESS_BYTES and collector.bytes_received > before:
            key = f"download:{request_id}"
            if not before:
                yield Progress(key, "start", desc=f"{method.name} result", total=size)
            yield Progress(key, "update", n=collector.bytes_received - before)
        state = request_state(status.get("status"))
        next_cursor = str(status.get("next_cursor") or "")
        if next_cursor:
            cursor = next_cursor  # more events are ready: poll again at once
        elif state == "completed":
            try:
                return collector.result(status, in_place)
            except dssst1.DSSError as exc:
                raise ServerError(
                    f"the result of request {request_id} does not decode: {exc}",
                    code="internal",
                    request_id=request_id,
                    op=method.name,
                    details={"codec_code": exc.code},
                ) from None
        elif state in ("failed", "cancelled"):
            raise request_error(status, method, redact)
        else:
            if not request_id:
                raise ServerError(
                    f"{method.name}: in-flight answer without a request_id",
                    code="internal",
                    op=method.name,
                )
            remaining = deadline_at - clock()
            if remaining <= 0:
                raise _timeout(method, request_id, state)
            waited = clock() - started
            if waited >= PROGRESS_AFTER_S:
                if not bar:
                    bar = True
                    yield Progress(request_id, "start", desc=f"{method.name} ({state})", unit="s")
                else:
                    yield Progress(
                        request_id, "update", desc=f"{method.name} ({state})", n=delay, unit="s"
                    )
            yield Sleep(min(delay, remaining))
            delay = min(delay * cfg.multiplier, cfg.max_interval)
        if deadline_at - clock() <= 0:
            raise _timeout(method, request_id, state)
        try:
            reply = yield from send_poll(
                poll_exchange(method, job_id, request_id, cursor, cfg, accept_octet)
            )
        except ArcticTimeoutError:
            raise _timeout(method, request_id, state) from None


def _timeout(method: MethodInfo, request_id: str, state: str) -> ArcticTimeoutError:
    return ArcticTimeoutError(
        f"{method.name}: request {request_id} did not complete within the call's deadline "
        f"(last state {state!r}); it keeps running on the server",
        request_id=request_id,
        op=method.name,
    )


def poll_status(reply: Reply, tensors: str) -> dict[str, Any]:
    """The `RequestStatus` of an explicit `get_request`, with an inline envelope decoded."""
    if isinstance(reply, Status):
        status = dict(reply.status)
        if not reply.in_place and is_envelope(status.get("result")):
            frame = dssst1.decode_inline_envelope(status["result"])
            status["result"] = dssst1.loads(frame, tensors=tensors)  # type: ignore[arg-type]
        return status
    if isinstance(reply, Value) and isinstance(reply.value, dict):
        return reply.value
    return {"status": "pending", "request_id": getattr(reply, "request_id", "")}
