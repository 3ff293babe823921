"""The real `tinker` SDK (0.38.0, unmodified) against the Tinker routes in front of the fake
gateway (fast: the fake's numerics, no engines)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from arctic_servers.tinker import TinkerRoutes, TinkerSettings, start_tinker_server
from conformance.fake.server import BackgroundFake

TOKEN = "tinker-test-pat-7c1e"
API_KEY = "tml-" + TOKEN
OTHER_TOKEN = "tinker-test-pat-other"  # a second token of the Tinker routes (hostile tests)
BASE_MODEL = "fake-tiny"
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class TinkerServer:
    url: str
    routes: TinkerRoutes
    fake: Any


def _serve(settings: TinkerSettings) -> Iterator[TinkerServer]:
    """The Tinker routes (`settings`) over a fake gateway's protocol core, in process, on the
    fake's event loop (admin on: tests read its jobs' state)."""
    os.environ.setdefault("TINKER_TELEMETRY", "0")
    with BackgroundFake(tokens=(TOKEN, OTHER_TOKEN), grpc=False, admin=True) as fake:
        runner, url, routes = fake.run(
            start_tinker_server(fake.core, settings)  # the fake core's tokens
        )
        try:
            yield TinkerServer(url, routes, fake)
        finally:
            fake.run(routes.ops.backend.close())
            fake.run(runner.cleanup())


@pytest.fixture(scope="session")
def tinker_fake() -> Iterator[TinkerServer]:
    """Full fine-tune opted in by the operator (`lora="full_finetune"`)."""
    yield from _serve(TinkerSettings(models=(BASE_MODEL,), only_listed=True, lora="full_finetune"))


@pytest.fixture(scope="session")
def tinker_refusing() -> Iterator[TinkerServer]:
    """`lora="refuse"`: LoRA requests are refused, naming lora_config.rank."""
    yield from _serve(TinkerSettings(models=(BASE_MODEL,), only_listed=True, lora="refuse"))


@pytest.fixture(scope="session")
def tinker_lora() -> Iterator[TinkerServer]:
    """The default settings: a LoRA config becomes the training sub-job's training_config.lora."""
    yield from _serve(TinkerSettings(models=(BASE_MODEL,), only_listed=True))


def scenario_env(
    model: str = BASE_MODEL,
    eps: float = 1e-12,
    key: str = API_KEY,
    lora: bool = False,
    **extra: str,
) -> dict:
    """The child's environment: `lora` says the server trains LoRA adapters for LoRA clients
    (its default settings), so `get_info` / weights info answer is_lora true."""
    return {
        **os.environ,
        "TINKER_API_KEY": key,
        "TINKER_TELEMETRY": "0",
        "TINKER_TEST_MODEL": model,
        "HF_HUB_OFFLINE": "1",
        "TINKER_TEST_EPS": repr(eps),
        "TINKER_TEST_LORA": "1" if lora else "0",
        **extra,
    }


def run_scenario(
    name: str,
    url: str,
    *,
    model: str = BASE_MODEL,
    eps: float = 1e-12,
    timeout: float = 300,
    key: str = API_KEY,
    lora: bool = False,
    module: str = "scenarios",
    **extra: str,
) -> dict:
    """Run the scenario `name` of `tests/tinker/<module>.py` against `url` in a child process
    (`extra`: more environment variables)."""
    env = scenario_env(model, eps, key, lora, **extra)
    p = subprocess.run(
        [sys.executable, "-m", f"tests.tinker.{module}", name, url],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    out = p.stdout + p.stderr
    assert p.returncode == 0, f"scenario {name} failed:\n{out[-6000:]}"
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return dict(json.loads(line[7:]))


@pytest.fixture(scope="session")
def tinker_expiring() -> Iterator[TinkerServer]:
    """Sessions expire after 3 s without a heartbeat (the SDK beats every 10 s)."""
    yield from _serve(
        TinkerSettings(
            models=(BASE_MODEL,), only_listed=True, lora="full_finetune", session_timeout_s=3.0
        )
    )


@pytest.fixture(scope="session")
def tinker_embedded() -> Iterator[TinkerServer]:
    """The catalog of the on-prem engines (`EmbeddedCatalog`: tiny-qwen2 and tiny-4l, their
    1024-position window, their tokenizer files under /hf/) over the fake gateway's jobs, and
    no `models` setting: what an on-prem server without --tinker-models lists."""
    from arctic_servers.engines.config import ModelChoice
    from arctic_servers.tinker.catalog import EmbeddedCatalog

    yield from _serve(TinkerSettings(lora="full_finetune", catalog=EmbeddedCatalog(ModelChoice())))


def spawn_scenario(module: str, name: str, url: str, env: dict) -> subprocess.Popen:
    """A scenario in a child process that the test steers through signal files."""
    return subprocess.Popen(
        [sys.executable, "-m", f"tests.tinker.{module}", name, url],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_signal(child: subprocess.Popen, path: Path, timeout: float) -> None:
    """Wait until the child writes `path`; fail with its output if it exits first."""
    import time

    deadline = time.monotonic() + timeout
    while not path.exists():
        assert child.poll() is None, child.stdout.read() if child.stdout else ""
        assert time.monotonic() < deadline, f"the client did not write {path.name}"
        time.sleep(0.2)
