"""Unit tests of the gateway's small parts: PATs from a file or the environment (kept as digests),
and the worker host's journal, which makes a worker command run at most once per key."""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path
from typing import Any

from arctic_servers.gateway.settings import load_tokens, parse_tokens
from arctic_servers.gateway.worker_host import Channel, WorkerHost


def digest(t: str) -> str:
    return hashlib.sha256(t.encode()).hexdigest()


def test_tokens_from_a_file_and_the_environment(tmp_path: Path) -> None:
    f = tmp_path / "tokens"
    f.write_text(f"# comment\n\nplain-token  # ana\nsha256:{digest('hashed-token')}\n")
    got = load_tokens(f, env={"ARCTIC_GATEWAY_TOKENS": "env-a, env-b"})
    want = {digest(t) for t in ("plain-token", "hashed-token", "env-a", "env-b")}
    assert got == want
    assert parse_tokens(["", "# x"]) == frozenset()
    assert load_tokens(None, env={}) == frozenset()


class Recorder:
    """A fake connection: records what the worker host sends."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def send(self, msg: dict[str, Any]) -> None:
        self.sent.append(msg)


class Engine:
    def __init__(self) -> None:
        self.runs: list[int] = []
        self.gate = threading.Event()

    def op_add(self, x: int) -> int:
        self.runs.append(x)
        return x + 1

    def op_wait(self) -> str:
        self.gate.wait(5)
        return "done"


def host_with(engine: Engine) -> tuple[WorkerHost, Channel, Recorder]:
    host = WorkerHost({"sub_job_id": "j:training:0", "journal_max": 2})
    host.engine = engine
    rec = Recorder()
    chan = Channel(rec)  # type: ignore[arg-type]
    return host, chan, rec


def call(host: WorkerHost, chan: Channel, mid: int, key: str, cmd: str, **args: Any) -> None:
    host.dispatch(chan, {"op": "call", "id": mid, "key": key, "cmd": cmd, "args": args})


def drain(host: WorkerHost) -> None:
    host.queue.put(None)
    host.run()


def test_a_key_runs_once_and_answers_every_asker() -> None:
    engine = Engine()
    host, chan, rec = host_with(engine)
    call(host, chan, 1, "r1/add", "add", x=1)
    call(host, chan, 2, "r1/add", "add", x=1)  # the same key while queued: waits for it
    drain(host)
    call(host, chan, 3, "r1/add", "add", x=1)  # after it ran: answered from the journal
    host.dispatch(chan, {"op": "collect", "id": 4, "key": "r1/add"})
    host.dispatch(chan, {"op": "collect", "id": 5, "key": "never-sent"})
    assert engine.runs == [1]
    assert [(m["id"], m.get("result")) for m in rec.sent[:4]] == [(1, 2), (2, 2), (3, 2), (4, 2)]
    assert rec.sent[4] == {"id": 5, "ok": False, "unknown": True}


def test_cancel_drops_a_queued_call_and_flags_a_running_one() -> None:
    engine = Engine()
    host, chan, rec = host_with(engine)
    call(host, chan, 1, "r1/add", "add", x=1)
    assert host.cancel("r1/add") == {"cancelled": True, "state": "cancelled"}
    assert rec.sent[0]["error"]["code"] == "request_cancelled"
    t = threading.Thread(target=drain, args=(host,))
    call(host, chan, 2, "r2/wait", "wait")
    t.start()
    for _ in range(500):
        if host.current is not None:
            break
        time.sleep(0.01)
    assert host.cancel("r2/wait") == {"cancelled": False, "state": "running"}
    assert host.journal["r2/wait"].cancel.is_set()  # the engine may stop at a safe point
    engine.gate.set()
    t.join(5)
    assert engine.runs == [] and rec.sent[-1] == {"id": 2, "ok": True, "result": "done"}


def test_the_journal_keeps_the_newest_finished_calls() -> None:
    engine = Engine()
    host, chan, _ = host_with(engine)
    for i in range(4):
        call(host, chan, i, f"r{i}/add", "add", x=i)
    drain(host)
    assert list(host.journal) == ["r2/add", "r3/add"]  # journal_max 2
