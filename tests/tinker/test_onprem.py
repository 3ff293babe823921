"""The unmodified `tinker` client against the on-prem server on the embedded tiny model (real
DeepSpeed trainer and vLLM sampler): an SFT loop with pipelined futures, weights saved for a
sampler and sampled, and an importance-sampling RL step. The Tinker routes are mounted on the
on-prem server's own listener (`start_onprem(tinker=...)`)."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from arctic_servers.tinker import TinkerSettings

from .conftest import API_KEY, TOKEN, run_scenario

ENGINES = all(importlib.util.find_spec(m) is not None for m in ("torch", "vllm", "deepspeed"))
MODEL = "tiny-qwen2"  # the embedded model's name

pytestmark = pytest.mark.skipif(
    not ENGINES and not (os.environ.get("CI") or os.environ.get("ARCTIC_ONPREM_TESTS")),
    reason="the on-prem engines are not installed (bash tools/install_engines.sh)",
)


@pytest.fixture(scope="module")
def onprem_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from arctic_servers.onprem.server import start_onprem
    from arctic_servers.onprem.settings import ServerSettings

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    data = Path(tmp_path_factory.mktemp("tinker-onprem"))
    settings = ServerSettings(data_dir=data, prewarm=())
    tinker = TinkerSettings(models=(MODEL,), lora="full_finetune")
    fut = asyncio.run_coroutine_threadsafe(
        start_onprem(settings, tokens=[TOKEN], grpc_port=None, tinker=tinker), loop
    )
    srv, _ = fut.result(120)
    try:
        yield srv.base_url
    finally:
        asyncio.run_coroutine_threadsafe(srv.close(), loop).result(120)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def test_sft_loop_sample_and_listing(onprem_url: str) -> None:
    assert API_KEY.startswith("tml-")
    run_scenario("sft_loop_sample_and_listing", onprem_url, model=MODEL, timeout=600)


def test_rl_step(onprem_url: str) -> None:
    run_scenario("rl_step_importance_sampling", onprem_url, model=MODEL, timeout=600)
