"""An abandoned call cancels its request on the server (PROTOCOL.md §3.3, "Abandoned calls").

A caller abandons a call with Ctrl-C (`KeyboardInterrupt`, sync client) or by cancelling its
task (`asyncio.CancelledError`, async client). The driver throws that exception into the call's
flow; before it goes on to the caller, the flow cancels what it leaves behind, best effort and
within `CANCEL_BOUND_S` for everything:

- a request the server has named (a 202, a poll): `cancel-request` (its route, or the
  `cancel-request` operation on a server without it);
- a request whose submission was still on the wire (the server holds an answer for up to its
  inline wait, the request id unknown): the same submission again, under the same identity
  (chunk group / Idempotency-Key, so it never runs twice) with `Prefer: respond-async`, which
  answers at once with the id; then `cancel-request`. Only against a server that advertises
  `idempotency` (elsewhere a replay could run the request a second time). On gRPC the mover
  also cancels the RPC itself, which a server of this repository takes as the cancel.

The exception the caller gets is the one it caused, with a note naming the request id and what
became of the cancel, and a `request_id` attribute.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any

from ..spec.tables import methods as M
from .effects import Flow
from .poll import IN_FLIGHT, request_state
from .replies import Status, Submitted
from .requests import is_data_plane
from .retry import Deadline
from .state import CoreState, PreparedCall

log = logging.getLogger("arctic_sdk")

ABANDONED = (KeyboardInterrupt, asyncio.CancelledError)
"""What a caller abandons a call with: Ctrl-C, or a cancelled task."""
CANCEL_BOUND_S = 2.0
"""How long an abandoned call spends cancelling its request, all exchanges together."""

CancelFlow = Callable[[str, str, float], Flow[Any]]
"""`(job_id, request_id, timeout)` -> the flow of one `cancel-request` call."""


def abandon(
    state: CoreState, prep: PreparedCall, exc: BaseException, cancel: CancelFlow
) -> Flow[None]:
    """Cancel what `prep`'s abandoned call leaves running; note it on `exc`."""
    method = prep.method
    if not is_data_plane(method) or method is M.GET_REQUEST or not prep.job_id:
        return
    deadline = Deadline(state.clock() + CANCEL_BOUND_S, state.clock)
    rid, outcome = prep.request_id, ""
    try:
        if not rid and prep.in_flight is not None:
            if state.caps is None or not state.caps.idempotency:
                outcome = (
                    "was on the wire when abandoned; this server cannot name it (no idempotency),"
                    " so it may still run"
                )
            else:
                rid, status = yield from _learn_id(state, prep, deadline)
                if rid and status == "cancelled":  # the gRPC call's own cancellation did it
                    outcome = "was cancelled on the server"
                elif rid and status not in IN_FLIGHT:
                    outcome = f"had already ended ({status}); nothing to cancel"
        if rid and not outcome:
            remaining = deadline.remaining()
            if remaining <= 0:
                raise TimeoutError(f"no time left of the {CANCEL_BOUND_S:g} s cancel bound")
            answer = yield from cancel(prep.job_id, rid, remaining)
            outcome = _cancel_outcome(answer)
    except ABANDONED:
        raise  # abandoned again while cancelling: leave at once
    except Exception as err:  # best effort: the caller's own exception goes on regardless
        outcome = (
            f"could not be cancelled within {CANCEL_BOUND_S:g} s ({type(err).__name__}: {err}); "
            "it may keep running: cancel it with client.cancel_request"
            f"(request_id={rid!r}, job_id={prep.job_id!r})"
            if rid
            else f"may still run: the server could not be asked for its id ({err})"
        )
    if not rid and not outcome:
        return  # nothing reached the server
    what = f"request {rid}" if rid else "its request"
    note = f"arctic_sdk: {method.name} abandoned; {what} (job {prep.job_id}) {outcome}"
    log.warning(
        "%s",
        note,
        extra={"arctic_op": method.name, "arctic_request_id": rid, "arctic_job_id": prep.job_id},
    )
    exc.add_note(note)
    if rid:
        exc.request_id = rid  # type: ignore[attr-defined]


def _learn_id(state: CoreState, prep: PreparedCall, deadline: Deadline) -> Flow[tuple[str, str]]:
    """Replay the submission on the wire with `Prefer: respond-async`: its request id, state."""
    assert prep.in_flight is not None
    replay = dataclasses.replace(prep.in_flight, respond_async=True)
    reply = yield from state.send(deadline, 0)(replay)
    if isinstance(reply, Submitted):
        return reply.request_id, "pending"
    if isinstance(reply, Status):
        status = reply.status
        return str(status.get("request_id") or ""), request_state(status.get("status"))
    return "", ""


def _cancel_outcome(answer: Any) -> str:
    if not isinstance(answer, Mapping):
        return "was cancelled (cancel-request sent)"
    state = request_state(answer.get("status"))
    if answer.get("cancelled") or state == "cancelled":
        return "was cancelled on the server"
    if state in IN_FLIGHT:
        return (
            f"is still {state} on the server (a training call runs to its end there, a sample "
            "stops at its engine's next step; client.get_request says how it ended)"
        )
    return f"had already ended ({state or 'unknown'}) when the cancel arrived"
