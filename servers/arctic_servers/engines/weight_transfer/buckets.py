"""What travels over the weight group in one sync: a header, then the weights in buckets.

The trainer (rank 0) broadcasts a JSON header — the sync's weight version, every tensor's name,
shape and dtype in send order, the bucket plan, and for a LoRA job the adapter's config — then
each bucket as one flat byte tensor. A bucket holds whole decoder layers (names grouped by their
outermost index, as vLLM's `weight_transfer.base.layerwise_groups` groups them), packed up to
`bucket_bytes`; a layer larger than that goes alone. Whole layers matter on the receiving side:
vLLM's layerwise reload keeps a layer's loaded tensors until the layer is complete, so a bucket
boundary inside a layer would keep the previous bucket alive.

Memory: the sender packs into one reusable buffer of the largest bucket (a bucket of one tensor
is sent from the tensor itself, no copy); the receiver allocates each bucket as it comes, posts
the next one's receive before it loads this one (the wire and the load overlap: two buckets at
most) and drops it once loaded. Neither side ever holds a second copy of the model.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch

from .group import GroupError, WeightGroup

DEFAULT_BUCKET_BYTES = 256 << 20
# the first collective of a sync waits for every receiver to reach it (a sampler finishes the
# generates already in its batch first); the buckets that follow move at link speed
DEFAULT_START_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class TensorMeta:
    name: str
    shape: tuple[int, ...]
    dtype: str  # torch dtype name without "torch."

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * int(getattr(torch, self.dtype).itemsize)


def meta_of(name: str, t: torch.Tensor, shape: Sequence[int] | None = None) -> TensorMeta:
    """A tensor's metadata (`shape`: its full shape when `t` is a ZeRO-3 partition)."""
    return TensorMeta(name, tuple(int(s) for s in (shape or t.shape)), str(t.dtype).split(".")[-1])


def layer_key(name: str) -> str:
    """The group a tensor travels with: its name up to the outermost index (`model.layers.3`),
    or the name itself for an un-indexed one (embeddings, the final norm, lm_head)."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return name


ALIGN = 64  # each tensor starts at a multiple of this in its bucket (any dtype can view it)


def offsets(metas: Sequence[TensorMeta]) -> tuple[list[int], int]:
    """Where each tensor starts in a bucket of `metas`, and the bucket's size."""
    out, end = [], 0
    for m in metas:
        start = -(-end // ALIGN) * ALIGN
        out.append(start)
        end = start + m.nbytes
    return out, end


def plan_buckets(metas: Sequence[TensorMeta], bucket_bytes: int) -> list[tuple[int, int, int]]:
    """(start, end, nbytes) ranges of `metas`: consecutive whole layers up to `bucket_bytes`."""
    groups: list[tuple[int, int]] = []
    for i, m in enumerate(metas):
        if groups and layer_key(metas[groups[-1][0]].name) == layer_key(m.name):
            groups[-1] = (groups[-1][0], i + 1)
        else:
            groups.append((i, i + 1))
    buckets: list[tuple[int, int]] = []
    for s, e in groups:
        if buckets and offsets(metas[buckets[-1][0] : e])[1] <= bucket_bytes:
            buckets[-1] = (buckets[-1][0], e)
        else:
            buckets.append((s, e))
    return [(s, e, offsets(metas[s:e])[1]) for s, e in buckets]


# names -> a context that holds those tensors materialised (ZeRO-3: gathered) while it is open
TensorSource = Callable[[list[str]], AbstractContextManager[list[torch.Tensor]]]


@dataclass
class SyncStats:
    num_tensors: int = 0
    num_bytes: int = 0
    num_buckets: int = 0
    bucket_bytes: int = 0  # the largest bucket
    seconds: float = 0.0
    wait_seconds: float = 0.0  # for the first collective: the other ranks reaching the sync
    load_seconds: float = 0.0  # a receiver: loading what arrived (overlaps the next bucket)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def send(
    group: WeightGroup,
    metas: Sequence[TensorMeta],
    source: TensorSource,
    *,
    version: int,
    bucket_bytes: int,
    start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
    extra: dict[str, Any] | None = None,
) -> SyncStats:
    """Rank 0: the header, then every bucket (`source` materialises a bucket's tensors)."""
    t0 = time.perf_counter()
    plan = plan_buckets(metas, bucket_bytes)
    header = {
        "version": int(version),
        "tensors": [[m.name, list(m.shape), m.dtype] for m in metas],
        "buckets": [list(b) for b in plan],
        **(extra or {}),
    }
    group.send_header(header, start_timeout_s)
    st = SyncStats(len(metas), sum(m.nbytes for m in metas), len(plan))
    st.wait_seconds = time.perf_counter() - t0
    multi = [n for s, e, n in plan if e - s > 1]
    buf = torch.empty(max(multi, default=0), dtype=torch.uint8, device=group.device)
    for s, e, n in plan:
        names = [m.name for m in metas[s:e]]
        with source(names) as tensors:
            flats = [_flat(t, metas[s + i]) for i, t in enumerate(tensors)]
            if len(flats) == 1:
                out = flats[0]
            else:
                out = buf[:n]
                for f, off in zip(flats, offsets(metas[s:e])[0], strict=True):
                    out[off : off + f.numel()].copy_(f)
            group.broadcast(out)
        st.bucket_bytes = max(st.bucket_bytes, n)
    del buf
    st.seconds = time.perf_counter() - t0
    return st


def _flat(t: torch.Tensor, m: TensorMeta) -> torch.Tensor:
    if tuple(t.shape) != m.shape or str(t.dtype).split(".")[-1] != m.dtype:
        raise GroupError(
            f"{m.name}: the trainer holds {tuple(t.shape)} {t.dtype}, its header said "
            f"{m.shape} {m.dtype}"
        )
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def receive(
    group: WeightGroup,
    *,
    version: int,
    consume: Callable[[list[tuple[str, torch.Tensor]]], None],
    start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
    on_header: Callable[[dict[str, Any]], None] | None = None,
) -> SyncStats:
    """A receiving rank: the header (its version must be `version`), then each bucket, handed
    to `consume` as (name, tensor) views of that bucket's bytes."""
    t0 = time.perf_counter()
    header = group.recv_header(start_timeout_s)
    if int(header.get("version", -1)) != int(version):
        group.close()
        raise GroupError(
            f"weight group {group.group_id}: the trainer sent version {header.get('version')}, "
            f"this sync is version {version}; the group is closed"
        )
    if on_header is not None:
        on_header(header)
    metas = [TensorMeta(n, tuple(s), d) for n, s, d in header["tensors"]]
    plan = [(int(s), int(e), int(n)) for s, e, n in header["buckets"]]
    st = SyncStats(len(metas), sum(m.nbytes for m in metas), len(plan))
    st.wait_seconds = time.perf_counter() - t0

    def post(i: int) -> tuple[torch.Tensor, Any]:
        buf = torch.empty(plan[i][2], dtype=torch.uint8, device=group.device)
        return buf, group.post(buf)

    # the next bucket arrives while this one loads: at most two buckets held, and the wire
    # never waits for the load (nor the load for the wire, when the load is the slower)
    nxt = post(0) if plan else None
    for i, (s, e, n) in enumerate(plan):
        assert nxt is not None
        buf, work = nxt
        group.wait(work)
        nxt = post(i + 1) if i + 1 < len(plan) else None
        t1 = time.perf_counter()
        consume(list(unpack(buf, metas[s:e])))
        st.load_seconds += time.perf_counter() - t1
        st.bucket_bytes = max(st.bucket_bytes, n)
        del buf
    st.seconds = time.perf_counter() - t0
    return st


def unpack(buf: torch.Tensor, metas: Sequence[TensorMeta]) -> Iterator[tuple[str, torch.Tensor]]:
    for m, off in zip(metas, offsets(metas)[0], strict=True):
        yield m.name, buf[off : off + m.nbytes].view(getattr(torch, m.dtype)).view(m.shape)
