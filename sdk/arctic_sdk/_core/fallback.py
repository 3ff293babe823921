"""Ops a server lacks a route for (PROTOCOL.md §11), driven by each op's `fallback` option.

- `OPERATION`: the body travels as `POST {job}/operation` with the op's `operation_type`
  (a DSSST1 body inside the envelope's `payload` as an inline base64 envelope);
- `NOOP`: answered locally, `{"applied": false, "reason": ...}`; nothing is sent;
- `WEIGHT_SYNC_SEQUENCE`: `operation` weight-sync, then `operation` reset-prefix-cache;
- `NONE`: `UnimplementedError` before anything is sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dssst1

from ..errors import UnimplementedError
from ..spec.model import Fallback, MethodInfo, Role
from ..spec.tables import methods as M
from .capabilities import Capabilities

_SUB_JOB_TYPE = {Role.TRAINING: "training", Role.SAMPLING: "sampling", Role.LOG_PROB: "log_prob"}


def plan(method: MethodInfo, caps: Capabilities) -> Fallback | None:
    """None when the server serves `method` itself, else the fallback to apply."""
    if caps.has_route(method):
        return None
    if method.fallback is Fallback.NONE:
        raise UnimplementedError(
            f"the server does not serve {method.name} (its capabilities list no such route) "
            "and the op has no fallback",
            op=method.name,
        )
    return method.fallback


def sequenced(method: MethodInfo) -> bool:
    """Mutating data-plane ops take a sequence number (PROTOCOL.md §7.2)."""
    return method.mutating and method.service == M.FORWARD_BACKWARD.service and not method.protocol


def seq_count(method: MethodInfo, caps: Capabilities) -> int:
    """How many sequence numbers one call of `method` uses against this server."""
    if not caps.sequencing or not sequenced(method):
        return 0
    try:
        fb = plan(method, caps)
    except UnimplementedError:
        return 0
    if fb is None or fb is Fallback.OPERATION:
        return 1
    if fb is Fallback.WEIGHT_SYNC_SEQUENCE:
        return 2
    return 0


def noop_result(method: MethodInfo) -> dict[str, Any]:
    return {"applied": False, "reason": f"server has no {method.name} route"}


def operation_payload(method: MethodInfo, body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The body `method` takes as a different op's body, or None when it travels as is.

    `log-probs` falls back to the `forward` operation, whose payload is a forward body.
    """
    if method is M.LOG_PROBS:
        post = ["compute_logprobs"] + (["compute_entropy"] if body.get("entropy") else [])
        kwargs = {k: body[k] for k in ("input_ids", "attention_mask") if k in body}
        return {"kwargs": kwargs, "processing": {"post": post}}
    return None


def operation_body(
    operation_type: str,
    method: MethodInfo,
    body: Mapping[str, Any],
    frame: dssst1.EncodedFrame | None,
    sub_job_id: str | None,
) -> dict[str, Any]:
    """The `/operation` envelope carrying `method`'s body."""
    out: dict[str, Any] = {"operation_type": operation_type}
    if sub_job_id:
        out["sub_job_id"] = sub_job_id
    elif method.role in _SUB_JOB_TYPE:
        out["sub_job_type"] = _SUB_JOB_TYPE[method.role]
    out["payload"] = dssst1.inline_envelope(frame.tobytes()) if frame is not None else dict(body)
    return out


def operation_result(value: Any) -> Any:
    """The op's result inside an `OperationResult` (`{"result": ...}`), envelopes decoded."""
    inner = value.get("result", value) if isinstance(value, Mapping) else value
    if isinstance(inner, Mapping) and inner.get("wire_format") == "DSSST1":
        return dssst1.loads(dssst1.decode_inline_envelope(inner))
    return inner
