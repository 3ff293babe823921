"""The OpenAI-compatible routes served over the fake numerics, in a background thread."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from arctic_servers.openai.fake import FakeResolver, FakeSampler
from arctic_servers.openai.routes import start_openai_server

HARBOR_DIR = Path(__file__).resolve().parents[2] / "examples" / "harbor"
if str(HARBOR_DIR) not in sys.path:  # Harbor's example modules are scripts, not a package
    sys.path.insert(0, str(HARBOR_DIR))

import install_harbor  # noqa: E402
import run_terminus  # noqa: E402

__all__ = ["API_KEY", "OpenAIServer", "run_terminus"]

API_KEY = "sk-arctic-test-4b1f"
DELAY_S = 0.004  # per streamed token: the stream's chunks are spread out in time


@dataclass
class OpenAIServer:
    base_url: str
    chat: FakeSampler
    base: FakeSampler

    @property
    def v1(self) -> str:
        return self.base_url + "/v1"


@pytest.fixture(scope="session")
def openai_server() -> Iterator[OpenAIServer]:
    chat = FakeSampler("fake-tiny", token_delay_s=DELAY_S, max_model_len=2048)
    base = FakeSampler("fake-base", chat_template=False)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    resolver = FakeResolver(chat, base)
    fut = asyncio.run_coroutine_threadsafe(start_openai_server(resolver, tokens=[API_KEY]), loop)
    runner, url = fut.result(30)
    try:
        yield OpenAIServer(url, chat, base)
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def harbor() -> str:
    """Harbor 0.26's `harbor` executable (its own cached venv; skipped where it cannot be
    installed, failed under CI) and the host environment's tools."""
    for tool in ("tmux", "unshare", "nsenter", "chroot"):
        if shutil.which(tool) is None:
            _unavailable(f"Harbor's host environment needs `{tool}` (tmux for terminus-2)")
    try:
        return str(install_harbor.ensure_harbor(timeout=600))
    except install_harbor.HarborUnavailable as exc:
        _unavailable(f"Harbor 0.26 could not be installed: {exc}")
        raise
