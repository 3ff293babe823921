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
wait ends before the call's deadline.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from .._generated.error_codes import ERRORS, ErrorCode
from ..config import RetryConfig
from ..errors import ArcticConnectionError, ArcticError, ArcticTimeoutError, OutcomeUnknownError
from .capabilities import Capabilities
from .effects import Flow, Send, Sleep
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

    def passed(self) -> bool:
        return self.remaining() <= 0


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


def exchange(
    ex: Exchange,
    *,
    wire: Wire,
    caps: Capabilities | None,
    policy: RetryPolicy,
    deadline: Deadline,
    request_timeout: float,
    max_retries: int,
) -> Flow[Reply]:
    """Send `ex`, retrying as the policy allows; returns the first non-error reply."""
    attempts = 0
    while True:
        remaining = deadline.remaining()
        if remaining <= 0:
            raise ArcticTimeoutError(
                f"{ex.method.name}: the call's deadline passed", op=ex.method.name
            )
        attempts += 1
        reply = wire.parse(ex, (yield Send(wire.build(ex, min(request_timeout, remaining)))))
        if not isinstance(reply, Refused | Lost):
            return reply
        v = verdict(reply, ex, caps)
        if v == "unknown":
            raise _unknown(reply, ex)
        err = _failure_error(reply, ex, attempts)
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
        log.info(
            "retrying %s in %.2fs after %s (attempt %d of %d)",
            ex.method.name,
            wait,
            err.code or type(err).__name__,
            attempts,
            max_retries + 1,
            extra={"arctic_op": ex.method.name, "arctic_attempt": attempts, "arctic_wait": wait},
        )
        yield Sleep(wait)
