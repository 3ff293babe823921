"""The sync `Client` inside a running event loop warns once, naming `AsyncClient` (issue 37):
it blocks the loop (a 30 s step froze every other task for 36 s, silently)."""

from __future__ import annotations

import asyncio
import warnings

from arctic_sdk import Client, SyncClientInEventLoopWarning
from conformance.fake import BackgroundFake

from .conftest import FAST, TOKEN


def test_sync_client_in_a_running_loop_warns_once_at_the_callers_line(
    fake: BackgroundFake,
) -> None:
    client = Client(fake.base_url, token=TOKEN, config=dict(FAST))

    async def main() -> None:
        client.get_capabilities()
        client.get_capabilities()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asyncio.run(main())
    client.close()
    ours = [w for w in caught if issubclass(w.category, SyncClientInEventLoopWarning)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    text = str(ours[0].message)
    assert "Client.get_capabilities()" in text and "AsyncClient" in text
    assert ours[0].filename == __file__  # the user's line, not the SDK's


def test_sync_client_outside_a_loop_and_in_a_thread_does_not_warn(fake: BackgroundFake) -> None:
    with Client(fake.base_url, token=TOKEN, config=dict(FAST)) as client:
        client.get_capabilities()  # pytest turns any warning into an error here

        async def main() -> None:
            await asyncio.to_thread(client.get_capabilities)  # the loop is not blocked

        asyncio.run(main())
