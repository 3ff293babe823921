"""Rendering an `Outcome` as the JSON, DSSST1 or gRPC value a client receives (PROTOCOL.md §3.3)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

import dssst1
from arctic_sdk.spec.model import BodyKind

from ..rules.errors import ProtocolError
from ..rules.jobs import rfc3339
from .core import Outcome, ProtocolCore
from .stores import RequestRecord


def _has_tensor(value: Any) -> bool:
    if isinstance(value, np.ndarray) or hasattr(value, "__dlpack__"):
        return True
    if isinstance(value, dict):
        return any(_has_tensor(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_has_tensor(v) for v in value)
    return isinstance(value, bytes | bytearray)


def _base(rec: RequestRecord) -> dict[str, Any]:
    return {
        "request_id": rec.request_id,
        "job_id": rec.job_id,
        "status": rec.status,
        "created_at": rfc3339(rec.created_at),
        "updated_at": rfc3339(rec.updated_at or time.time()),
    }


def submit_json(outcome: Outcome) -> dict[str, Any]:
    """The 202 body: `SubmitResponse`."""
    assert outcome.record is not None
    return {"request_id": outcome.record.request_id, "job_id": outcome.record.job_id}


def status_json(core: ProtocolCore, outcome: Outcome) -> dict[str, Any]:
    """`RequestStatus` as JSON: tensors travel in a base64 envelope or as result_chunk events."""
    rec = outcome.record
    assert rec is not None
    out = _base(rec)
    events: list[dict[str, Any]] = []
    next_cursor = ""
    n_events = 0
    if rec.status == "completed" and rec.result_frame is not None:
        frame = rec.result_frame
        value = dssst1.loads(frame)
        framed = outcome.method.body is BodyKind.DSSST1 or _has_tensor(value)
        if not framed:
            out["result"] = value
        elif len(frame) <= core.config.limits.max_inline_result_bytes:
            out["result"] = dssst1.inline_envelope(frame)
        else:
            chunks = core.result_events(rec)
            n_events = len(chunks)
            start = min(outcome.cursor, len(chunks))
            end = min(start + outcome.max_events, len(chunks))
            events = [dssst1.result_chunk_event(c) for c in chunks[start:end]]
            next_cursor = str(end) if end < len(chunks) else ""
    _check_cursor(outcome.cursor, n_events)
    if rec.error is not None:
        out["error"] = rec.error
    out["events"] = events
    out["next_cursor"] = next_cursor
    return out


def _check_cursor(cursor: int, n_events: int) -> None:
    """A cursor is an offset into the result's events this server handed out: at most their
    count (0 when there are none); anything else was never issued (invalid_argument)."""
    if cursor > n_events:
        raise ProtocolError(
            "invalid_argument",
            f"cursor {cursor} is not a cursor this server issued (the result has {n_events} "
            "events)",
            field="cursor",
            expected=f"a next_cursor of this request (0..{n_events})",
        )


def status_value(outcome: Outcome) -> dict[str, Any]:
    """`RequestStatus` as a DSSST1 value: the result in place (octet answers and gRPC)."""
    rec = outcome.record
    assert rec is not None
    out = _base(rec)
    if rec.status == "completed" and rec.result_frame is not None:
        out["result"] = dssst1.loads(rec.result_frame)
    if rec.error is not None:
        out["error"] = rec.error
    out["events"] = []
    out["next_cursor"] = ""
    return out
