"""The client's protocol state (configuration, wire, capabilities, job, sequence numbers) and a
prepared call: what `calls.prepare` builds and the flows in `calls` and `submit` read."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import dssst1

from ..config import ArcticConfig
from ..errors import NotFoundError, UnimplementedError
from ..spec.model import MethodInfo
from ..spec.tables import methods as M
from . import fallback
from .capabilities import Capabilities
from .effects import Flow
from .replies import Exchange, Reply, Value, Wire
from .retry import Contact, Deadline, RetryPolicy, exchange
from .sequence import SeqAllocator, SeqSlot

log = logging.getLogger("arctic_sdk")
CAPS_TIMEOUT_S = 60.0


def make_redactor(secret: str | None) -> Callable[[str], str]:
    if not secret or len(secret) < 4:
        return lambda text: text
    return lambda text: text.replace(secret, "***") if secret in text else text


class CoreState:
    """Per-client protocol state: configuration, wire, capabilities, job, sequence numbers."""

    def __init__(
        self,
        config: ArcticConfig,
        wire: Wire,
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: Callable[[], float] = random.random,
        seq_start: dict[str, int] | None = None,
    ) -> None:
        self.config = config
        self.wire = wire
        self.clock = clock
        self.caps: Capabilities | None = None
        self.seq = SeqAllocator(seq_start, every_job=config.sequencing is True)
        self.job_id: str | None = config.job_id
        self.redact = make_redactor(config.token())
        self.policy = RetryPolicy(config.retry, rng)
        self.contact = Contact(server_address(config))
        self.lock = threading.Lock()

    def set_caps(self, caps: Capabilities) -> None:
        self.caps = caps
        self.seq.resolve(self.seq_count)

    def seq_count(self, method: MethodInfo) -> int:
        """Sequence numbers one call of `method` takes (capabilities known)."""
        assert self.caps is not None
        return fallback.seq_count(method, self.caps)

    def send(self, deadline: Deadline, max_retries: int) -> Callable[[Exchange], Flow[Reply]]:
        """An exchange-with-retries bound to this state (for sub-flows)."""

        def run(ex: Exchange) -> Flow[Reply]:
            return (
                yield from exchange(
                    ex,
                    wire=self.wire,
                    caps=self.caps,
                    policy=self.policy,
                    deadline=deadline,
                    request_timeout=self.config.request_timeout,
                    max_retries=max_retries,
                    contact=self.contact,
                    poll=self.config.poll,
                )
            )

        return run


def server_address(config: ArcticConfig) -> str:
    """Where the client's server is, as an error message names it."""
    base = config.cortex.base() or "(no base_url)"
    if config.transport == "grpc":
        return config.grpc.target or f"{base} (gRPC port from its capabilities)"
    return "the in-process server" if config.transport == "inproc" else base


@dataclass
class PreparedCall:
    method: MethodInfo
    job_id: str | None
    path_params: dict[str, str]
    body: dict[str, Any]  # without path parameters
    query: list[tuple[str, str]]
    timeout: float
    max_retries: int
    sub_job_id: str | None = None
    frame: dssst1.EncodedFrame | None = None  # DSSST1 body
    group_id: str | None = None
    idempotency_key: str | None = None
    slot: SeqSlot | None = None
    # What an abandoned call must cancel (`_core.abandon`): the server's id of its request once
    # an answer named it, and the exchange that runs it while that one is on the wire.
    request_id: str = ""
    in_flight: Exchange | None = None
    submitted_at: float = field(default_factory=time.monotonic)

    def seen(self, request_id: str) -> None:
        """An answer named the call's request: that is what an abandoned call cancels."""
        self.request_id = request_id
        self.in_flight = None


def ensure_caps(state: CoreState) -> Flow[Capabilities]:
    """The server's capabilities, fetched once per client (§5 defaults when it has none)."""
    if state.caps is not None:
        return state.caps
    deadline = Deadline(state.clock() + min(CAPS_TIMEOUT_S, state.config.timeout), state.clock)
    ex = Exchange(method=M.GET_CAPABILITIES, message={})
    try:
        reply = yield from state.send(deadline, state.config.retry.max_retries)(ex)
        doc = reply.value if isinstance(reply, Value) else None
        caps = Capabilities.from_json(doc) if isinstance(doc, Mapping) else Capabilities.deployed()
    except (NotFoundError, UnimplementedError):
        caps = Capabilities.deployed()
    log.debug("capabilities: %s", caps.raw or "defaults (server has no capabilities route)")
    state.set_caps(caps)
    return caps
