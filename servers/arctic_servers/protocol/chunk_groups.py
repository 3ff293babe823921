"""Request chunk groups on the server (PROTOCOL.md §3.5): accept, reassemble, replay, refuse.

Each chunk frame goes through `ChunkGroups.accept`, which keeps one `dssst1.ChunkAssembler` per
open group (rebuilt from the chunk store after a restart when the store is durable) and records
group state in the store before the chunk is acknowledged.

Memory is what arrived, never what a descriptor declares (the assembler grows as chunks come),
and it is budgeted (`ChunkBudget`, advertised in the capabilities): the bytes incomplete groups
hold per job and over the server. A chunk past either budget is refused with 429 `rate_limited`
(retryable; nothing is kept), unless it completes its group, which frees the group's bytes; a
group that declares a frame larger than the per-job budget could never complete and is
`frame_too_large` at once. A group that receives no chunk for `ttl_seconds` is dropped; a later
chunk of it is `chunk_group_restart_required`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dssst1
from arctic_sdk.spec.model import MethodInfo
from arctic_sdk.spec.tables import methods as M

from ..rules.errors import ProtocolError
from . import faultpoints
from .stores import ChunkStore, GroupRecord

# Bytes an open group costs beyond its chunks (assembler, records), for the budget.
GROUP_OVERHEAD = 1024
CHUNK_OVERHEAD = 64
# Codec failures that mean "same group id, different content" to a server.
_CONFLICT_CODES = frozenset({"chunk_duplicate_conflict", "chunk_inconsistent"})


@dataclass
class ChunkStep:
    """What one accepted chunk led to: exactly one field is set."""

    cached: dict[str, Any] | None = None  # an intermediate chunk: answer chunk_cached
    replay_group: str | None = None  # a completed group replayed: answer its request
    frame: bytes | memoryview | None = None  # the whole frame, ready to execute
    group_id: str = ""
    frame_sha256: str = ""


@dataclass(frozen=True)
class ChunkBudget:
    """What incomplete request chunk groups may hold (`ProtocolLimits`)."""

    per_job_bytes: int = 4 << 30
    server_bytes: int = 8 << 30
    ttl_seconds: float = 3600.0


def _codec_error(exc: dssst1.DSSError, group_id: str) -> ProtocolError:
    if exc.code in _CONFLICT_CODES:
        return ProtocolError(
            "chunk_group_conflict",
            f"chunk group {group_id!r} was used with different content: {exc}",
            chunk_group_id=group_id,
            reason=exc.code,
        )
    return ProtocolError(exc.code, str(exc), field=exc.path or "body", chunk_group_id=group_id)


def _op_name(label: object) -> str | None:
    if not isinstance(label, str):
        return None
    method = M.BY_NAME.get(label) or M.BY_ALIAS.get(label)
    return method.name if method is not None else None


class ChunkGroups:
    def __init__(
        self,
        store: ChunkStore,
        limits: dssst1.Limits,
        budget: ChunkBudget | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.limits = limits
        self.budget = budget or ChunkBudget()
        self._clock = clock
        self._assemblers: dict[tuple[str, str], dssst1.ChunkAssembler] = {}
        self._touched: dict[tuple[str, str], float] = {}  # last chunk of each open group
        self._cost: dict[tuple[str, str], int] = {}  # bytes each open group holds
        self._job_bytes: dict[str, int] = {}
        self._total = 0

    # ------------------------------------------------------------------ memory

    def held_bytes(self, job_id: str | None = None) -> int:
        """Bytes incomplete groups hold now (of one job, or of the whole server): their chunks'
        payloads, plus their bookkeeping (`GROUP_OVERHEAD`, `CHUNK_OVERHEAD` a received chunk)."""
        return self._total if job_id is None else self._job_bytes.get(job_id, 0)

    def max_job_bytes(self) -> int:
        """The most bytes one job's incomplete groups hold now (metrics: against its budget)."""
        return max(self._job_bytes.values(), default=0)

    def open_groups(self) -> int:
        """Incomplete groups held now."""
        return len(self._assemblers)

    def _set_cost(self, key: tuple[str, str], asm: dssst1.ChunkAssembler | None) -> None:
        new = 0
        if asm is not None:
            new = asm.buffered_bytes + GROUP_OVERHEAD + CHUNK_OVERHEAD * asm.received
        old = self._cost.pop(key, 0)
        if asm is not None:
            self._cost[key] = new
        self._total += new - old
        left = self._job_bytes.get(key[0], 0) + new - old
        if left:
            self._job_bytes[key[0]] = left
        else:
            self._job_bytes.pop(key[0], None)

    def _drop(self, key: tuple[str, str]) -> None:
        self._assemblers.pop(key, None)
        self._touched.pop(key, None)
        self._set_cost(key, None)

    def expire(self, now: float | None = None) -> int:
        """Drop the incomplete groups idle longer than the budget's TTL; how many."""
        now = self._clock() if now is None else now
        old = [k for k, t in self._touched.items() if now - t > self.budget.ttl_seconds]
        for job_id, gid in old:
            self.reset(job_id, gid)
        return len(old)

    def _check_budget(self, key: tuple[str, str], asm: dssst1.ChunkAssembler, n: int) -> None:
        """Refuse a chunk of `n` bytes that would take the job or the server past its budget;
        the chunk that completes its group always passes (it frees the group's bytes)."""
        b = self.budget
        desc = asm.descriptor
        if desc is not None and asm.received == desc.total_chunks - 1:
            return
        for scope, held, limit, name in (
            ("job", self.held_bytes(key[0]), b.per_job_bytes, "max_open_chunk_bytes_per_job"),
            ("server", self.held_bytes(), b.server_bytes, "max_open_chunk_bytes"),
        ):
            if held + n > limit:
                raise ProtocolError(
                    "rate_limited",
                    f"incomplete chunk groups of this {scope} hold {held} bytes; this chunk of "
                    f"{n} bytes would pass the {scope}'s budget of {limit} bytes ({name}); "
                    "retry it once other groups complete or expire",
                    chunk_group_id=key[1],
                    budget=name,
                    limit=limit,
                    held_bytes=held,
                    retry_after_s=1,
                )

    # ------------------------------------------------------------------ chunks

    def adopt(self, job_id: str, group: GroupRecord, assembler: dssst1.ChunkAssembler) -> None:
        """Take a group that another path started, with its assembler: the fake gateway's
        `restart_not_required` fault starts a group at whatever chunk comes first (a declared
        entry point, so fault injection touches no private state)."""
        self._assemblers[(job_id, group.group_id)] = assembler
        self.store.put_group(group)

    def accept(self, job_id: str, method: MethodInfo, frame: bytes | memoryview) -> ChunkStep:
        self.expire()
        try:
            meta = dssst1.read_metadata(frame, limits=self.limits)
        except dssst1.DSSError as exc:
            raise ProtocolError(exc.code, str(exc), field=exc.path or "body") from None
        desc = meta.get("request_chunk")
        if desc is None:
            if "result_chunk" in meta:
                raise ProtocolError(
                    "chunk_kind_mismatch",
                    "a result chunk was sent as a request body",
                    field="op.result_chunk",
                )
            return ChunkStep(frame=frame)  # a plain frame: no chunk group, no replay identity
        if not isinstance(desc, dict):
            raise ProtocolError(
                "chunk_descriptor_invalid",
                "request_chunk is not an object",
                field="op.request_chunk",
            )
        sha = desc.get("frame_sha256")
        gid = desc.get("chunk_group_id") or (f"sha256:{sha}" if isinstance(sha, str) else None)
        if not isinstance(gid, str) or not gid:
            raise ProtocolError(
                "chunk_descriptor_invalid",
                "request_chunk has no chunk_group_id or frame_sha256",
                field="op.request_chunk.chunk_group_id",
            )
        label = desc.get("operation")
        if label is not None and _op_name(label) != method.name:
            raise ProtocolError(
                "invalid_argument",
                f"request_chunk.operation {label!r} does not match the route's op {method.name!r}",
                field="op.request_chunk.operation",
                expected=method.name,
            )
        idx = desc.get("chunk_idx")
        if not isinstance(idx, int) or isinstance(idx, bool) or idx < 0:
            raise ProtocolError(
                "chunk_descriptor_invalid",
                f"request_chunk.chunk_idx {idx!r} is not an integer >= 0",
                field="op.request_chunk.chunk_idx",
            )
        total = desc.get("total_chunks")
        if isinstance(total, int) and not isinstance(total, bool) and idx >= total >= 1:
            # decided before the group lookup: an out-of-range index is a bad descriptor (400),
            # never a group to restart (409), whichever group it names (DSSST1.md §8)
            raise ProtocolError(
                "chunk_descriptor_invalid",
                f"request_chunk.chunk_idx {idx} is outside [0, total_chunks={total})",
                field="op.request_chunk.chunk_idx",
                expected=f"0 <= chunk_idx < {total}",
            )
        size = desc.get("frame_size_bytes")
        cap = min(self.budget.per_job_bytes, self.budget.server_bytes)
        if isinstance(size, int) and size > cap:
            raise ProtocolError(
                "frame_too_large",
                f"chunk group {gid!r} declares a frame of {size} bytes, more than the "
                f"{cap} bytes open chunk groups may hold (max_open_chunk_bytes_per_job, "
                "max_open_chunk_bytes; the advertised max_frame_bytes); it could never complete",
                field="op.request_chunk.frame_size_bytes",
                chunk_group_id=gid,
                limit=cap,
            )
        group = self.store.get_group(job_id, gid)
        key = (job_id, gid)
        if group is not None and group.complete:
            if (sha, desc.get("total_chunks")) == (group.frame_sha256, group.total_chunks):
                return ChunkStep(replay_group=gid)
            raise ProtocolError(
                "chunk_group_conflict",
                f"chunk group {gid!r} completed with another frame (sha256 "
                f"{group.frame_sha256[:12]}..., {group.total_chunks} chunks)",
                chunk_group_id=gid,
            )
        asm = self._assemblers.get(key)
        if group is None or asm is None:
            if group is None and idx != 0:
                raise self._restart(gid, idx)
            asm = dssst1.ChunkAssembler(kind="request", limits=self.limits)
            if group is not None:  # known group, assembler lost (restart): reload its chunks
                stored = self.store.load_chunks(job_id, gid) if self.store.durable else []
                if not stored:
                    self.store.drop_chunks(job_id, gid)
                    if idx != 0:
                        raise self._restart(gid, idx)
                    group = None
                for old in stored:
                    asm.feed(old)
            self._assemblers[key] = asm
        try:
            self._check_budget(key, asm, len(frame) + (0 if asm.descriptor else GROUP_OVERHEAD))
            whole = asm.feed(frame)
        except (dssst1.DSSError, ProtocolError) as exc:
            if group is None:
                self._drop(key)
            if isinstance(exc, ProtocolError):
                raise
            raise _codec_error(exc, gid) from None
        self._touched[key] = self._clock()
        self._set_cost(key, asm)
        if group is None:
            group = GroupRecord(
                job_id=job_id,
                group_id=gid,
                frame_sha256=str(sha),
                total_chunks=int(desc.get("total_chunks", 0)),
                frame_size_bytes=int(desc.get("frame_size_bytes", 0)),
                operation=str(label or method.name),
            )
        faultpoints.hit("chunk_accepted")
        if self.store.durable and whole is None:
            self.store.save_chunk(job_id, gid, int(idx), bytes(frame))
        group.received.add(int(idx))
        if whole is None:
            self.store.put_group(group)
            return ChunkStep(
                cached={
                    "chunk_cached": True,
                    "chunk_group_id": gid,
                    "chunk_idx": int(idx),
                    "chunks_received": len(group.received),
                    "total_chunks": group.total_chunks,
                }
            )
        group.complete = True
        self.store.put_group(group)
        self.store.drop_chunks(job_id, gid)
        self._drop(key)
        return ChunkStep(frame=whole, group_id=gid, frame_sha256=group.frame_sha256)

    def reset(self, job_id: str, group_id: str) -> None:
        """Forget a group's progress (it completed, but its request was never recorded because
        the server stopped in between): a replay from chunk 0 is then accepted as new."""
        group = self.store.get_group(job_id, group_id)
        if group is not None:
            group.received, group.complete, group.request_id = set(), False, ""
            self.store.put_group(group)
        self.store.drop_chunks(job_id, group_id)
        self._drop((job_id, group_id))

    def bind_request(self, job_id: str, group_id: str, request_id: str) -> None:
        group = self.store.get_group(job_id, group_id)
        if group is not None:
            group.request_id = request_id
            self.store.put_group(group)

    @staticmethod
    def _restart(gid: str, idx: object) -> ProtocolError:
        return ProtocolError(
            "chunk_group_restart_required",
            f"chunk group {gid!r} is unknown here; replay it from chunk 0 (received chunk {idx})",
            chunk_group_id=gid,
            received_chunk=idx,
            expected_start_chunk=0,
        )

    def forget_job(self, job_id: str) -> None:
        for key in [k for k in self._assemblers if k[0] == job_id]:
            self._drop(key)
        self.store.delete_job(job_id)
