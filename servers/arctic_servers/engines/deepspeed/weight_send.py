"""The trainer's side of a collective weight sync (a mixin of `TrainingEngine`): rank 0 of the
job's weight group (`engines/weight_transfer/`), it broadcasts its weights bucket by bucket.

What it sends: a full-weight trainer its parameters in HF names as they are (no copy: a bucket
of one tensor goes from the parameter itself, a bucket of several is packed into one reusable
buffer); under ZeRO-3 each bucket's parameters are gathered for that bucket only, so the trainer
never materialises the whole model (a multi-rank trainer's followers join the same per-bucket
gathers: `join_send`). A LoRA trainer whose samplers load adapters sends the adapter only, with
its `adapter_config.json` in the header; one whose adapter the samplers cannot serve (embedding,
lm_head) sends the merged full weights.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from ..weight_transfer import buckets
from ..weight_transfer.group import GroupError
from ..weight_transfer.member import GroupMember, peak_tracker, unavailable
from ..worker.commands import Command


class WeightSource:
    """The tensors one sync sends, in send order: metadata up front, then a bucket at a time."""

    def __init__(self, trainer: Any) -> None:
        self.extra: dict[str, Any] = {"kind": "full"}
        module = trainer.engine.module
        self.stage = int(trainer.stage)
        self.fixed: dict[str, torch.Tensor] | None = None
        if trainer.lora is not None:
            from .lora_trainer import adapter_config_json, adapter_tensors, merged_state_dict

            name = trainer.adapter_name  # its PEFT adapter (training_weights.py)
            if trainer.syncs_adapter():  # the adapter only (PROTOCOL.md §3.6)
                self.fixed = adapter_tensors(module, self.stage, name)
                self.extra = {
                    "kind": "adapter",
                    "adapter_config": adapter_config_json(module, name),
                }
            else:  # an adapter the samplers cannot serve: merged full weights (merge-and-push)
                self.fixed = merged_state_dict(module, self.stage, name)
        if self.fixed is not None:
            self.params: dict[str, Any] = dict(self.fixed)
            self.metas = [buckets.meta_of(n, t) for n, t in self.fixed.items()]
        else:
            self.params = dict(module.named_parameters())
            self.metas = [
                buckets.meta_of(n, p, getattr(p, "ds_shape", None) if self.stage == 3 else None)
                for n, p in self.params.items()
            ]

    @contextlib.contextmanager
    def tensors(self, names: list[str]) -> Iterator[list[torch.Tensor]]:
        """A bucket's tensors, whole while the context is open (ZeRO-3: gathered for it)."""
        ps = [self.params[n] for n in names]
        if self.stage == 3 and self.fixed is None:
            import deepspeed

            with deepspeed.zero.GatheredParameters(ps, modifier_rank=None):
                yield [p.detach() for p in ps]
        else:
            yield [p.detach() for p in ps]

    def join_gathers(self, bucket_bytes: int) -> None:
        """A follower rank (ZeRO-3): the same per-bucket gathers as rank 0, nothing sent."""
        if self.stage != 3 or self.fixed is not None:
            return
        for s, e, _ in buckets.plan_buckets(self.metas, bucket_bytes):
            with self.tensors([m.name for m in self.metas[s:e]]):
                pass


class WeightSender(GroupMember):
    engine: Any
    stage: int
    lora: dict[str, Any] | None

    def send_commands(self) -> dict[str, Command]:
        return {**self.group_commands(), "send_weights": self.op_send_weights}

    def op_send_weights(
        self,
        group_id: str,
        version: int,
        bucket_bytes: int = buckets.DEFAULT_BUCKET_BYTES,
        start_timeout_s: float = buckets.DEFAULT_START_TIMEOUT_S,
    ) -> dict[str, Any]:
        """Broadcast this trainer's weights to the group as weight version `version`."""
        g = self.weight_group(group_id)
        start, read = peak_tracker(g.device)
        start()
        src = WeightSource(self)
        try:
            st = buckets.send(
                g,
                src.metas,
                src.tensors,
                version=int(version),
                bucket_bytes=int(bucket_bytes),
                start_timeout_s=float(start_timeout_s),
                extra=src.extra,
            )
        except GroupError as exc:
            raise unavailable(exc) from None
        return {**st.as_dict(), "backend": g.backend, "peak_extra_bytes": read()}

    def rank_join_send(self, bucket_bytes: int = buckets.DEFAULT_BUCKET_BYTES) -> None:
        """A follower of a multi-rank trainer: join rank 0's per-bucket gathers (ZeRO-3)."""
        if self.stage == 3:
            WeightSource(self).join_gathers(int(bucket_bytes))
