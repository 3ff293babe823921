"""The OpenAI-compatible routes served over the fake numerics, in a background thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from arctic_servers.openai.fake import FakeResolver, FakeSampler
from arctic_servers.openai.routes import start_openai_server

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
