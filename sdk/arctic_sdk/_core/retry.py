"""Retries in one place: which failures are retried, how long to wait, and when to stop.

A failure is retried when the spec marks its code retryable (429, 503, 504, `job_not_running`,
...), or, without a code, for 429/502/503/504 answers and connection failures. Whether the retry
is *safe* depends on the op's idempotency class and the server's capabilities (PROTOCOL.md §7.1):

- `SAFE` ops, intermediate chunks of a chunk group, and requests that certainly never reached
  the server are always safe to resend;
- mutating calls are safe against a server that advertises `idempotency` (the key or chunk-group
  identity makes the retry return the original answer);
- otherwise a mutating call whose body may have been delivered raises `OutcomeUnknownError`
  (answers that say the request was refused before running, 429/503/`job_not_running`, are still
  retried).

Backoff is exponential with jitter and a cap; `Retry-After` wins when the server sends it; every
wait ends before the call's deadline, and every retry is logged at WARNING (what is retried, after
what, for how long, how much of the deadline is left).

Two failures are not retried like the others:

- **First contact.** While a client has never had an answer from its server, a connection that
  certainly never reached it (refused, unknown host) is tried `first_contact_retries` more times
  only, then raises `ArcticConnectionError` naming the address: a wrong URL fails in seconds.
  Once any answer has arrived, connection failures get the whole retry budget (a restarting
  server is waited for). An address that speaks another protocol (TLS against plain HTTP,
  HTTP/1.1 against a gRPC port, an untrusted certificate: `ConnectionFailure.mismatch`) is not
  retried at all before first contact: it raises `ArcticConnectionError` naming the mistake.
- **A job that is not running yet** (`job_not_running`): the call waits for the job to start, its
  state shown as it goes (`jobs.wait_running`), within the call's deadline, then is resent; a job
  that ends instead raises `job_terminal`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from ..config import PollConfig, RetryConfig
from ..errors import ArcticConnectionError, ArcticError, ArcticTimeoutError, OutcomeUnknownError
from ..spec.tables import methods as M
from ..spec.tables.error_codes import ERRORS, ErrorCode
from .capabilities import Capabilities
from .effects import Flow, Send, Sleep
from .jobs import wait_running
from .replies import Exchange, Lost, Refused, Reply, Wire

log = logging.getLogger("arctic_sdk")

Verdict = Literal["retry", "raise", "unknown"]

# Answers that say the request was refused before it ran, even by a server without idempotency.
_REFUSED_BEFORE_RUNNING = {
    ErrorCode.RATE_LIMITED,
    ErrorCode.UNAVAILABLE,
    ErrorCode.JOB_NOT_RUNNING,
    ErrorCode.CHUNK_CHECKSUM_MISMATCH,
}
_TRANSIENT_STATUSES = {429, 502, 503, 504}


@dataclass
class Deadline:
    """A point in time on the state's clock."""

    at: float
    clock: Callable[[], float]

    def remaining(self) -> float:
        return self.at - self.clock()


@dataclass
class Contact:
    """Whether this client has had any answer from its server yet, and where the server is."""

    where: str
    reached: bool = False


class RetryPolicy:
    def __init__(self, cfg: RetryConfig, rng: Callable[[], float]) -> None:
        self.cfg = cfg
        self._rng = rng

    def backoff(self, retry: int) -> float:
        """The wait before retry number `retry` (1-based): exponential, capped, jittered."""
        c = self.cfg
        base = min(c.max_backoff, c.initial_backoff * c.multiplier ** (retry - 1))
        return max(0.0, base * (1 - c.jitter + 2 * c.jitter * self._rng()))


def retryable(err: ArcticError) -> bool:
    info = ERRORS.get(err.code)
    if info is not None:
        return info.retryable and err.code != ErrorCode.CHUNK_GROUP_RESTART_REQUIRED
    return err.status in _TRANSIENT_STATUSES


def verdict(reply: Refused | Lost, ex: Exchange, caps: Capabilities | None) -> Verdict:
    """Retry, raise, or raise `OutcomeUnknownError` (PROTOCOL.md §7.1)."""
    safe = not ex.method.mutating or not ex.executes
    protected = caps is not None and caps.idempotency
    if isinstance(reply, Lost):
        if reply.failure.delivered is False or safe or protected:
            return "retry"
        return "unknown"
    err = reply.error
    if not retryable(err):
        return "raise"
    if safe or protected or err.code in _REFUSED_BEFORE_RUNNING or err.status in (429, 503):
        return "retry"
    return "unknown"


def _failure_error(reply: Refused | Lost, ex: Exchange, attempts: int) -> ArcticError:
    if isinstance(reply, Refused):
        return reply.error
    f = reply.failure
    suffix = f" (after {attempts} attempt{'s' if attempts > 1 else ''})"
    cls = ArcticTimeoutError if f.timeout else ArcticConnectionError
    return cls(f"{ex.method.name}: {f.reason}{suffix}", op=ex.method.name)


def _unknown(reply: Refused | Lost, ex: Exchange) -> OutcomeUnknownError:
    why = reply.failure.reason if isinstance(reply, Lost) else str(reply.error)
    ident = {"idempotency_key": ex.idempotency_key} if ex.idempotency_key else {}
    return OutcomeUnknownError(
        f"{ex.method.name} may or may not have executed ({why}); the server does not advertise "
        "idempotency, so the SDK did not resend it. Check the job's state before retrying.",
        op=ex.method.name,
        details=ident,
    )


def _unreachable(reply: Lost, ex: Exchange, contact: Contact, attempts: int, t0: float) -> Any:
    reason = reply.failure.reason
    errno = re.search(r"\[Errno -?\d+\] [^\"')(]+", reason)  # the OS's words, not a traceback
    return ArcticConnectionError(
        f"{ex.method.name}: cannot reach the server at {contact.where} "
        f"({errno.group(0).strip() if errno else reason}); "
        f"{attempts} attempt{'s' if attempts > 1 else ''} in {t0:.1f} s and it never answered: "
        "is the server running, and is the address right?",
        op=ex.method.name,
        details={"address": contact.where, "attempts": attempts, "reason": reply.failure.reason},
    )


def _mismatch(reply: Lost, ex: Exchange, contact: Contact) -> ArcticConnectionError:
    f = reply.failure
    return ArcticConnectionError(
        f"{ex.method.name}: the server at {contact.where} speaks another protocol: {f.mismatch}",
        op=ex.method.name,
        details={"address": contact.where, "mistake": f.mismatch, "reason": f.reason},
    )


def exchange(
    ex: Exchange,
    *,
    wire: Wire,
    caps: Capabilities | None,
    policy: RetryPolicy,
    deadline: Deadline,
    request_timeout: float,
    max_retries: int,
    contact: Contact | None = None,
    poll: PollConfig | None = None,
) -> Flow[Reply]:
    """Send `ex`, retrying as the policy allows; returns the first non-error reply.

    `contact` (the client's): connection failures before the server ever answered get only
    `first_contact_retries`; `poll`: how to wait for a job that is not running yet (without it,
    `job_not_running` is retried like any retryable code)."""
    attempts, waited = 0, False
    started = deadline.clock()
    while True:
        remaining = deadline.remaining()
        if remaining <= 0:
            raise ArcticTimeoutError(
                f"{ex.method.name}: the call's deadline passed", op=ex.method.name
            )
        attempts += 1
        reply = wire.parse(ex, (yield Send(wire.build(ex, min(request_timeout, remaining)))))
        if contact is not None and not isinstance(reply, Lost):
            contact.reached = True
        if not isinstance(reply, Refused | Lost):
            return reply
        if (
            poll is not None
            and not waited
            and isinstance(reply, Refused)
            and reply.error.code == ErrorCode.JOB_NOT_RUNNING
            and ex.job_id
            and ex.method is not M.GET_JOB
        ):
            yield from _await_job(
                ex, reply.error, wire, caps, policy, deadline, request_timeout, poll, contact
            )
            attempts, waited = 0, True  # it runs now: the call's retry budget starts again
            continue
        v = verdict(reply, ex, caps)
        if v == "unknown":
            raise _unknown(reply, ex)
        first = contact is not None and not contact.reached
        if first and isinstance(reply, Lost) and reply.failure.mismatch:
            assert contact is not None
            raise _mismatch(reply, ex, contact)
        err = _failure_error(reply, ex, attempts)
        if (
            first
            and isinstance(reply, Lost)
            and reply.failure.delivered is False
            and attempts > min(max_retries, policy.cfg.first_contact_retries)
        ):
            assert contact is not None
            raise _unreachable(reply, ex, contact, attempts, deadline.clock() - started)
        if v == "raise" or attempts > max_retries:
            raise err
        wait = err.retry_after if err.retry_after is not None else policy.backoff(attempts)
        if wait >= deadline.remaining():
            if isinstance(err, ArcticTimeoutError) or err.retry_after is None:
                raise ArcticTimeoutError(
                    f"{ex.method.name}: the call's deadline passed while retrying",
                    op=ex.method.name,
                    details={"last_error": str(err)},
                )
            raise err
        log.warning(
            "retrying %s in %.2f s after %s (attempt %d of %d, %.0f s of the call's deadline left)",
            ex.method.name,
            wait,
            _why(err),
            attempts + 1,
            max_retries + 1,
            deadline.remaining(),
            extra={"arctic_op": ex.method.name, "arctic_attempt": attempts, "arctic_wait": wait},
        )
        yield Sleep(wait)


def _why(err: ArcticError) -> str:
    text = err.message if len(err.message) <= 160 else err.message[:157] + "..."
    return f"{err.code}: {text}" if err.code else f"{type(err).__name__}: {text}"


def _await_job(
    ex: Exchange,
    err: ArcticError,
    wire: Wire,
    caps: Capabilities | None,
    policy: RetryPolicy,
    deadline: Deadline,
    request_timeout: float,
    poll: PollConfig,
    contact: Contact | None,
) -> Flow[None]:
    """Wait (within the call's deadline) for the job `ex` is for to run, its state shown."""
    job_id = str(ex.job_id)
    state = err.details.get("state") or "not running"
    log.warning(
        "%s: job %s is %s; waiting for it to run (up to %.0f s, the call's deadline)",
        ex.method.name,
        job_id,
        state,
        deadline.remaining(),
        extra={"arctic_op": ex.method.name, "arctic_job_id": job_id, "arctic_job_state": state},
    )

    def send(e: Exchange) -> Flow[Reply]:
        return (
            yield from exchange(
                e,
                wire=wire,
                caps=caps,
                policy=policy,
                deadline=deadline,
                request_timeout=request_timeout,
                max_retries=policy.cfg.max_retries,
                contact=contact,
            )
        )

    yield from wait_running(
        job_id, send=send, cfg=poll, clock=deadline.clock, timeout=max(deadline.remaining(), 0)
    )
