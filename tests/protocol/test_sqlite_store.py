"""Refused sequence numbers in the request stores, and across a restart of a durable server."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp

from arctic_servers.protocol.config import ProtocolConfig, ProtocolLimits
from arctic_servers.protocol.sqlite_store import SqliteChunkStore, SqliteRequestStore
from arctic_servers.protocol.stores import MemoryRequestStore, RequestRecord, RequestStore
from arctic_servers.serving.serve import RunningServer, start_server

from .test_core import PREFIX, Toy, _post


def _fill(store: RequestStore) -> None:
    store.create(RequestRecord("j1", "r1", "step", status="completed", seq=1))
    store.create(RequestRecord("j1", "r3", "step", status="pending", seq=3))  # not ended
    store.refuse_seq("j1", 2)
    store.refuse_seq("j1", 2)  # twice: one entry
    store.refuse_seq("j2", 1)


def test_sqlite_store_keeps_refused_seqs(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    store = SqliteRequestStore(db)
    _fill(store)
    assert store.executed_seqs() == {"j1": {1, 2}, "j2": {1}}
    assert store.find_seq("j1", 2) is None  # refused: no request holds the number
    store.close()

    reopened = SqliteRequestStore(db)  # a restart: what was committed is there
    assert reopened.executed_seqs() == {"j1": {1, 2}, "j2": {1}}
    reopened.delete_job("j2")
    assert reopened.executed_seqs() == {"j1": {1, 2}}
    reopened.delete_job("j1")
    assert reopened.executed_seqs() == {}
    reopened.close()


def test_memory_store_counts_refused_seqs_while_it_lives() -> None:
    store = MemoryRequestStore()
    _fill(store)
    assert store.executed_seqs() == {"j1": {1, 2}, "j2": {1}}
    store.delete_job("j1")
    assert store.executed_seqs() == {"j2": {1}}


async def test_refused_seq_is_not_waited_for_after_a_restart(tmp_path: Path) -> None:
    """Seq 1 refused, the server restarted on the same SQLite file: seq 2 runs at once instead of
    waiting out the gap timeout for a number that will never run."""
    db = tmp_path / "state.db"
    toy = Toy()
    cfg = ProtocolConfig(limits=ProtocolLimits(sequence_gap_timeout_seconds=5))

    async def serve() -> RunningServer:
        return await start_server(
            toy, cfg, request_store=SqliteRequestStore(db), chunk_store=SqliteChunkStore(db)
        )

    srv = await serve()
    try:
        async with aiohttp.ClientSession() as s:
            url = srv.base_url + PREFIX + "/7/step"
            status, body = await _post(s, url, json={"bogus": 1}, headers={"X-Arctic-Seq": "1"})
    finally:
        await srv.close()
    assert (status, body["error"]["code"]) == (400, "invalid_argument"), body

    srv = await serve()
    loop = asyncio.get_running_loop()
    try:
        assert await srv.core.restore() == {"pending": 0, "running": 0, "failed": 0}
        async with aiohttp.ClientSession() as s:
            t0 = loop.time()
            url = srv.base_url + PREFIX + "/7/step"
            status, body = await _post(s, url, json={}, headers={"X-Arctic-Seq": "2"})
            while body.get("status") not in ("completed", "failed", "cancelled"):
                assert loop.time() - t0 < 10, body
                await asyncio.sleep(0.05)
                async with s.get(f"{srv.base_url}{PREFIX}/7/requests/{body['request_id']}") as r:
                    body = await r.json()
            took = loop.time() - t0
    finally:
        await srv.close()
    assert body["status"] == "completed", body
    assert took < 2, f"seq 2 waited {took:.1f} s for the refused seq 1"
    assert toy.log == [("step", 2)]
