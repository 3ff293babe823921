"""A call as a transport hands it to the protocol core, and the `Outcome` the core answers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from arctic_sdk.spec.model import MethodInfo

from .stores import RequestRecord


@dataclass
class IncomingCall:
    """A call as it arrived, on any transport."""

    method: MethodInfo
    transport: str = "http"
    headers: Mapping[str, str] = field(default_factory=dict)  # lower-case names
    path_params: Mapping[str, str] = field(default_factory=dict)
    query: Mapping[str, list[str]] = field(default_factory=dict)
    body: bytes | memoryview | None = None  # JSON text or one DSSST1 frame
    value: Any = None  # an already-decoded body (gRPC unary messages)
    accept_octet: bool = False


@dataclass
class Outcome:
    """What the core answers; transports render it."""

    http_status: int
    method: MethodInfo
    record: RequestRecord | None = None  # a RequestStatus answer (200) or SubmitResponse (202)
    value: Any = None  # a direct answer (control plane, chunk_cached, capabilities)
    raw: bytes | None = None  # a raw download
    cursor: int = 0
    max_events: int = 16
