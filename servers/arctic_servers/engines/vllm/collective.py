"""The sampler's side of a collective weight sync: a vLLM weight transfer engine.

vLLM 0.32 receives a trainer's weights through its weight-transfer hooks: the engine is started
with `weight_transfer_config={"backend": NAME}`, every worker builds that backend's
`WeightTransferEngine` (`vllm.distributed.weight_transfer`), and the trainer's side drives it
through the worker methods `init_weight_transfer_engine`, `start_weight_update`,
`update_weights` and `finish_weight_update` (`collective_rpc`; vLLM's own NCCL engine is driven
the same way). vLLM's NCCL backend speaks NCCL only; this one (`ArcticWeightTransferEngine`,
registered with vLLM's factory as `arctic`) joins the job's weight group
(`engines/weight_transfer/group.py`: gloo on CPU, NCCL on CUDA) and receives the trainer's
buckets (`buckets.py`), each loaded at once through `model.load_weights` inside vLLM's layerwise
reload (`start_weight_update` / `finish_weight_update`), which restores the checkpoint-format
parameters and re-runs each layer's post-load processing (on CPU the oneDNN repacking:
`engines/vllm_worker_ext.py`). The engine lives in vLLM's worker process, so the same path
works when vLLM runs its workers in processes of their own (CUDA).

A LoRA job's sampler joins in `adapter` mode and receives through `receive_adapter` (the worker
extension's `arctic_receive_adapter`), outside vLLM's update bracket, whose end drops every
loaded adapter (`reset_lora_state`): the adapter's tensors (a few MiB) are written as a
safetensors file where the sampler asked (`update_info.adapter_path`), which `lora_sampler.py`
then registers as the adapter's next version.

A sync that fails part way leaves the layers it had finished with the new weights: the reload
bracket is closed (vLLM puts the old tensors back into the layers that got nothing) and the
error goes to the sampler, which refuses generates until a sync succeeds (`sampling.py`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol, cast

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from ..weight_transfer import buckets
from ..weight_transfer.group import GroupError, WeightGroup

BACKEND = "arctic"


class _LoadsWeights(Protocol):
    """A vLLM model class's `load_weights` (every one defines it: vLLM's loaders call it); vLLM
    types the engine's `model` as a plain `torch.nn.Module`."""

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> object: ...


@dataclass
class ArcticInitInfo(WeightTransferInitInfo):
    group_id: str
    host: str
    port: int
    rank_offset: int  # this sampler's first rank in the group (its workers follow)
    world_size: int
    backend: str = "gloo"
    timeout_s: float = 120.0
    mode: str = "full"  # "full": weights into the model; "adapter": a LoRA adapter to a file


@dataclass
class ArcticUpdateInfo(WeightTransferUpdateInfo):
    version: int
    group_id: str = ""  # the group the server means: another one fails the receive
    start_timeout_s: float = buckets.DEFAULT_START_TIMEOUT_S
    adapter_path: str = ""  # adapter mode: where the received adapter is written


class ArcticWeightTransferEngine(WeightTransferEngine[ArcticInitInfo, ArcticUpdateInfo]):
    init_info_cls = ArcticInitInfo
    update_info_cls = ArcticUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.group: WeightGroup | None = None
        self.mode = "full"
        self.reloading = False
        self.last: dict[str, Any] = {}

    def init_transfer_engine(self, init_info: ArcticInitInfo) -> None:
        self.shutdown()
        rank = init_info.rank_offset + int(self.parallel_config.rank)
        self.mode = init_info.mode
        self.group = WeightGroup.join(
            init_info.group_id, host=init_info.host, port=int(init_info.port), rank=rank,
            world_size=int(init_info.world_size), backend=init_info.backend,
            timeout_s=float(init_info.timeout_s),
        )  # fmt: skip
        self.last = {"joined": self.group.describe()}

    def start_weight_update(self) -> None:
        if self.mode == "full":
            from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

            initialize_layerwise_reload(self.model)
            self.reloading = True

    def finish_weight_update(self) -> None:
        if self.reloading:
            # vLLM's finalize_layerwise_reload(*args, **kwargs) only forwards to this one, which
            # is annotated
            from vllm.model_executor.model_loader.reload import finalize_layerwise_processing

            self.reloading = False
            t0 = time.perf_counter()
            finalize_layerwise_processing(self.model, self.model_config)
            # the layers processed at the end (attention, a tied head) are part of the load
            self.last["load_seconds"] = self.last.get("load_seconds", 0.0) + (
                time.perf_counter() - t0
            )

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # the base class ends with torch.accelerator.synchronize(), which a CPU build lacks;
        # the group's broadcasts have finished when receive_weights returns
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: ArcticUpdateInfo) -> None:
        group = self._group(update_info.group_id)
        if self.mode == "adapter":
            raise GroupError("a LoRA sampler receives its adapter through receive_adapter")
        loaded = [0]

        def consume(items: list[tuple[str, torch.Tensor]]) -> None:
            cast(_LoadsWeights, self.model).load_weights(items)
            loaded[0] += 1

        try:
            st = buckets.receive(
                group, version=update_info.version, consume=consume,
                start_timeout_s=update_info.start_timeout_s,
            )  # fmt: skip
        except BaseException as exc:
            self.last = {"failed": str(exc), "buckets_loaded": loaded[0]}
            self.finish_weight_update()  # the model whole again (see the module docstring)
            raise
        self.last = st.as_dict()

    def _group(self, group_id: str) -> WeightGroup:
        g = self.group
        if g is None or g.closed or (group_id and g.group_id != group_id):
            have = "none" if g is None else f"{g.group_id}{' (closed)' if g.closed else ''}"
            raise GroupError(f"this sampler is not in weight group {group_id} (it holds {have})")
        return g

    def receive_adapter(self, info: ArcticUpdateInfo) -> dict[str, Any]:
        """A LoRA sampler's sync: the adapter's tensors into `info.adapter_path`."""
        from safetensors.torch import save_file

        group = self._group(info.group_id)
        got: dict[str, torch.Tensor] = {}
        header: dict[str, Any] = {}

        def consume(items: list[tuple[str, torch.Tensor]]) -> None:
            got.update((n, t.detach().cpu().clone()) for n, t in items)

        st = buckets.receive(
            group, version=info.version, consume=consume, on_header=header.update,
            start_timeout_s=info.start_timeout_s,
        )  # fmt: skip
        if header.get("kind") != "adapter":
            raise GroupError("a LoRA sampler's sync sent full weights, not an adapter")
        save_file(got, info.adapter_path)
        self.last = {**st.as_dict(), "adapter_config": header.get("adapter_config") or {}}
        return self.last

    def shutdown(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None


def register() -> None:
    """Make `arctic` a weight-transfer backend of vLLM's factory (once per process; the worker
    extension module imports this, so vLLM's worker processes register it too)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, ArcticWeightTransferEngine)
