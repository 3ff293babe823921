"""The collective sync as the on-prem server and the gateway run it, and how a sync's method is
picked (the methods' names, timeouts and a file sync's result: `rules/weight_sync.py`).

Methods (`SyncWeightsRequest.method`; PROTOCOL.md §3.4):

- `collective`: the trainer broadcasts its weights, in buckets, over a torch.distributed group
  of the job's trainer (rank 0) and its targets — gloo on CPU, NCCL on CUDA, one code path
  (`engines/weight_transfer/`); the servers only coordinate (the rendezvous address, the
  version, which workers), no weight byte passes through them. `nccl` names the same path and
  insists on NCCL (a CUDA trainer).
- `shm`: one safetensors file under /dev/shm that every target reads (trainer and targets on
  one host).
- `safetensors`: the trainer's bytes, forwarded by the server to each target (anywhere; the
  weights pass through the server: a portable fallback).
- `cuda_ipc`: CUDA IPC handles of the trainer's weights (one GPU host; `weight_sync.py`).

`auto` picks, for workers on one host, the one measured fastest there (`AUTO_SAME_HOST`:
bench/weight_sync.py), and `collective` for workers on several hosts. Workers that share one GPU
(the on-prem server's, and a gateway's local ones: nothing assigns them devices) cannot form an
NCCL group — NCCL refuses two ranks on one device — so there `auto` is `cuda_ipc`; a gateway over
Ray gives each actor its own GPUs, so its workers on one node sync over the group.

`CollectiveSync` is one job's weight group as a server sees it: it is built at the job's first
collective sync (the trainer binds a rendezvous on its node, then every member joins) and kept
for the syncs after it; a change of members (other targets, a worker restarted) rebuilds it. Any
failure closes it everywhere and fails the sync with `unavailable` (retryable): the next sync
builds a new group. Every collective has a timeout, so a member that dies or stalls fails the
sync rather than hanging it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..rules.errors import ProtocolError
from ..rules.weight_sync import (
    AUTO_SAME_HOST,
    DEFAULT_BUCKET_BYTES,
    GRACE_S,
    GROUP_METHODS,
    JOIN_TIMEOUT_S,
    START_TIMEOUT_S,
    SYNC_METHODS,
)


@dataclass(frozen=True)
class SyncSettings:
    """A server's collective-sync settings (`--weight-sync-bucket-mib`, `--weight-sync-timeout`)."""

    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    # the first collective of a sync waits this long for every target to reach it (a sampler
    # finishes the generates in its batch first); the group's other collectives and its joins
    # take at most JOIN_TIMEOUT_S each, or this when it is shorter
    start_timeout_s: float = START_TIMEOUT_S

    @property
    def join_timeout_s(self) -> float:
        return min(JOIN_TIMEOUT_S, self.start_timeout_s)


def add_sync_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--weight-sync-bucket-mib",
        type=int,
        default=DEFAULT_BUCKET_BYTES >> 20,
        help="collective weight sync: the bucket size bound (a layer larger than it goes alone)",
    )
    p.add_argument(
        "--weight-sync-timeout",
        type=float,
        default=START_TIMEOUT_S,
        help="collective weight sync: seconds the trainer waits for every target to reach it",
    )


def sync_settings_from_args(args: argparse.Namespace) -> SyncSettings:
    if args.weight_sync_bucket_mib < 1 or args.weight_sync_timeout <= 0:
        raise SystemExit("--weight-sync-bucket-mib must be >= 1 and --weight-sync-timeout > 0")
    return SyncSettings(args.weight_sync_bucket_mib << 20, float(args.weight_sync_timeout))


@dataclass(frozen=True)
class Placement:
    """Where a sync's workers are, as its server knows it."""

    cuda: bool  # the trainer has a GPU
    same_host: bool  # the trainer and every target on one host
    shm: bool  # /dev/shm exists (on that host)
    collective: bool = True  # the workers' engines take the collective path (not the fake's)
    shared_gpu: bool = True  # on CUDA: the workers share one device (nothing assigned theirs)


def pick_method(requested: str | None, where: Placement, *, cuda_ipc: bool | None = None) -> str:
    """The method a sync runs with; ValueError (naming why) for one these workers cannot run."""
    m = (requested or "auto").lower()
    if m == "auto":
        if cuda_ipc and where.cuda and where.same_host:
            return "cuda_ipc"
        if where.same_host:
            kind = "cpu" if not where.cuda else "shared_gpu" if where.shared_gpu else "cuda"
            m = AUTO_SAME_HOST[kind]
            if m == "shm" and not where.shm:
                m = "collective"
        else:
            m = "collective"
        if m == "collective" and not where.collective:
            m = "shm" if where.same_host and where.shm else "safetensors"
        return m
    if m not in SYNC_METHODS:
        raise ValueError(f"method {m!r} is not one of {list(SYNC_METHODS)}")
    if m in ("nccl", "cuda_ipc") and not where.cuda:
        raise ValueError(
            f"method {m!r} needs CUDA; this job's trainer runs on CPU (use collective, which "
            "runs on gloo there, shm or safetensors)"
        )
    if m in GROUP_METHODS and not where.collective:
        raise ValueError(f"method {m!r}: these workers do not take weights over a process group")
    if m == "nccl" and where.same_host and where.shared_gpu:
        raise ValueError(
            "method 'nccl': the trainer and its targets share one GPU here, and NCCL takes one "
            "device per rank (use cuda_ipc)"
        )
    if m in ("shm", "cuda_ipc") and not where.same_host:
        raise ValueError(
            f"method {m!r} needs the trainer and its targets on one host; they are not "
            "(use collective)"
        )
    if m == "shm" and not where.shm:
        raise ValueError("method 'shm' needs /dev/shm, which this host lacks (use collective)")
    return m


Call = Callable[..., Awaitable[Any]]  # call(sub, command, **args) -> the worker's answer


@dataclass(frozen=True)
class Member:
    sub: Any
    key: Hashable  # the worker's identity: a restarted worker is another member
    ranks: int = 1  # processes it joins with (a tensor-parallel sampler: one per worker)


def member_ranks(info: Mapping[str, Any]) -> int:
    """The processes a worker joins a weight group with (its engine's `weight_ranks`)."""
    return max(1, int(info.get("weight_ranks") or 1))


class CollectiveSync:
    """One job's weight group (see the module docstring)."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.group_id = ""
        self.keys: tuple[Hashable, ...] = ()
        self.backend = ""
        self.builds = 0

    async def run(
        self,
        call: Call,
        src: Member,
        targets: Sequence[Member],
        *,
        version: int,
        host: str,
        method: str = "collective",
        settings: SyncSettings = SyncSettings(),
        name: str = "",
    ) -> dict[str, Any]:
        """One sync of `version` from `src` into `targets`; the sync result's fields.
        `host`: the trainer's address the targets reach; `name`: a stable id for this sync
        (a request id: a sync collected after a gateway restart builds the same group)."""
        t0 = time.perf_counter()
        setup = 0.0
        keys = (src.key, *(t.key for t in targets))
        if not self.group_id or keys != self.keys:
            await self.close(call, [src, *targets])
            setup = await self._build(call, src, targets, host, method, settings, name)
            self.keys = keys
        args = {"group_id": self.group_id, "start_timeout_s": settings.start_timeout_s}
        bucket = settings.bucket_bytes
        try:
            sent, *loaded = await _all(
                call(src.sub, "send_weights", version=version, bucket_bytes=bucket, **args),
                *(
                    call(t.sub, "load_weights", method="collective", weight_version=version, **args)
                    for t in targets
                ),
                what="weight sync",
            )
        except ProtocolError:
            await self.close(call, [src, *targets])
            raise
        return {
            "method": "collective",
            "backend": self.backend,
            "num_tensors": int(sent.get("num_tensors", 0)),
            "num_bytes": int(sent.get("num_bytes", 0)),
            "num_buckets": int(sent.get("num_buckets", 0)),
            "bucket_bytes": int(sent.get("bucket_bytes", 0)),
            "setup_seconds": setup,
            "seconds": time.perf_counter() - t0,
            "source_peak_bytes": int(sent.get("peak_extra_bytes", 0)),
            "target_peak_bytes": max(
                (int(r.get("peak_extra_bytes", 0)) for r in loaded), default=0
            ),
            "load_seconds": max((float(r.get("load_seconds", 0.0)) for r in loaded), default=0.0),
        }

    async def _build(
        self,
        call: Call,
        src: Member,
        targets: Sequence[Member],
        host: str,
        method: str,
        settings: SyncSettings,
        name: str,
    ) -> float:
        t0 = time.perf_counter()
        self.builds += 1
        gid = f"{self.job_id}-{(name or uuid.uuid4().hex)[:12]}-{self.builds}"
        opened = dict(await call(src.sub, "weight_group_open", group_id=gid, host=host))
        backend = str(opened.get("backend") or "gloo")
        if method == "nccl" and backend != "nccl":
            raise ProtocolError(
                "unsupported_option",
                f"method 'nccl': the trainer has no CUDA device (its weights travel on {backend})",
                options=["method"],
                field="method",
            )
        world = 1 + sum(t.ranks for t in targets)
        common = {
            "group_id": gid,
            "host": host,
            "port": int(opened["port"]),
            "world_size": world,
            "backend": backend,
            "timeout_s": settings.join_timeout_s,
        }
        joins, rank = [call(src.sub, "weight_group_join", rank=0, **common)], 1
        for t in targets:
            joins.append(call(t.sub, "weight_group_join", rank=rank, **common))
            rank += t.ranks
        self.group_id, self.backend = gid, backend
        try:
            await _all(*joins, what=f"building weight group {gid}")
        except ProtocolError:
            await self.close(call, [src, *targets])
            raise
        return time.perf_counter() - t0

    async def close(self, call: Call, members: Sequence[Member]) -> None:
        """Close the group on every member that answers (best effort) and forget it."""
        gid, self.group_id, self.keys = self.group_id, "", ()
        if not gid:
            return
        with contextlib.suppress(Exception):
            await asyncio.wait_for(
                asyncio.gather(
                    *(call(m.sub, "weight_group_close", group_id=gid) for m in members),
                    return_exceptions=True,
                ),
                GRACE_S,
            )


async def _all(*calls: Awaitable[Any], what: str) -> list[Any]:
    """Every call's answer. When one fails, the others get `GRACE_S` to end (their collectives
    fail fast once a peer has closed the group); those still running then are cancelled, and
    the most telling error is raised (a member that died before those that saw it go)."""
    tasks = [asyncio.ensure_future(c) for c in calls]
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    if pending and any(t.exception() is not None for t in done):
        _, pending = await asyncio.wait(pending, timeout=GRACE_S)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    errors = [t.exception() for t in tasks if not t.cancelled() and t.exception() is not None]
    if not errors:
        return [dict(t.result()) for t in tasks]
    for e in errors:
        if not isinstance(e, ProtocolError):
            raise e  # type: ignore[misc]
    perr = [e for e in errors if isinstance(e, ProtocolError)]
    first = sorted(perr, key=lambda e: 0 if e.code == "sub_job_failed" else 1)[0]
    if first.code in ("sub_job_failed", "unsupported_option"):
        raise first
    stalled = (
        f"; {len(pending)} member(s) had not finished {GRACE_S:.0f} s later" if pending else ""
    )
    raise ProtocolError(
        "unavailable",
        f"{what} failed: {first.message}{stalled}; the weight group is closed and the next "
        "sync builds a new one",
        reason=first.message,
    )
