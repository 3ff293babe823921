"""The trainer's side of the GPU hand-offs that are not the weight group, and its GPU offload.

- `cuda_ipc` (GPU, same host): CUDA IPC handles of the trainer's gathered weights; the sampler's
  side is `engines/vllm/weight_sync.py` (its vLLM worker rebuilds the tensors in place and
  reloads, `vllm_ext.py`).
- colocation: DeepSpeed's `offload_states` / `reload_states` free and restore the trainer's GPU
  memory.

The CUDA paths here follow DeepSpeed's documented APIs but have not run on a GPU in this project
(`tools/gpu_check.sh` runs them on a CUDA machine).
"""

from __future__ import annotations

import pickle
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .training import TrainingEngine
    from .training_weights import TrainerWeights

# ---------------------------------------------------------------------------- GPU (not run here)


def trainer_export_gpu(trainer: TrainerWeights, method: str) -> dict[str, Any]:
    """Trainer side of `cuda_ipc`: IPC handles of its (gathered) weights."""
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
    handles = [
        (n, reduce_tensor(t.contiguous()))  # type: ignore[no-untyped-call]  # torch: unannotated
        for n, t in sd.items()
    ]
    return {"handles": pickle.dumps(handles), "num_tensors": len(sd), "num_bytes": nbytes}


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
