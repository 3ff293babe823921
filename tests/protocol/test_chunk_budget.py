"""Chunk-group memory is what arrived, within budgets, for a limited time (issue 14 §2).

A chunk 0 that declares a 256 MiB frame used to allocate 256 MiB at once and keep it until the
job ended; now the assembler holds what arrived, the groups of a job and of the server are
budgeted (429 `rate_limited` past it, the completing chunk always passes), a declared frame over
the per-job budget is `frame_too_large`, and an idle group is dropped after its TTL.
"""

from __future__ import annotations

import json
import tracemalloc
import uuid

import numpy as np
import pytest

import dssst1
from arctic_sdk.spec.tables import methods as M
from arctic_servers.protocol.chunk_groups import (
    CHUNK_OVERHEAD,
    GROUP_OVERHEAD,
    ChunkBudget,
    ChunkGroups,
)
from arctic_servers.protocol.stores import MemoryChunkStore
from arctic_servers.rules.errors import ProtocolError

KiB, MiB = 1 << 10, 1 << 20


def chunk0(payload: int, frame: int, total: int, gid: str | None = None) -> bytes:
    desc = {
        "request_chunk": {
            "chunk_group_id": gid or str(uuid.uuid4()),
            "chunk_idx": 0,
            "total_chunks": total,
            "frame_size_bytes": frame,
            "frame_sha256": "0" * 64,
            "operation": "forward-backward",
        }
    }
    return bytes(dssst1.dumps({"payload": np.zeros(payload, np.uint8)}, metadata=desc))


def test_assembler_holds_what_arrived() -> None:
    """Declared 256 MiB, sent 64 KiB: well under 1 MiB allocated (was 256 MiB)."""
    frame = chunk0(64 * KiB, 256 * MiB, 4096)
    tracemalloc.start()
    asm = dssst1.ChunkAssembler(kind="request")
    asm.feed(frame)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert asm.buffered_bytes == 64 * KiB
    assert peak < 1 * MiB, peak


def test_assembler_out_of_order_and_duplicates() -> None:
    data = bytes(range(256)) * 40
    chunks = dssst1.encode_chunks(data, kind="request", max_bytes=1200, operation="step")
    assert len(chunks) > 4
    asm = dssst1.ChunkAssembler(kind="request")
    order = [0, 3, 2, 3, len(chunks) - 1, *range(1, len(chunks) - 1)]
    out = None
    for i in order:
        res = asm.feed(chunks[i])
        out = res if res is not None else out
    assert out is not None and bytes(out) == data


def groups(**budget: float) -> ChunkGroups:
    clock = [0.0]
    g = ChunkGroups(MemoryChunkStore(), dssst1.Limits(), ChunkBudget(**budget),  # type: ignore[arg-type]
                    clock=lambda: clock[0])  # fmt: skip
    g.clock = clock  # type: ignore[attr-defined]
    return g


def test_a_burst_stays_within_the_bound() -> None:
    """100 chunk 0s of 64 KiB declaring 256 MiB each: the server holds 100 x (64 KiB + its
    bookkeeping), not 25 GiB."""
    g = groups(per_job_bytes=1 << 40, server_bytes=1 << 40)
    for _ in range(100):
        g.accept("job", M.FORWARD_BACKWARD, chunk0(64 * KiB, 256 * MiB, 4096))
    assert g.held_bytes() <= 100 * (64 * KiB + CHUNK_OVERHEAD + GROUP_OVERHEAD)
    assert g.held_bytes("job") == g.held_bytes()


def test_budgets_refuse_retryably() -> None:
    g = groups(per_job_bytes=1 * MiB, server_bytes=2 * MiB)
    for _ in range(3):
        g.accept("a", M.FORWARD_BACKWARD, chunk0(300 * KiB, 900 * KiB, 3))
    with pytest.raises(ProtocolError) as info:
        g.accept("a", M.FORWARD_BACKWARD, chunk0(300 * KiB, 900 * KiB, 3))
    assert info.value.code == "rate_limited"
    assert info.value.details["budget"] == "max_open_chunk_bytes_per_job"
    assert g.held_bytes("a") <= 1 * MiB
    for _ in range(3):
        g.accept("b", M.FORWARD_BACKWARD, chunk0(300 * KiB, 900 * KiB, 3))
    with pytest.raises(ProtocolError) as info:
        g.accept("c", M.FORWARD_BACKWARD, chunk0(300 * KiB, 900 * KiB, 3))
    assert info.value.details["budget"] == "max_open_chunk_bytes"
    assert g.held_bytes() <= 2 * MiB


def test_completing_chunk_passes_and_frees() -> None:
    g = groups(per_job_bytes=100 * KiB, server_bytes=1 * MiB)
    value = {"learning_rate": 0.5, "pad": "x" * 70_000}
    frame = dssst1.dumps(value)
    x, y = (
        dssst1.encode_chunks(frame, kind="request", max_bytes=40_000, operation="step")
        for _ in range(2)
    )
    assert len(x) == 2
    assert g.accept("j", M.STEP, x[0]).cached is not None
    assert g.accept("j", M.STEP, y[0]).cached is not None
    with pytest.raises(ProtocolError) as info:  # a third group's chunk 0 is past the budget
        g.accept("j", M.FORWARD_BACKWARD, chunk0(30_000, 60_000, 2))
    assert info.value.code == "rate_limited"
    step = g.accept("j", M.STEP, x[1])  # past the budget too, but it completes its group
    assert step.frame is not None and dssst1.loads(step.frame) == value
    assert 0 < g.held_bytes() < 50 * KiB  # only y is left


def test_declared_frame_over_the_job_budget() -> None:
    g = groups(per_job_bytes=1 * MiB)
    with pytest.raises(ProtocolError) as info:
        g.accept("j", M.FORWARD_BACKWARD, chunk0(KiB, 1 * MiB + 1, 2))
    assert info.value.code == "frame_too_large"
    assert g.held_bytes() == 0


def test_idle_groups_expire() -> None:
    g = groups(ttl_seconds=60)
    gid = str(uuid.uuid4())
    frame = dssst1.dumps({"learning_rate": 0.5, "pad": "x" * 70_000})
    chunks = dssst1.encode_chunks(frame, kind="request", max_bytes=40_000, operation="step",
                                  chunk_group_id=gid)  # fmt: skip
    g.accept("j", M.STEP, chunks[0])
    assert g.held_bytes() > 0
    g.clock[0] = 61.0  # type: ignore[attr-defined]
    assert g.expire() == 1 and g.held_bytes() == 0
    with pytest.raises(ProtocolError) as info:
        g.accept("j", M.STEP, chunks[1])
    assert info.value.code == "chunk_group_restart_required"
    json.dumps(info.value.body())
