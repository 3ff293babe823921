"""The on-prem server's vLLM worker extension: the engines' reload extension plus GPU paths.

`ArcticWorkerExtension` (engines/vllm_worker_ext.py) reloads weights from a safetensors file or
blob — the CPU paths the server uses and tests. This subclass adds the two GPU hand-offs:

- CUDA IPC (trainer and sampler on the same GPU host): the trainer pickles
  `torch.multiprocessing.reductions.reduce_tensor` handles of its gathered weights; the sampler's
  worker rebuilds the tensors in its own process (no copy through host memory) and reloads.
- NCCL (different GPUs or hosts): trainer (rank 0) and sampler worker (rank 1) form a stateless
  two-rank group; the trainer broadcasts every tensor, the worker receives into fresh buffers.

Both are GPU-only and were not exercised on the CPU machines this project is tested on.
"""

from __future__ import annotations

import pickle
from typing import Any

from arctic_servers.engines.vllm_worker_ext import ArcticWorkerExtension


class OnpremWorkerExtension(ArcticWorkerExtension):
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

    def arctic_nccl_init(self, host: str, port: int, world_size: int, rank: int) -> bool:
        import torch
        from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
        from vllm.distributed.utils import StatelessProcessGroup

        pg = StatelessProcessGroup.create(host=host, port=port, rank=rank, world_size=world_size)
        self._arctic_nccl = PyNcclCommunicator(
            pg, device=torch.device("cuda", torch.cuda.current_device())
        )
        return True

    def arctic_reload_weights_from_nccl(self, meta_blob: bytes) -> dict[str, Any]:
        """`meta_blob` = pickle of [(name, shape, dtype_name), ...]; tensors arrive by broadcast."""
        import torch

        meta = pickle.loads(meta_blob)
        comm = self._arctic_nccl
        weights = []
        for name, shape, dtype in meta:
            buf = torch.empty(shape, dtype=getattr(torch, dtype), device="cuda")
            comm.broadcast(buf, src=0, stream=torch.cuda.current_stream())
            weights.append((name, buf))
        torch.cuda.synchronize()
        self._arctic_reload(weights)
        return {"n": len(weights)}
