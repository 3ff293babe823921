"""Unit tests of the gateway's small parts: PATs from a file or the environment (kept as digests),
and the worker host's journal, which makes a worker command run at most once per key."""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path
from typing import Any

from arctic_servers.engines.worker.engine_base import EngineBase
from arctic_servers.gateway.settings import load_tokens, parse_tokens
from arctic_servers.gateway.worker_host import WorkerHost
from arctic_servers.gateway.worker_process import Channel


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


class Engine(EngineBase):
    def __init__(self) -> None:
        self.runs: list[int] = []
        self.gate = threading.Event()

    def commands(self) -> dict[str, Any]:
        return {"add": self.op_add, "wait": self.op_wait}

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


def test_a_command_the_engine_lacks_answers_unimplemented() -> None:
    """An `engine` op whose command this worker's engine does not have (a new op, an older
    engine) is `unimplemented` naming the command, as an on-prem worker answers, not `internal`."""
    host, chan, rec = host_with(Engine())
    call(host, chan, 1, "r1/toy", "toy_count", body={})
    drain(host)
    err = rec.sent[0]["error"]
    assert rec.sent[0]["ok"] is False and err["code"] == "unimplemented"
    assert "toy_count" in err["message"]


def test_the_journal_keeps_the_newest_finished_calls() -> None:
    engine = Engine()
    host, chan, _ = host_with(engine)
    for i in range(4):
        call(host, chan, i, f"r{i}/add", "add", x=i)
    drain(host)
    assert list(host.journal) == ["r2/add", "r3/add"]  # journal_max 2


def test_the_worker_host_batches_generates_and_pauses_them_for_a_weight_load() -> None:
    """The gateway's worker host schedules a sampler as the on-prem worker does (the same
    `placement`): generates join the engine's batch; a weight load waits until the batch is empty
    and the generates sent after it wait for it; a cancelled generate leaves the engine."""
    from ..onprem.test_worker_batch import ToyEngine

    engine = ToyEngine()
    host = WorkerHost({"sub_job_id": "j:sampling:0"})
    host.engine = engine
    rec = Recorder()
    chan = Channel(rec)  # type: ignore[arg-type]
    loop = threading.Thread(target=host.run, daemon=True)
    loop.start()
    gen = {"prompts": [[1]], "sampling_params": {"max_tokens": 30}}
    for i in range(4):
        host.dispatch(chan, {"op": "call", "id": i, "key": f"b{i}", "cmd": "generate", "args": gen})
    load = {"op": "call", "id": 10, "key": "load", "cmd": "load_weights"}
    host.dispatch(chan, {**load, "args": {"weight_version": 1}})
    for i in range(4):
        short = {**gen, "sampling_params": {"max_tokens": 5}}
        host.dispatch(
            chan, {"op": "call", "id": 20 + i, "key": f"a{i}", "cmd": "generate", "args": short}
        )
    long = {"prompts": [[1]], "sampling_params": {"max_tokens": 10**6}}
    host.dispatch(chan, {"op": "call", "id": 30, "key": "long", "cmd": "generate", "args": long})
    deadline = time.monotonic() + 10
    while len(rec.sent) < 9 or engine.steps < 45:
        assert time.monotonic() < deadline, rec.sent
        time.sleep(0.01)
    assert host.cancel("long") == {"cancelled": False, "state": "running"}
    while len(rec.sent) < 10:
        assert time.monotonic() < deadline, rec.sent
        time.sleep(0.01)
    host.queue.put(None)
    loop.join(5)
    by_id = {m["id"]: m for m in rec.sent}
    assert engine.loads_saw == [0] and by_id[10]["result"] == {"loaded": 1}
    for i in range(4):
        before = by_id[i]["result"]
        assert before["weight_version"] == 0 and set(before["tokens"]) == {0}
        after = by_id[20 + i]["result"]
        assert after["weight_version"] == 1 and set(after["tokens"]) == {1}
    assert engine.peak >= 4  # the first four ran together
    assert by_id[30]["error"]["code"] == "request_cancelled" and not engine.reqs


async def test_an_unreadable_answer_reconnects_and_collects_the_call_by_key() -> None:
    """A worker answer the gateway cannot unpickle is a lost answer: the client drops that
    connection, reconnects and collects the call by its key (the worker host's journal keeps the
    answer), so the caller gets its result instead of waiting forever."""
    import asyncio
    from multiprocessing.connection import Listener

    from arctic_servers.gateway.workers import WorkerClient

    authkey = b"k" * 16
    listener = Listener(("127.0.0.1", 0), authkey=authkey)
    seen: list[dict[str, Any]] = []

    def host() -> None:
        first = listener.accept()
        call = first.recv()
        seen.append(call)
        first.send_bytes(b"not a pickle")  # the answer, garbled on the way
        second = listener.accept()  # the client's reconnect
        collect = second.recv()
        seen.append(collect)
        second.send({"id": collect["id"], "ok": True, "result": {"sum": 3}})
        time.sleep(0.5)
        first.close()
        second.close()

    t = threading.Thread(target=host, daemon=True)
    t.start()
    client = WorkerClient("j:training:0", listener.address, authkey, alive=lambda: None)
    try:
        await client.connect()
        got = await asyncio.wait_for(client.call("add", {"x": 1}, key="req-1"), 20)
    finally:
        client.close()
        listener.close()
    t.join(5)
    assert got == {"sum": 3}
    assert seen[0]["op"] == "call" and seen[0]["key"] == "req-1"
    assert seen[1] == {"op": "collect", "id": seen[0]["id"], "key": "req-1"}


def _tcp_nodelay_by_port(port: int) -> list[int]:
    """TCP_NODELAY of every connected TCP socket of this process with `port` at either end."""
    import os
    import socket

    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            s = socket.socket(fileno=os.dup(int(name)))
        except OSError:
            continue
        try:
            if s.family != socket.AF_INET or s.type != socket.SOCK_STREAM:
                continue
            try:
                ends = (s.getsockname()[1], s.getpeername()[1])
            except OSError:
                continue  # not connected: the listener
            if port in ends:
                found.append(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        finally:
            s.close()
    return found


async def test_the_worker_link_sends_small_messages_at_once() -> None:
    """Both ends of the gateway's TCP link to a worker host turn Nagle's algorithm off: with it on,
    concurrent generates sent one behind another waited for the worker's delayed ACK (they joined
    the engine only when the first call's answer went back) and a step's answers sat 40 ms in
    the worker's socket (measured: 8 single-prompt calls of 8 tokens took 93 ms against 26 ms
    for one call of the 8 prompts; 46 ms with Nagle off)."""
    import asyncio
    from multiprocessing.connection import Listener

    from arctic_servers.gateway.workers import WorkerClient

    authkey = b"k" * 16
    listener = Listener(("127.0.0.1", 0), authkey=authkey)
    host = WorkerHost({"sub_job_id": "j:training:0"})
    host.engine = Engine()
    threading.Thread(target=host.serve_connections, args=(listener,), daemon=True).start()
    threading.Thread(target=host.run, daemon=True).start()
    client = WorkerClient("j:training:0", listener.address, authkey, alive=lambda: None)
    try:
        await client.connect()
        got = await asyncio.wait_for(
            asyncio.gather(*(client.call("add", {"x": i}, key=f"k{i}") for i in range(4))), 20
        )
        assert got == [1, 2, 3, 4]
        assert _tcp_nodelay_by_port(listener.address[1]) == [1, 1]  # the client's end, the host's
    finally:
        client.close()
        listener.close()
        host.queue.put(None)


def test_no_delay_leaves_pipes_alone() -> None:
    from multiprocessing import Pipe

    from arctic_servers.engines.worker.replies import no_delay

    a, b = Pipe()
    assert no_delay(a) is a
    a.send({"x": 1})
    assert b.recv() == {"x": 1}


class TenantEngine(Engine):
    def commands(self) -> dict[str, Any]:
        return {"add": self.op_tenant_add}

    def op_tenant_add(self, x: int, tenant: str = "") -> int:
        self.runs.append(x)
        return x


def test_a_pool_workers_queue_serves_tenants_in_turn() -> None:
    """A LoRA pool's worker (calls naming their tenant): a busy tenant's backlog does not hold
    back another's call (tenant_queue.py); each tenant's calls keep their order."""
    engine = TenantEngine()
    host, chan, _rec = host_with(engine)
    for i in range(5):
        call(host, chan, i, f"a{i}", "add", x=i, tenant="busy")
    call(host, chan, 9, "b", "add", x=100, tenant="occasional")
    drain(host)
    assert engine.runs == [0, 100, 1, 2, 3, 4]


def test_a_pooled_jobs_sync_is_a_file_on_one_host_and_a_blob_across_nodes() -> None:
    """A pooled job's sub-job records carry its pool worker's place (lora_pools.py), and its
    sync is the /dev/shm file when the pool's workers are on one host, the blob when they are
    on two Ray nodes — where a job with its own workers takes the weight group (issue 33)."""
    from types import SimpleNamespace

    from arctic_servers.gateway.dataplane import DataPlane
    from arctic_servers.gateway.model import Job, SubJob

    def job(pool: str, nodes: tuple[str, str], backend: str) -> Job:
        conf = {"lora": {"rank": 8}}
        subs = [
            SubJob(f"j:{role}:0", role, 0, "tiny", conf if role == "training" else {})
            for role in ("training", "sampling")
        ]
        for s, node in zip(subs, nodes, strict=True):
            s.worker = {"backend": backend, "pid": 1, "node_id": node, "info": {"device": "cpu"}}
        return Job("j", None, subs, {}, "", "", 0, pool=pool)

    gw: Any = SimpleNamespace(profile=SimpleNamespace(collective_sync=True))
    gw.sync_placement = lambda src, targets: DataPlane.sync_placement(gw, src, targets)
    shm = Path("/dev/shm").is_dir()

    def method(j: Job) -> str:
        return DataPlane.sync_method(gw, j, {})

    assert method(job("", ("n1", "n1"), "local")) == "collective"
    assert method(job("", ("n1", "n2"), "ray")) == "collective"
    assert method(job("pool-1", ("n1", "n1"), "local")) == ("shm" if shm else "safetensors")
    assert method(job("pool-1", ("n1", "n1"), "ray")) == ("shm" if shm else "safetensors")
    assert method(job("pool-1", ("n1", "n2"), "ray")) == "safetensors"
