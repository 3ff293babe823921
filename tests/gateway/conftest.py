from __future__ import annotations

from collections.abc import Iterator

import pytest

from .harness import Client, Gateway


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """One gateway (fake workers, 4 GPUs, admin API) shared by a test module."""
    g = Gateway(
        tmp_path_factory.mktemp("gw"),
        args=("--gpus", "4", "--max-inflight-per-token", "6", "--fake-latency", "generate=0.6"),
    )
    g.start()
    try:
        yield g
    finally:
        g.cleanup()


@pytest.fixture
def client(gw: Gateway) -> Client:
    return Client(gw.prefix_url)
