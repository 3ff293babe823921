"""The on-prem server's vLLM worker extension: the engines' reload extension plus GPU paths.

`ArcticWorkerExtension` (engines/vllm_worker_ext.py) reloads weights from a safetensors file or
blob. Importing this module registers the `arctic` weight-transfer backend (`collective.py`,
the collective sync on gloo or NCCL, which `nccl` now names too) in the vLLM worker's process.
This subclass adds the CUDA IPC hand-off (trainer and sampler on the same GPU host): the trainer
pickles `torch.multiprocessing.reductions.reduce_tensor` handles of its gathered weights; the
sampler's worker rebuilds the tensors in its own process (no copy through host memory) and
reloads. It is GPU-only and has not run on the CPU machines this project is tested on
(`tools/gpu_check.sh` runs it on a CUDA machine).
"""

from __future__ import annotations

import os
import pickle
from typing import Any

from arctic_servers.engines.vllm.collective import register
from arctic_servers.engines.vllm.lora_sampler import EMBEDDING_ENV, serve_embedding_adapters
from arctic_servers.engines.vllm_worker_ext import ArcticWorkerExtension

register()  # the `arctic` weight-transfer backend, in every process that hosts a vLLM worker
if os.environ.get(EMBEDDING_ENV):  # a LoRA pool's sampler: vLLM's engine process builds the model
    serve_embedding_adapters()


class OnpremWorkerExtension(ArcticWorkerExtension):
    def arctic_weight_transfer_last(self) -> dict[str, Any]:
        """What the weight-transfer engine's last join or receive reported (collective.py)."""
        engine = getattr(self, "weight_transfer_engine", None)
        return dict(getattr(engine, "last", {}) or {})

    def arctic_receive_adapter(self, update_info: dict[str, Any]) -> dict[str, Any]:
        """A LoRA sampler's collective sync: the adapter into a file (collective.py)."""
        engine = self.weight_transfer_engine  # type: ignore[attr-defined]
        return dict(engine.receive_adapter(engine.parse_update_info(update_info)))

    def arctic_reload_weights_from_ipc(self, handles_blob: bytes) -> dict[str, Any]:
        """`handles_blob` = pickle of [(name, (rebuild_fn, args)), ...] from the trainer."""
        import torch

        handles = pickle.loads(handles_blob)
        dev = torch.device("cuda", torch.cuda.current_device())
        weights = []
        for name, (fn, args) in handles:
            args = list(args)
            args[6] = dev.index  # rebuild on this worker's device (reduce_tensor's device slot)
            weights.append((name, fn(*args)))
        self._arctic_reload(weights)
        return {"n": len(weights)}
