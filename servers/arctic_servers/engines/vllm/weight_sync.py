"""The sampler's side of the GPU hand-offs of its weights that are not the weight group.

- `cuda_ipc` (GPU, same host): the trainer sends CUDA IPC handles of its gathered weights
  (`engines/deepspeed/gpu_handoff.py`); the sampler's vLLM worker rebuilds the tensors in place
  and reloads (`vllm_ext.py`).

The method a sync runs with is picked in `serving/collective_sync.py`; the collective sync
itself (gloo on CPU, NCCL on CUDA, what `nccl` names) is `engines/weight_transfer/` and
`collective.py`. The CUDA path here follows vLLM's documented APIs but has not run on a GPU in
this project (`tools/gpu_check.sh` runs it on a CUDA machine).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .sampling import SamplingEngine

# ---------------------------------------------------------------------------- GPU (not run here)


def sampler_import_gpu(sampler: SamplingEngine, handles: Any) -> dict[str, Any]:
    """Sampler side of `cuda_ipc`: its vLLM worker rebuilds the tensors and reloads."""
    return dict(sampler.llm.collective_rpc("arctic_reload_weights_from_ipc", args=(handles,))[0])
