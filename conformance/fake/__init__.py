"""The fake Cortex gateway: the reference arctic.v1 server with deterministic numerics.

It serves the whole protocol over HTTP and gRPC through `arctic_servers.protocol`, with jobs that
pass through every state, over the fake engine (`arctic_servers.engines.fake`: deterministic
numerics, NUMERICS.md, a byte-level tokenizer, checkpoints), and an admin API for fault
injection and state inspection (conformance/README.md, "Fake gateway").
"""

from __future__ import annotations

from .faults import FaultRegistry
from .jobs import JobDelays, JobManager
from .server import DEFAULT_PATH, BackgroundFake, RunningFake, start_fake
from .servicer import FakeServicer

__all__ = [
    "DEFAULT_PATH",
    "BackgroundFake",
    "FakeServicer",
    "FaultRegistry",
    "JobDelays",
    "JobManager",
    "RunningFake",
    "start_fake",
]
