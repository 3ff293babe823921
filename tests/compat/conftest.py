"""Servers for the compatibility tests: the fake gateway (always) and the on-prem server (slow).

`server` is parametrized: `fake` runs everywhere in a second; `onprem` launches the real on-prem
server (DeepSpeed trainer + vLLM sampler worker processes on the embedded tiny model) once per
session, with `arctic_sdk.compat.launch_onprem`; it runs only with `ARCTIC_ONPREM_TESTS=1` and the
engines installed (its jobs take minutes of engine start-up on a small CPU box).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil
import socket
import sys
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from conformance.fake import BackgroundFake

TOKEN = "compat-tok-9c1e"


@dataclass
class Server:
    kind: str
    base_url: str
    fake: BackgroundFake | None = None
    root: str = ""

    def ckpt_dir(self) -> str:
        """A fresh directory, what an integration passes as `checkpoint_path` (a job started
        with it resumes from what was saved there: one directory per job keeps tests apart)."""
        return tempfile.mkdtemp(prefix="ckpt-", dir=self.root or None)

    @property
    def host_port(self) -> tuple[str, int]:
        u = urlparse(self.base_url)
        assert u.hostname and u.port
        return u.hostname, u.port

    def config(self, **over: Any) -> dict[str, Any]:
        """A legacy config pointing at this server (host/port, as the integrations set it)."""
        host, port = self.host_port
        cfg: dict[str, Any] = {
            "backend": "local",
            "comm_protocol": "http",
            "host": host,
            "port": port,
            "pat": TOKEN,
            "launch_local_server": False,
            "model_name": "tiny",
            "training_gpus": 1,
            "sampling_gpus": 1,
            "log_prob_gpus": 0,
            "job_ready_timeout": 300.0,
        }
        cfg.update(over)
        return cfg

    def execution_log(self, job_id: str) -> list[dict[str, Any]]:
        assert self.fake is not None
        state = self.fake.call(self.fake.servicer.job_state, job_id)
        return list(state["execution_log"])


@pytest.fixture(scope="session")
def fake_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    ckpt = str(tmp_path_factory.mktemp("fake-ckpt"))
    with BackgroundFake(token=TOKEN, admin=False, grpc=False, max_total_gpus=1_000_000) as f:
        yield Server("fake", f.base_url, f, ckpt)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def onprem_available() -> bool:
    """On-prem runs need the engines and `ARCTIC_ONPREM_TESTS=1` (minutes of engine start-up)."""
    if not os.environ.get("ARCTIC_ONPREM_TESTS"):
        return False
    return all(importlib.util.find_spec(m) for m in ("vllm", "deepspeed", "torch"))


SKIP_ONPREM = (
    "on-prem compatibility runs start DeepSpeed and vLLM workers (minutes): set "
    "ARCTIC_ONPREM_TESTS=1 with the engines installed"
)


@pytest.fixture(scope="session")
def alias() -> Iterator[None]:
    """The opt-in import alias (compat-alias/): `arctic_platform.rl` / `.client` importable."""
    src = str(Path(__file__).resolve().parents[2] / "compat-alias" / "src")
    sys.path.insert(0, src)
    try:
        import arctic_platform

        assert arctic_platform.ARCTIC_SDK_ALIAS
        yield
    finally:
        sys.path.remove(src)
        for name in [
            m for m in sys.modules if m == "arctic_platform" or m.startswith("arctic_platform.")
        ]:
            del sys.modules[name]


@pytest.fixture(scope="session")
def onprem_server() -> Iterator[Server]:
    """The on-prem server, launched the way a legacy `backend="local"` client launches it."""
    if not onprem_available():
        pytest.skip(SKIP_ONPREM)
    from arctic_sdk.compat import launch_onprem

    srv = launch_onprem(
        "127.0.0.1", free_port(), tokens=(TOKEN,), timeout=120, extra_args=("--admin",)
    )
    root = tempfile.mkdtemp(prefix="arctic-compat-")
    try:
        yield Server("onprem", srv.base_url, root=root)
    finally:
        srv.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session", params=["fake", pytest.param("onprem", marks=pytest.mark.slow)])
def server(request: pytest.FixtureRequest) -> Server:
    name = "fake_server" if request.param == "fake" else "onprem_server"
    return request.getfixturevalue(name)  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def onprem_stock_job(onprem_server: Server, alias: None) -> Iterator[Any]:
    """On-prem engine start-ups cost minutes: one W = 1 job from verl PR #6422's stock
    arctic.yaml (training, sampling, a DeepSpeed log-prob sub-job) serves the on-prem replays of
    both frameworks; SkyRL re-attaches to it the way its entrypoint does (`ArcticRLExp`), the
    plugin the way verl's forwarder does. Each framework's config creating its own job is
    replayed against the fake, and SkyRL's stock config creates the W = 2 job."""
    from arctic_sdk.compat import create_arctic_rl_client

    from . import verl_replay as V

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=DeprecationWarning)  # named in test_verl
        client = create_arctic_rl_client(V.pr_client_config(onprem_server, V.arctic_yaml()))
    try:
        yield client
    finally:
        asyncio.run(client.shutdown())
