"""Sending a prepared call's request: its JSON body in one exchange, or its DSSST1 body as a
chunk group (progress shown from 32 MiB, replayed once from chunk 0 on `restart_required`)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..errors import ChunkGroupRestartRequiredError, ServerError
from . import chunks
from .capabilities import Capabilities
from .effects import Flow, Progress
from .replies import ChunkCached, Exchange, Reply
from .state import CoreState, PreparedCall, ensure_caps

log = logging.getLogger("arctic_sdk")
PROGRESS_BYTES = 32 * 1024 * 1024  # show upload bars from this body size


def submit(
    state: CoreState,
    prep: PreparedCall,
    caps: Capabilities | None,
    send: Callable[[Exchange], Flow[Reply]],
    seq: int | None,
    accept_octet: bool,
) -> Flow[Reply]:
    """Send the call itself (its JSON body, or its chunk group); the first answer."""
    method = prep.method
    if state.wire.frames_for(method):
        if caps is None:
            caps = yield from ensure_caps(state)
        return (yield from send_group(state, prep, caps, send, seq, accept_octet))
    message = {**prep.body, **prep.path_params}
    ex = Exchange(
        method=method,
        job_id=prep.job_id,
        path_params=prep.path_params,
        query=prep.query,
        json_body=prep.body,
        message=message,
        idempotency_key=prep.idempotency_key,
        seq=seq,
        sub_job_id=prep.sub_job_id,
        accept_octet=accept_octet,
    )
    prep.in_flight = ex  # abandoned now, the call replays it to learn what to cancel
    reply = yield from send(ex)
    prep.in_flight = None
    return reply


def send_group(
    state: CoreState,
    prep: PreparedCall,
    caps: Capabilities,
    send: Callable[[Exchange], Flow[Reply]],
    seq: int | None,
    accept_octet: bool,
) -> Flow[Reply]:
    """Send the call's chunk group; replay it once from chunk 0 on restart_required."""
    method = prep.method
    frame = prep.frame
    if frame is None:  # a JSON-bodied op on a frames-only wire (gRPC)
        body = {k: v for k, v in {**prep.body, **prep.path_params}.items() if k != "job_id"}
        frame = chunks.encode_body(method, body)
    assert prep.group_id is not None
    parts = chunks.split(
        frame,
        method=method,
        group_id=prep.group_id,
        max_bytes=state.wire.max_chunk_bytes(caps),
        caps=caps,
    )
    batches = state.wire.batches(parts)
    show = frame.nbytes >= PROGRESS_BYTES
    key = f"upload:{prep.group_id}"
    for replay in (False, True):
        if show:
            yield Progress(key, "start", desc=f"{method.name} upload", total=frame.nbytes)
        try:
            for i, batch in enumerate(batches):
                last = i == len(batches) - 1
                ex = Exchange(
                    method=method,
                    job_id=prep.job_id,
                    path_params=prep.path_params,
                    frames=batch,
                    idempotency_key=prep.idempotency_key,
                    seq=seq,
                    sub_job_id=prep.sub_job_id,
                    accept_octet=accept_octet,
                    executes=last,
                )
                if last:
                    prep.in_flight = ex
                reply = yield from send(ex)
                prep.in_flight = None
                if show:
                    yield Progress(key, "update", n=sum(len(p) for c in batch for p in c))
                if isinstance(reply, ChunkCached):
                    if last:
                        raise ServerError(
                            f"{method.name}: the last chunk of group {prep.group_id} was "
                            "answered chunk_cached",
                            code="internal",
                            op=method.name,
                        )
                    continue
                if show:
                    yield Progress(key, "close")
                return reply  # the completing chunk (or a replay of a completed group)
        except ChunkGroupRestartRequiredError:
            if replay:
                raise
            log.warning(
                "%s: server lost chunk group %s; replaying it from chunk 0",
                method.name,
                prep.group_id,
            )
            if show:
                yield Progress(key, "close")
    raise AssertionError("unreachable")  # pragma: no cover
