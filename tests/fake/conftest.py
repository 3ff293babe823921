"""Fixtures of the fake gateway's tests: a fresh fake per test (admin on, one PAT)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import grpc
import pytest

from conformance.fake import RunningFake, start_fake

from .raw import TOKEN, Grpc, Http


@pytest.fixture
async def fake() -> AsyncIterator[RunningFake]:
    f = await start_fake(token=TOKEN, admin=True)
    yield f
    await f.close()


@pytest.fixture
async def http(fake: RunningFake) -> AsyncIterator[Http]:
    async with aiohttp.ClientSession() as session:
        yield Http(session, fake)


@pytest.fixture
async def rpc(fake: RunningFake) -> AsyncIterator[Grpc]:
    async with grpc.aio.insecure_channel(fake.grpc_target) as channel:
        yield Grpc(channel)


@pytest.fixture
async def job(http: Http) -> str:
    return await http.create_job()
