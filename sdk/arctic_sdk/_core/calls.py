"""One call of an op, from the caller's arguments to its result: the client's protocol logic.

`prepare` runs when a call is submitted, synchronously: it binds path parameters and the job,
validates the body (bad input never reaches the wire), encodes a DSSST1 body, draws the
idempotency key or chunk-group id, and reserves the call's sequence numbers. `call_flow` is the
generator the drivers run: capabilities (once per client, `state.ensure_caps`), fallbacks, the
request (`submit`: its body or chunk group, replayed once on restart_required), retries,
resubmission of what never ran, and the poll state machine.
"""

from __future__ import annotations

import logging
import secrets
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from .._client_base import CallOptions
from ..errors import (
    ArcticError,
    refused_locally,
)
from ..spec.model import BodyKind, Fallback, Idempotency, MethodInfo
from ..spec.tables import methods as M
from ..spec.tables.error_codes import ErrorCode
from . import chunks, fallback
from .abandon import ABANDONED, abandon
from .capabilities import Capabilities
from .effects import Flow
from .poll import await_result, poll_status
from .replies import Exchange, Raw, Reply, Value
from .requests import is_data_plane
from .retry import Deadline
from .state import CoreState, PreparedCall, ensure_caps
from .submit import send_group, submit
from .validate import request_fields, validate_body

log = logging.getLogger("arctic_sdk")
# How often a request that failed `not_executed` (it never ran) is resubmitted under its identity.
RESUBMITS = 3


def _query(body: Mapping[str, Any]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for k, v in body.items():
        for item in v if isinstance(v, list | tuple) else [v]:
            out.append((k, str(item).lower() if isinstance(item, bool) else str(item)))
    return out


_DEFAULT_OPTIONS = CallOptions()


def prepare(
    state: CoreState, method: MethodInfo, body: Mapping[str, Any], options: CallOptions | None
) -> PreparedCall:
    """Everything about a call that needs no I/O; raises `InvalidArgumentError` on bad input."""
    opts = options or _DEFAULT_OPTIONS
    rest = dict(body)
    params: dict[str, str] = {}
    for name in method.path_params:
        value = rest.pop(name, None)
        if name == "job_id" and value in (None, ""):
            value = opts.job_id or state.job_id
        if value in (None, ""):
            hint = (
                " (create one with client.create_job(...), or pass job_id=)"
                if name == "job_id"
                else ""
            )
            raise refused_locally(
                "missing_field",
                f"{method.name}: no {name}{hint}",
                op=method.name,
                details={"field": name},
            )
        params[name] = str(value)
    if not method.job_scoped and "job_id" in rest and method is not M.CREATE_JOB:
        rest.pop("job_id")
    fields = request_fields(method)  # path parameters bound to a field are checked as one
    validate_body(method, {**rest, **{k: v for k, v in params.items() if k in fields}})
    cfg = state.config
    prep = PreparedCall(
        method=method,
        job_id=params.get("job_id"),
        path_params=params,
        body=rest,
        query=_query(rest) if method.body is BodyKind.NONE else [],
        timeout=float(opts.timeout) if opts.timeout is not None else cfg.timeout,
        max_retries=opts.max_retries if opts.max_retries is not None else cfg.retry.max_retries,
        sub_job_id=opts.sub_job_id,
    )
    if method.body is BodyKind.DSSST1:
        prep.frame = chunks.encode_body(method, rest)
    if method.idempotency is Idempotency.CHUNK_GROUP or state.wire.frames_for(method):
        prep.group_id = chunks.new_group_id()
    if method.idempotency is Idempotency.KEYED or (
        method.idempotency is Idempotency.CHUNK_GROUP and method.fallback is Fallback.OPERATION
    ):
        prep.idempotency_key = opts.idempotency_key or secrets.token_hex(16)
    if (
        fallback.sequenced(method)
        and prep.job_id
        and state.config.sequencing is not False
        and state.seq.owns(prep.job_id)
    ):
        prep.slot = state.seq.reserve(prep.job_id, method)
        if state.caps is not None:
            state.seq.resolve(state.seq_count)
    return prep


def call_flow(state: CoreState, prep: PreparedCall) -> Flow[Any]:
    """Run a prepared call to its result; abandoned (Ctrl-C, a cancelled task), it cancels its
    request on the server first (`abandon`)."""
    try:
        return (yield from _call_flow(state, prep))
    except ABANDONED as exc:
        if prep.slot is not None and not prep.request_id and prep.in_flight is None:
            state.seq.release(prep.slot)  # never sent: its number can be reused
        yield from abandon(state, prep, exc, lambda job, rid, t: _cancel(state, job, rid, t))
        raise


def _cancel(state: CoreState, job_id: str, request_id: str, timeout: float) -> Flow[Any]:
    """One `cancel-request` call (its route or its operation), once, within `timeout`."""
    opts = CallOptions(timeout=timeout, max_retries=0, job_id=job_id)
    prep = prepare(state, M.CANCEL_REQUEST, {"request_id": request_id}, opts)
    return (yield from _call_flow(state, prep))


def _call_flow(state: CoreState, prep: PreparedCall) -> Flow[Any]:
    method = prep.method
    deadline = Deadline(state.clock() + prep.timeout, state.clock)
    if state.caps is None and not _needs_caps(method):
        return (yield from _direct(state, prep, None, deadline, None))
    caps = yield from ensure_caps(state)
    seqs: list[int] = []
    if prep.slot is not None:  # number every call submitted so far (no-op when already done)
        if prep.slot.numbers is None:
            state.seq.resolve(state.seq_count)
        seqs = list(prep.slot.numbers or [])
    plan = fallback.plan(method, caps)
    if plan is Fallback.NOOP:
        return fallback.noop_result(method)
    if plan is Fallback.OPERATION:
        # path parameters other than the job travel in the payload (cancel-request's request_id)
        payload = {**prep.body, **{k: v for k, v in prep.path_params.items() if k != "job_id"}}
        value = yield from _operation(
            state, prep, caps, deadline, method.operation_type, seqs[0] if seqs else None, payload
        )
        return fallback.operation_result(value)
    if plan is Fallback.WEIGHT_SYNC_SEQUENCE:
        first = yield from _operation(
            state, prep, caps, deadline, method.operation_type, seqs[0] if seqs else None, prep.body
        )
        yield from _operation(
            state,
            prep,
            caps,
            deadline,
            M.RESET_PREFIX_CACHE.operation_type,
            seqs[1] if len(seqs) > 1 else None,
            {},
            target=M.RESET_PREFIX_CACHE,
        )
        result = fallback.operation_result(first)
        return dict(result) if isinstance(result, Mapping) else {"result": result}
    return (yield from _direct(state, prep, caps, deadline, seqs[0] if seqs else None))


def _needs_caps(method: MethodInfo) -> bool:
    """Control-plane ops and polls go out before (or without) the capabilities document."""
    return method.fallback is not Fallback.NONE or (
        is_data_plane(method) and method is not M.GET_REQUEST
    )


def _direct(
    state: CoreState,
    prep: PreparedCall,
    caps: Capabilities | None,
    deadline: Deadline,
    seq: int | None,
) -> Flow[Any]:
    """The op on its own route."""
    method = prep.method
    send = state.send(deadline, prep.max_retries)
    # Raw DSSST1 answers save base64 on tensor results: ask for them on DSSST1-bodied ops
    # (small JSON answers are cheaper as JSON).
    accept_octet = caps is not None and caps.octet_results and method.body is BodyKind.DSSST1
    for resubmit in range(RESUBMITS + 1):
        try:
            reply = yield from submit(state, prep, caps, send, seq, accept_octet)
        except ArcticError as exc:
            if exc.status is not None and prep.slot is not None:
                state.seq.release(prep.slot)  # refused, so not run: its number can be reused
            raise
        if isinstance(reply, Raw):
            return reply.data
        if not is_data_plane(method) and method is not M.GET_REQUEST:
            return reply.value if isinstance(reply, Value) else reply
        if method is M.GET_REQUEST:  # an explicit poll answers the status (its result decoded)
            return poll_status(reply, state.config.tensors)
        try:
            return (yield from _result(state, prep, reply, method, send, deadline, accept_octet))
        except ArcticError as exc:
            # the request provably never ran (the server restarted before its worker got it):
            # the same identity (Idempotency-Key / chunk group) runs it now, once
            if exc.code != ErrorCode.NOT_EXECUTED or resubmit == RESUBMITS:
                raise
            log.info(
                "resubmitting %s under the same identity: %s (resubmission %d of %d)",
                method.name,
                exc,
                resubmit + 1,
                RESUBMITS,
                extra={"arctic_op": method.name, "arctic_resubmit": resubmit + 1},
            )
    raise AssertionError("unreachable")


def _result(
    state: CoreState,
    prep: PreparedCall,
    reply: Reply,
    method: MethodInfo,
    send: Callable[[Exchange], Flow[Reply]],
    deadline: Deadline,
    accept_octet: bool,
) -> Flow[Any]:
    """From a data-plane call's first answer to its result (`poll.await_result`, with this
    state's poll config, clock, tensor type and redaction)."""
    return (
        yield from await_result(
            reply,
            method=method,
            job_id=prep.job_id or "",
            send_poll=send,
            cfg=state.config.poll,
            clock=state.clock,
            deadline_at=deadline.at,
            tensors=state.config.tensors,
            accept_octet=accept_octet,
            redact=state.redact,
            seen=prep.seen,
        )
    )


def _operation(
    state: CoreState,
    prep: PreparedCall,
    caps: Capabilities,
    deadline: Deadline,
    operation_type: str,
    seq: int | None,
    body: Mapping[str, Any],
    target: MethodInfo | None = None,
) -> Flow[Any]:
    """One `/operation` call carrying `prep`'s op (or `target`'s, whose role it runs on)."""
    method = M.OPERATION
    op = target or prep.method
    frame = prep.frame if target is None else None
    translated = fallback.operation_payload(op, body)
    if translated is not None:
        body = translated
        frame = chunks.encode_body(op, translated) if frame is not None else None
    envelope = fallback.operation_body(operation_type, op, body, frame, prep.sub_job_id)
    base_key = prep.idempotency_key or prep.group_id or uuid.uuid4().hex
    sub = PreparedCall(
        method=method,
        job_id=prep.job_id,
        path_params={"job_id": prep.job_id or ""},
        body=envelope,
        query=[],
        timeout=prep.timeout,
        max_retries=prep.max_retries,
        idempotency_key=f"{base_key}:{operation_type}"[:255],
        group_id=chunks.new_group_id(),
    )
    send = state.send(deadline, prep.max_retries)
    accept_octet = caps.octet_results and prep.method.body is BodyKind.DSSST1
    if state.wire.frames_for(method):
        reply = yield from send_group(state, sub, caps, send, seq, accept_octet)
    else:
        ex = Exchange(
            method=method,
            job_id=sub.job_id,
            path_params=sub.path_params,
            json_body=envelope,
            idempotency_key=sub.idempotency_key,
            seq=seq,
            accept_octet=accept_octet,
        )
        reply = yield from send(ex)
    return (yield from _result(state, prep, reply, method, send, deadline, accept_octet))
