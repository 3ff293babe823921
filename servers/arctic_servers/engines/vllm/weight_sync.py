"""Weight-sync methods of the on-prem server, and the trainer's GPU offload.

- `shm` (CPU default): the trainer writes one safetensors file under /dev/shm; each target
  reloads it (vLLM through `reload_weights`, the HF scorer by copy); the file is removed after.
- `safetensors` (anywhere): the trainer returns one safetensors blob; the server forwards it to
  each target through their pipes.
- `cuda_ipc` (GPU, same host; the default with CUDA): CUDA IPC handles of the trainer's gathered
  weights; the sampler rebuilds the tensors in place and reloads.
- `nccl` (GPU): the trainer, rank 0 of a stateless two-rank group, broadcasts to the sampler's
  worker (rank 1).

The CPU methods are what this project's tests exercise. The GPU code paths are present and follow
vLLM's documented APIs, but have not run on a GPU here (`pick_method` refuses them on CPU).
"""

from __future__ import annotations

import pickle
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..deepspeed.training import TrainingEngine
    from .sampling import SamplingEngine

CPU_METHODS = ("shm", "safetensors")
GPU_METHODS = ("cuda_ipc", "nccl")
METHODS = ("auto", *CPU_METHODS, *GPU_METHODS)


def pick_method(
    requested: str | None, *, cuda: bool, shm_ok: bool, cuda_ipc: bool | None = None
) -> str:
    """The method a sync runs with; raises ValueError for one this host cannot run."""
    m = (requested or "auto").lower()
    if m == "auto":
        if cuda:
            return "cuda_ipc" if cuda_ipc is not False else "nccl"
        return "shm" if shm_ok else "safetensors"
    if m in GPU_METHODS and not cuda:
        raise ValueError(
            f"method {m!r} needs CUDA; this server runs on CPU (use shm or safetensors)"
        )
    if m == "shm" and not shm_ok:
        raise ValueError("method 'shm' needs /dev/shm, which this host lacks (use safetensors)")
    return m


# ---------------------------------------------------------------------------- GPU (not run here)


def trainer_export_gpu(trainer: TrainingEngine, method: str) -> dict[str, Any]:
    """Trainer side of `cuda_ipc` (handles) or `nccl` (metadata; tensors follow by broadcast)."""
    import deepspeed
    from torch.multiprocessing.reductions import reduce_tensor

    module = trainer.engine.module
    if trainer.stage == 3:
        with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
            sd = {n: p.detach().clone() for n, p in module.named_parameters()}
    else:
        sd = {n: p.detach() for n, p in module.named_parameters()}
    trainer._sync_keepalive = sd  # type: ignore[attr-defined]  # alive until the next sync
    nbytes = sum(v.numel() * v.element_size() for v in sd.values())
    if method == "cuda_ipc":
        handles = [(n, reduce_tensor(t.contiguous())) for n, t in sd.items()]
        return {"handles": pickle.dumps(handles), "num_tensors": len(sd), "num_bytes": nbytes}
    meta = [(n, list(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in sd.items()]
    return {"handles": pickle.dumps(meta), "num_tensors": len(sd), "num_bytes": nbytes}


def trainer_nccl_broadcast(trainer: TrainingEngine, host: str, port: int) -> dict[str, Any]:
    """Trainer rank 0: join the two-rank group and broadcast every tensor of the last export."""
    import torch
    from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
    from vllm.distributed.utils import StatelessProcessGroup

    comm = getattr(trainer, "_nccl", None)
    if comm is None:
        pg = StatelessProcessGroup.create(host=host, port=port, rank=0, world_size=2)
        comm = PyNcclCommunicator(pg, device=torch.device("cuda", 0))
        trainer._nccl = comm  # type: ignore[attr-defined]
    for t in trainer._sync_keepalive.values():  # type: ignore[attr-defined]
        comm.broadcast(t.contiguous(), src=0, stream=torch.cuda.current_stream())
    torch.cuda.synchronize()
    return {"sent": len(trainer._sync_keepalive)}  # type: ignore[attr-defined]


def sampler_import_gpu(sampler: SamplingEngine, method: str, handles: Any) -> dict[str, Any]:
    if method == "cuda_ipc":
        return dict(
            sampler.llm.collective_rpc("arctic_reload_weights_from_ipc", args=(handles,))[0]
        )
    return dict(sampler.llm.collective_rpc("arctic_reload_weights_from_nccl", args=(handles,))[0])


def offload_trainer(trainer: TrainingEngine, mode: str) -> dict[str, Any]:
    """GPU colocation: DeepSpeed's `offload_states` (ZeRO-3) frees the trainer's GPU memory."""
    if trainer.stage != 3:
        return {
            "applied": False,
            "reason": f"DeepSpeed offload_states needs ZeRO-3 (this trainer: ZeRO-{trainer.stage})",
        }
    from deepspeed.runtime.zero.offload_config import OffloadStateTypeEnum

    include = None
    if mode == "optimizer":
        include = [
            OffloadStateTypeEnum.optim_states,
            OffloadStateTypeEnum.lp_grads,
            OffloadStateTypeEnum.hp_params,
        ]
    elif mode == "weights":
        include = [OffloadStateTypeEnum.lp_params]
    trainer.engine.offload_states(include=include)
    trainer.offloaded = True
    return {"applied": True, "reason": f"DeepSpeed offload_states ({mode})"}


def reload_trainer(trainer: TrainingEngine) -> dict[str, Any]:
    if not trainer.offloaded:
        return {"applied": False, "reason": "the trainer was not offloaded"}
    trainer.engine.reload_states()
    trainer.offloaded = False
    return {"applied": True, "reason": "DeepSpeed reload_states"}
