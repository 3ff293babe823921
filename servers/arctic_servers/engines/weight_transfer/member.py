"""An engine's place in its job's weight group: the worker commands that build, use and close it.

Mixed into the trainer (rank 0, which opens the rendezvous and sends) and into the engines that
receive into a torch module (the HF and DeepSpeed log-prob scorers, `receive_into_module`). The
vLLM sampler holds its group inside vLLM's worker instead (`engines/vllm/collective.py`), where
vLLM's weight-transfer hooks run. The server drives the commands (`serving/collective_sync.py`):

    trainer    weight_group_open(group_id, host)           -> {host, port, backend}
    every rank weight_group_join(group_id, host, port, rank, world_size, backend, timeout_s)
    trainer    send_weights(group_id, version, bucket_bytes)    (beside the targets' loads)
    target     load_weights(method="collective", group_id, weight_version)
    every rank weight_group_close(group_id)

A failed or timed-out collective closes the group on the rank that saw it and answers
`unavailable` (retryable): the server rebuilds the group on the next sync.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from ..errors import WorkerError
from ..worker.commands import Command
from . import buckets
from .group import GroupError, Rendezvous, WeightGroup, device_backend

DEFAULT_JOIN_TIMEOUT_S = 120.0


def unavailable(exc: BaseException) -> WorkerError:
    return WorkerError("unavailable", str(exc), retryable=True)


class GroupMember:
    _wgroup: WeightGroup | None = None
    _wrdv: Rendezvous | None = None

    def group_commands(self) -> dict[str, Command]:
        return {
            "weight_group_open": self.op_weight_group_open,
            "weight_group_join": self.op_weight_group_join,
            "weight_group_close": self.op_weight_group_close,
        }

    def op_weight_group_open(self, group_id: str, host: str) -> dict[str, Any]:
        """Rank 0: bind the rendezvous on `host` (this node's address the others reach)."""
        self.op_weight_group_close()
        self._wrdv = Rendezvous.bind(host)
        return {"group_id": group_id, "host": host, "port": self._wrdv.port,
                "backend": device_backend()}  # fmt: skip

    def op_weight_group_join(
        self,
        group_id: str,
        host: str,
        port: int,
        rank: int,
        world_size: int,
        backend: str,
        timeout_s: float = DEFAULT_JOIN_TIMEOUT_S,
    ) -> dict[str, Any]:
        rdv, self._wrdv = self._wrdv, None
        if rank != 0:
            self.op_weight_group_close()
        elif self._wgroup is not None:
            self._wgroup.close()
            self._wgroup = None
        try:
            self._wgroup = WeightGroup.join(
                group_id, host=host, port=int(port), rank=int(rank),
                world_size=int(world_size), backend=backend, timeout_s=float(timeout_s),
                rendezvous=rdv,
            )  # fmt: skip
        except GroupError as exc:
            raise unavailable(exc) from None
        return self._wgroup.describe()

    def op_weight_group_close(self, group_id: str = "") -> dict[str, Any]:
        closed = False
        if self._wgroup is not None and (not group_id or self._wgroup.group_id == group_id):
            self._wgroup.close()
            self._wgroup, closed = None, True
        if self._wrdv is not None:
            self._wrdv.close()
            self._wrdv = None
        return {"closed": closed}

    def weight_group(self, group_id: str) -> WeightGroup:
        g = self._wgroup
        if g is None or g.closed or g.group_id != group_id:
            have = "none" if g is None else f"{g.group_id}{' (closed)' if g.closed else ''}"
            raise WorkerError(
                "unavailable",
                f"this worker is not in weight group {group_id} (it holds {have}); the server "
                "rebuilds the group on the next sync",
            )
        return g


def peak_tracker(device: torch.device) -> tuple[Any, Any]:
    """(start, read) of the extra device memory a sync takes (CUDA allocator; 0 on CPU, where
    the benchmark measures host memory from outside: bench/weight_sync.py)."""
    if device.type != "cuda":
        return (lambda: None), (lambda: 0)
    base = [0]

    def start() -> None:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base[0] = torch.cuda.memory_allocated()

    def read() -> int:
        return int(torch.cuda.max_memory_allocated() - base[0])

    return start, read


def receive_into_module(
    member: GroupMember,
    params: Mapping[str, torch.Tensor],
    group_id: str,
    version: int,
    aliases: Iterable[tuple[str, str]] = (),
) -> dict[str, Any]:
    """Receive one sync into a module's parameters by name (an HF model: the trainer's names),
    each copied in place as its bucket arrives. `aliases`: (sent name, local name) pairs for a
    tensor the module holds under another name too (tied embeddings)."""
    g = member.weight_group(group_id)
    also = dict(aliases)
    missing: list[str] = []
    start, read = peak_tracker(g.device)

    def consume(items: list[tuple[str, torch.Tensor]]) -> None:
        with torch.no_grad():
            for name, t in items:
                for n in (name, also.get(name)):
                    p = params.get(n) if n else None
                    if p is not None:
                        p.copy_(t.to(p.device))
                if name not in params:
                    missing.append(name)

    t0 = time.perf_counter()
    start()
    try:
        st = buckets.receive(g, version=version, consume=consume)
    except GroupError as exc:
        raise unavailable(exc) from None
    if missing:
        raise WorkerError(
            "internal", f"the sync sent {len(missing)} tensors this model lacks: {missing[:3]}"
        )
    return {**st.as_dict(), "peak_extra_bytes": read(), "seconds": time.perf_counter() - t0}
