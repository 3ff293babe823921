"""The `operation_type`s of the deployed `/operation` envelope (training.proto `OperationRequest`).

Each is the method table's `operation_type` of the op it stands for, plus `tail-logs`, which has
no op of its own; every server accepts these and answers them in `capabilities`.

The envelope's checks every server shares are here too: the operation type, the target
(`sub_job_id` / `sub_job_type`), the payload's keys, `tail-logs` paging and the `forward` body
(`check_operation`, `operation_target`, `operation_sub`, `tail_args`, `forward_body`). The
core runs `cancel-request` (`protocol/inproc.py`'s `cancel_request`); each server adds its own
weight-sync and forward checks and runs the other operations.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Mapping
from typing import Any

from google.protobuf import descriptor_pool

import dssst1
from arctic_sdk.spec import value_rules
from arctic_sdk.spec.pb.arctic.v1 import options_pb2
from arctic_sdk.spec.tables import methods as M

from .errors import ProtocolError
from .jobs import JobRecord, S, role_of, sub_job_by_id
from .sub_jobs import field_error
from .validate import validate_body

OP_WEIGHT_SYNC = M.SYNC_WEIGHTS.operation_type
OP_RESET = M.RESET_PREFIX_CACHE.operation_type
OP_CANCEL = M.CANCEL_REQUEST.operation_type
OP_FORWARD = M.FORWARD.operation_type
OP_TAIL_LOGS = "tail-logs"
OPERATION_TYPES = (OP_WEIGHT_SYNC, OP_RESET, OP_CANCEL, OP_TAIL_LOGS, OP_FORWARD)

# The payload keys each operation type takes (forward: a `ForwardRequest`, checked by the schema).
PAYLOAD_KEYS: dict[str, frozenset[str]] = {
    OP_WEIGHT_SYNC: frozenset(
        {
            "source_sub_job_id",
            "target_sub_job_ids",
            "method",
            "cuda_ipc",
            "low_memory",
            "weight_format",
        }
    ),
    OP_RESET: frozenset({"drain", "timeout_s", "retry_interval_s"}),
    OP_CANCEL: frozenset({"request_id"}),
    OP_TAIL_LOGS: frozenset({"cursor", "limit"}),
}
TAIL_MAX = 1000  # the most log lines one `tail-logs` page holds
TAIL_DEFAULT = 100


def check_operation(
    job: JobRecord[Any], body: Mapping[str, Any], operation_types: Iterable[str]
) -> tuple[str, Mapping[str, Any]]:
    """The envelope checks every server makes (a 4xx before anything runs): a known
    `operation_type`, its target, the payload's keys, `cancel-request`'s `request_id` and
    `tail-logs` paging. Answers the operation type and its payload."""
    otype = str(body.get("operation_type") or "")
    if not otype:
        raise field_error("operation_type", "is required", "missing_field")
    types = list(operation_types)
    if otype not in types:
        raise ProtocolError(
            "unknown_operation_type",
            f"operation_type {otype!r} is not one of {types}",
            field="operation_type",
            operation_type=otype,
            expected=types,
        )
    operation_target(job, body)
    payload: Mapping[str, Any] = body.get("payload") or {}
    keys = PAYLOAD_KEYS.get(otype)
    if keys is not None:
        unknown = sorted(set(payload) - keys)
        if unknown:
            raise field_error(
                f"payload.{unknown[0]}",
                f"unknown payload field(s) {unknown} for {otype}; expected {sorted(keys)}",
                unknown_fields=unknown,
            )
    if otype == OP_CANCEL and not payload.get("request_id"):
        raise field_error("payload.request_id", "is required", "missing_field")
    check_payload_rules(otype, payload)
    if otype == OP_TAIL_LOGS:
        tail_args(payload)
    return otype, payload


# The op whose request message holds the field rules of each operation type's payload.
PAYLOAD_MESSAGES = {
    OP_WEIGHT_SYNC: M.SYNC_WEIGHTS.request_type,
    OP_RESET: M.RESET_PREFIX_CACHE.request_type,
    OP_CANCEL: M.CANCEL_REQUEST.request_type,
}


def check_payload_rules(otype: str, payload: Mapping[str, Any]) -> None:
    """The string rules (`(arctic.v1.field)` `pattern` / `max_length`: the id rule, PROTOCOL.md
    §13) of the payload's fields, read from the op's request message: a hostile
    `payload.request_id` is `invalid_argument` naming it, as on the op's own route."""
    name = PAYLOAD_MESSAGES.get(otype)
    if name is None:
        return
    desc = descriptor_pool.Default().FindMessageTypeByName(name)
    for key, value in payload.items():
        fd = desc.fields_by_name.get(key)
        if fd is None or fd.type != fd.TYPE_STRING:
            continue
        opts = fd.GetOptions().Extensions[options_pb2.field]
        if not (opts.pattern or opts.max_length):
            continue
        if fd.is_repeated and isinstance(value, list):
            items = [(f"payload.{key}[{i}]", v) for i, v in enumerate(value)]
        else:
            items = [(f"payload.{key}", value)]
        for path, item in items:
            bad = (
                f"expected a string, got {type(item).__name__}"
                if not isinstance(item, str)
                else value_rules.string_rule_error(opts, item)
            )
            if bad is not None:
                raise ProtocolError(
                    "invalid_argument",
                    f"field {path}: {bad}",
                    field=path,
                    expected=opts.pattern or f"at most {opts.max_length} characters",
                )


def operation_target(job: JobRecord[Any], body: Mapping[str, Any]) -> str:
    """The envelope's target: its `sub_job_id`, else the role its `sub_job_type` names, else "";
    `sub_job_id` and `sub_job_type` must agree when both are given."""
    sid, stype = body.get("sub_job_id"), body.get("sub_job_type")
    role = None
    if stype:
        role = role_of(stype)
        if role is None:
            raise field_error(
                "sub_job_type",
                f"{stype!r} is not training, sampling or log_prob",
                expected=["training", "sampling", "log_prob"],
            )
    if sid:
        sub = sub_job_by_id(job, sid)
        if role is not None and sub.role != role:
            raise field_error(
                "sub_job_type", f"{stype!r} disagrees with sub_job_id {sid}", expected=sub.role
            )
        return str(sid)
    return role or ""


def operation_sub(job: JobRecord[S], body: Mapping[str, Any], default_role: str) -> S:
    """The sub-job an operation runs on: its target, else the first of `default_role`."""
    t = operation_target(job, body)
    sub = job.find_sub_job(t) or job.sub_job(t or default_role) or job.sub_job(default_role)
    if sub is None:
        raise ProtocolError(
            "sub_job_not_found",
            f"job {job.job_id} has no {t or default_role} sub-job",
            job_id=job.job_id,
        )
    return sub


def tail_args(payload: Mapping[str, Any]) -> tuple[int, int]:
    """`tail-logs`' `(cursor, limit)`: cursor >= 0 (default 0), limit in [1, TAIL_MAX]."""
    try:
        cursor = int(payload.get("cursor") or 0)
        limit = int(payload["limit"]) if payload.get("limit") is not None else TAIL_DEFAULT
    except (TypeError, ValueError):
        raise field_error("payload.cursor", "cursor and limit must be integers") from None
    if cursor < 0 or not 1 <= limit <= TAIL_MAX:
        raise field_error(
            "payload.limit",
            f"cursor must be >= 0 and limit in [1, {TAIL_MAX}]",
            expected=f"cursor >= 0, 1 <= limit <= {TAIL_MAX}",
        )
    return cursor, limit


def forward_body(payload: Mapping[str, Any]) -> dict[str, Any]:
    """A `forward` operation's `ForwardRequest` body, checked against the schema (field paths
    under `payload.`): a DSSST1 envelope in `payload_b64`, or the payload itself as JSON with
    nested lists."""
    body: Any
    if "payload_b64" in payload:
        try:
            frame = base64.b64decode(str(payload["payload_b64"]), validate=True)
        except (binascii.Error, ValueError):
            raise field_error("payload.payload_b64", "is not base64", "base64_invalid") from None
        try:
            body = dssst1.loads(frame)
        except dssst1.DSSError as exc:
            raise ProtocolError(exc.code, str(exc), field="payload.payload_b64") from None
    else:
        body = dict(payload)
    if not isinstance(body, dict):
        raise field_error("payload", "the forward body must be an object")
    desc = descriptor_pool.Default().FindMessageTypeByName(M.FORWARD.request_type)
    try:
        validate_body(desc, body)
    except ProtocolError as exc:
        field = exc.details.get("field")
        if isinstance(field, str):
            exc.details["field"] = "payload." + field
        raise
    return body
