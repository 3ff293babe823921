"""The weight-sync method choice and the collective sync's coordination
(`serving/collective_sync.py`), against scripted workers: which method `auto` picks where, what
is refused and why, that a group is built once and rebuilt when its members change, that a
failing or stalled member fails the sync with a retryable error within bounded time, and that
the worker calls carry no weight bytes (only the rendezvous, the version, the group)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from arctic_servers.rules.errors import ProtocolError
from arctic_servers.serving import collective_sync as cs
from arctic_servers.serving.collective_sync import Member, Placement, SyncSettings, pick_method

CPU_HOST = Placement(cuda=False, same_host=True, shm=True)
GPU_HOST = Placement(cuda=True, same_host=True, shm=True)
CPU_NODES = Placement(cuda=False, same_host=False, shm=True)
FAKE_NODES = Placement(cuda=False, same_host=False, shm=True, collective=False)


def test_auto_picks_by_where_the_workers_are() -> None:
    assert pick_method(None, CPU_HOST) == cs.AUTO_SAME_HOST["cpu"]
    assert pick_method("auto", Placement(cuda=False, same_host=True, shm=False)) == "collective"
    assert cs.AUTO_SAME_HOST["cpu"] == "collective"  # measured faster than /dev/shm here
    assert pick_method("auto", GPU_HOST) == "cuda_ipc"  # one GPU shared: no NCCL group on it
    assert pick_method("auto", Placement(True, True, True, shared_gpu=False)) == "collective"
    assert pick_method("auto", GPU_HOST, cuda_ipc=True) == "cuda_ipc"  # the legacy knob
    assert pick_method("auto", CPU_NODES) == "collective"
    assert pick_method("auto", Placement(cuda=True, same_host=False, shm=True)) == "collective"
    assert pick_method("auto", FAKE_NODES) == "safetensors"  # no process group there
    assert pick_method("auto", Placement(False, True, True, collective=False)) == "shm"


def test_methods_that_cannot_run_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="needs CUDA"):
        pick_method("nccl", CPU_HOST)
    with pytest.raises(ValueError, match="needs CUDA"):
        pick_method("cuda_ipc", CPU_NODES)
    with pytest.raises(ValueError, match="on one host"):
        pick_method("shm", CPU_NODES)
    with pytest.raises(ValueError, match="on one host"):
        pick_method("cuda_ipc", Placement(cuda=True, same_host=False, shm=True))
    with pytest.raises(ValueError, match="/dev/shm"):
        pick_method("shm", Placement(cuda=False, same_host=True, shm=False))
    with pytest.raises(ValueError, match="process group"):
        pick_method("collective", FAKE_NODES)
    with pytest.raises(ValueError, match="not one of"):
        pick_method("pigeon", CPU_HOST)
    with pytest.raises(ValueError, match="one device per rank"):
        pick_method("nccl", GPU_HOST)
    assert pick_method("NCCL", Placement(True, True, True, shared_gpu=False)) == "nccl"
    assert pick_method("nccl", Placement(cuda=True, same_host=False, shm=True)) == "nccl"
    assert pick_method("safetensors", CPU_NODES) == "safetensors"


class Workers:
    """Scripted workers: record every call, answer as the engines do, fail on request."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.fail: dict[tuple[str, str], ProtocolError] = {}
        self.stall: set[tuple[str, str]] = set()
        self.cancelled: list[tuple[str, str]] = []
        self.load_seconds: dict[str, float] = {}

    async def call(self, sub: str, cmd: str, **args: Any) -> Any:
        self.calls.append((sub, cmd, args))
        if (sub, cmd) in self.stall:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                self.cancelled.append((sub, cmd))
                raise
        if (sub, cmd) in self.fail:
            raise self.fail[(sub, cmd)]
        if cmd == "weight_group_open":
            return {"host": args["host"], "port": 4242, "backend": "gloo"}
        if cmd == "send_weights":
            return {"num_tensors": 3, "num_bytes": 3000, "num_buckets": 2, "bucket_bytes": 2000}
        if cmd == "load_weights":
            return {"load_seconds": self.load_seconds.get(sub, 0.0)}
        return {}

    def cmds(self, cmd: str) -> list[str]:
        return [s for s, c, _ in self.calls if c == cmd]


def members(*subs: str, key: int = 0) -> list[Member]:
    return [Member(s, (s, key)) for s in subs]


async def test_a_group_is_built_once_and_rebuilt_when_members_change() -> None:
    w, sync = Workers(), cs.CollectiveSync("job-1")
    src, tgt = members("T", "S")
    res = await sync.run(w.call, src, [tgt], version=1, host="10.0.0.1")
    assert res["method"] == "collective" and res["backend"] == "gloo"
    assert (res["num_buckets"], res["bucket_bytes"], res["num_bytes"]) == (2, 2000, 3000)
    assert res["setup_seconds"] > 0
    joins = [a for _, c, a in w.calls if c == "weight_group_join"]
    assert sorted(a["rank"] for a in joins) == [0, 1]
    assert {a["host"] for a in joins} == {"10.0.0.1"} and {a["port"] for a in joins} == {4242}
    assert {a["world_size"] for a in joins} == {2}
    # no weight bytes in any worker call: only names, numbers and addresses
    for _, _, args in w.calls:
        assert all(isinstance(v, str | int | float) for v in args.values()), args

    w.calls.clear()
    res = await sync.run(w.call, src, [tgt], version=2, host="10.0.0.1")
    assert res["setup_seconds"] == 0.0 and not w.cmds("weight_group_join")
    loads = [a for _, c, a in w.calls if c == "load_weights"]
    assert loads == [
        {"method": "collective", "weight_version": 2, "group_id": sync.group_id,
         "start_timeout_s": cs.START_TIMEOUT_S}
    ]  # fmt: skip

    # a second target joins: the old group is closed everywhere, a new one built with 3 ranks
    w.calls.clear()
    (ref,) = members("R")
    old = sync.group_id
    await sync.run(w.call, src, [tgt, ref], version=3, host="10.0.0.1")
    assert sorted(w.cmds("weight_group_close")) == ["R", "S", "T"]
    assert sync.group_id != old
    assert {a["world_size"] for _, c, a in w.calls if c == "weight_group_join"} == {3}

    # the sampler's worker restarted (another key): rebuilt again
    w.calls.clear()
    await sync.run(w.call, src, [Member("S", ("S", 99)), ref], version=4, host="10.0.0.1")
    assert len(w.cmds("weight_group_join")) == 3


async def test_the_result_reports_the_slowest_targets_load() -> None:
    w, sync = Workers(), cs.CollectiveSync("job-1")
    w.load_seconds = {"S0": 0.25, "S1": 1.5}
    res = await sync.run(w.call, Member("T", "t"), members("S0", "S1"), version=1, host="h")
    assert res["load_seconds"] == 1.5  # SyncWeightsResult.load_seconds: the most on one target


async def test_ranks_follow_each_targets_worker_count() -> None:
    w, sync = Workers(), cs.CollectiveSync("job-1")
    src = Member("T", "t")
    targets = [Member("S0", "s0", ranks=2), Member("S1", "s1", ranks=4)]
    await sync.run(w.call, src, targets, version=1, host="h")
    ranks = {s: a["rank"] for s, c, a in w.calls if c == "weight_group_join"}
    assert ranks == {"T": 0, "S0": 1, "S1": 3}
    assert {a["world_size"] for _, c, a in w.calls if c == "weight_group_join"} == {7}
    assert cs.member_ranks({"weight_ranks": 4}) == 4 and cs.member_ranks({}) == 1


async def test_a_failed_member_fails_the_sync_retryably_and_closes_the_group() -> None:
    w, sync = Workers(), cs.CollectiveSync("job-1")
    src, tgt = members("T", "S")
    await sync.run(w.call, src, [tgt], version=1, host="h")
    w.fail[("S", "load_weights")] = ProtocolError("unavailable", "a broadcast failed on rank 1")
    with pytest.raises(ProtocolError) as e:
        await sync.run(w.call, src, [tgt], version=2, host="h")
    assert e.value.code == "unavailable" and "rank 1" in e.value.message
    assert "next sync builds a new one" in e.value.message
    assert sorted(w.cmds("weight_group_close")) == ["S", "T"] and sync.group_id == ""
    del w.fail[("S", "load_weights")]
    res = await sync.run(w.call, src, [tgt], version=2, host="h")
    assert res["setup_seconds"] > 0  # a new group


async def test_a_dead_member_is_named_before_the_timeouts_it_caused() -> None:
    w, sync = Workers(), cs.CollectiveSync("job-1")
    src, tgt = members("T", "S")
    w.fail[("T", "send_weights")] = ProtocolError("unavailable", "Operation timed out!")
    w.fail[("S", "load_weights")] = ProtocolError("sub_job_failed", "sub-job S failed: killed")
    with pytest.raises(ProtocolError) as e:
        await sync.run(w.call, src, [tgt], version=1, host="h")
    assert e.value.code == "sub_job_failed"


async def test_a_stalled_member_is_cancelled_after_the_grace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cs, "GRACE_S", 0.2)
    w, sync = Workers(), cs.CollectiveSync("job-1")
    src, tgt = members("T", "S")
    w.stall.add(("S", "load_weights"))
    w.stall.add(("S", "weight_group_close"))
    w.fail[("T", "send_weights")] = ProtocolError("unavailable", "Operation timed out!")
    t0 = time.monotonic()
    with pytest.raises(ProtocolError) as e:
        await sync.run(w.call, src, [tgt], version=1, host="h")
    assert time.monotonic() - t0 < 5
    assert "1 member(s) had not finished" in e.value.message
    assert ("S", "load_weights") in w.cancelled


async def test_nccl_needs_a_cuda_trainer() -> None:
    w, sync = Workers(), cs.CollectiveSync("job-1")
    src, tgt = members("T", "S")
    with pytest.raises(ProtocolError) as e:
        await sync.run(w.call, src, [tgt], version=1, host="h", method="nccl")
    assert e.value.code == "unsupported_option" and "no CUDA" in e.value.message


async def test_settings_reach_the_workers() -> None:
    w, sync = Workers(), cs.CollectiveSync("job-1")
    src, tgt = members("T", "S")
    settings = SyncSettings(bucket_bytes=1 << 20, start_timeout_s=30.0)
    await sync.run(w.call, src, [tgt], version=1, host="h", settings=settings)
    (send,) = [a for _, c, a in w.calls if c == "send_weights"]
    assert send["bucket_bytes"] == 1 << 20 and send["start_timeout_s"] == 30.0
    assert {a["timeout_s"] for _, c, a in w.calls if c == "weight_group_join"} == {30.0}
