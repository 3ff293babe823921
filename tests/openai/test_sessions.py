"""Session ids are untrusted input: another token's session is 404, ids are bounded in length
and alphabet, each token holds a bounded number of live sessions, idle sessions expire, the
body's and the header's ids must agree, a session continues one conversation (n = 1)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from arctic_servers.openai.fake import FakeResolver, FakeSampler
from arctic_servers.openai.routes import start_openai_server
from arctic_servers.openai.sessions import MAX_ID_LEN, SessionStore

A, B = "sk-sessions-a", "sk-sessions-b"
MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def srv() -> Iterator[dict[str, Any]]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    store = SessionStore(ttl_s=1.5, max_per_owner=3, max_total=100)
    fut = asyncio.run_coroutine_threadsafe(
        start_openai_server(FakeResolver(FakeSampler("m")), tokens=[A, B], sessions=store), loop
    )
    runner, url = fut.result(30)
    yield {"v1": url + "/v1", "store": store}
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def _chat(srv: dict[str, Any], token: str, sid: Any = None, header: str = "", **kw: Any) -> Any:
    body = {"model": "m", "messages": MSG, "max_tokens": 3, "seed": 1, **kw}
    if sid is not None:
        body["session_id"] = sid
    headers = {"Authorization": f"Bearer {token}"}
    if header:
        headers["X-Session-ID"] = header
    return requests.post(srv["v1"] + "/chat/completions", json=body, headers=headers, timeout=30)


def _session(srv: dict[str, Any], token: str, sid: str, method: str = "GET") -> Any:
    return requests.request(
        method,
        f"{srv['v1']}/sessions/{sid}",
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )


def test_another_tokens_session_is_not_found(srv: dict[str, Any]) -> None:
    srv["store"].sessions.clear()
    assert _chat(srv, A, "shared-name").status_code == 200
    assert _session(srv, A, "shared-name").json()["turns"]
    got = _session(srv, B, "shared-name")
    assert got.status_code == 404 and got.json()["error"]["code"] == "session_not_found"
    assert _session(srv, B, "shared-name", "DELETE").status_code == 404
    # B's turn with the same id is B's own session: A's history is untouched
    assert _chat(srv, B, "shared-name").status_code == 200
    assert len(_session(srv, A, "shared-name").json()["turns"]) == 1
    assert _session(srv, A, "shared-name", "DELETE").json()["deleted"] is True
    assert _session(srv, A, "shared-name").status_code == 404
    assert _session(srv, B, "shared-name").status_code == 200


@pytest.mark.parametrize(
    "sid",
    ["x" * (MAX_ID_LEN + 1), "../etc/passwd\n", "a b", "ü", "", 7, ["a"], "a\x00b"],
)
def test_bad_ids_are_refused_by_name(srv: dict[str, Any], sid: Any) -> None:
    r = _chat(srv, A, sid)
    if sid == "":
        assert r.status_code == 200  # an empty id: no session, as absent
        return
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "session_id"


def test_header_and_body_must_agree_and_n_is_one(srv: dict[str, Any]) -> None:
    r = _chat(srv, A, "one", header="two")
    assert r.status_code == 400 and "differ" in r.json()["error"]["message"]
    assert _chat(srv, A, header="hdr-only").status_code == 200
    assert _session(srv, A, "hdr-only").status_code == 200
    r = _chat(srv, A, "one", n=2)
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"
    long_path = _session(srv, A, "y" * (MAX_ID_LEN + 1))
    assert long_path.status_code == 400


def test_count_is_bounded_per_token_and_sessions_expire(srv: dict[str, Any]) -> None:
    srv["store"].sessions.clear()
    for i in range(3):
        assert _chat(srv, A, f"s{i}").status_code == 200
    over = _chat(srv, A, "s3")
    assert over.status_code == 429 and over.json()["error"]["code"] == "too_many_sessions"
    assert _chat(srv, B, "s3").status_code == 200  # B's quota is its own
    assert _chat(srv, A, "s0").status_code == 200  # an existing session goes on
    time.sleep(2.0)  # idle past the 1.5 s ttl
    assert _session(srv, A, "s1").status_code == 404
    assert _chat(srv, A, "s3").status_code == 200
