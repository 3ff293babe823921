"""Fixtures of the conformance suite's own tests: one fake gateway per module, the loaded cases.

The fake runs in a thread (`BackgroundFake`) with admin on, two PATs, and small limits so that
every case applies quickly: result_chunk events from 64 KiB, a 1 s sequence gap timeout, 4096
tensors per frame, a 2 s body read timeout, 2 MiB of incomplete chunk groups per job.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import requests

from arctic_servers.protocol.config import ProtocolLimits
from conformance.fake import BackgroundFake
from conformance.runner import Case, Report, RunConfig, load_cases, run_suite, select

TOKEN = "conformance-pat"
ALT_TOKEN = "conformance-pat-2"
LIMITS = ProtocolLimits(
    max_inline_result_bytes=64 * 1024,
    result_chunk_bytes=16 * 1024,
    sequence_gap_timeout_seconds=1,
    max_tensors=4096,
    body_read_timeout_seconds=2,
    max_open_chunk_bytes_per_job=2 * 1024 * 1024,
)


def start_fake() -> BackgroundFake:
    fake = BackgroundFake(
        tokens=(TOKEN, ALT_TOKEN), admin=True, inline_wait_seconds=0.2, limits=LIMITS
    )
    fake.start()
    return fake


@pytest.fixture(scope="module")
def fake() -> Iterator[BackgroundFake]:
    f = start_fake()
    yield f
    f.stop()


@pytest.fixture(scope="session")
def cases() -> list[Case]:
    return load_cases()


def config(fake: BackgroundFake, transport: str, **kw: Any) -> RunConfig:
    return RunConfig(
        target=fake.prefix_url, transport=transport, token=TOKEN, alt_token=ALT_TOKEN, **kw
    )


def run(
    fake: BackgroundFake, transport: str, cases: Sequence[Case], only: Sequence[str] = (), **kw: Any
) -> Report:
    return run_suite(config(fake, transport), select(cases, only, []), **kw)


def set_behaviour(fake: BackgroundFake, values: dict[str, Any]) -> None:
    r = requests.post(
        fake.admin_url + "/behaviour",
        json=values,
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=10,
    )
    r.raise_for_status()


@pytest.fixture(scope="module")
def proxy(fake: BackgroundFake) -> Iterator[tuple[Any, str]]:
    """A mutating proxy (`mutating_proxy.Proxy`, no fault yet) in front of the module's fake, and
    the protocol prefix URL through it."""
    from .mutating_proxy import Proxy

    p = Proxy(fake.base_url)
    p.start()
    try:
        yield p, p.url + fake.prefix_url[len(fake.base_url) :]
    finally:
        p.stop()
