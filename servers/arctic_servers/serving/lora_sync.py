"""Weight sync of a LoRA job, on-prem and on the gateway (PROTOCOL.md §3.6): the adapter's tensors
(a few hundred KiB to MiB) travel as one safetensors file (/dev/shm), a blob, or over the job's
weight group (`collective`, `nccl`: `serving/collective_sync.py`) into the job's sampling
sub-jobs, each of which loads them as a new adapter version (`engines/vllm/lora_sampler.py`).
CUDA IPC handles of full weights (`cuda_ipc`) are not used for an adapter.

A job in a LoRA pool (`lora_pools.py`) syncs by file or blob only (`POOL_METHODS`: `auto` is the
/dev/shm file on one host, the blob across hosts). Its trainer and sampler are processes every
job of the pool shares: a weight group's receive runs in the sampler's serve loop and holds the
continuous batch of every job until the shared trainer reaches the send (behind other jobs'
calls in its queue), and vLLM's weight-transfer engine holds one group per sampler, so jobs would
close each other's. The file path names its job in every command (the tenant's own adapter
version, a file named by the job), costs milliseconds for an adapter of a few MiB, and loads
between two engine steps without pausing another job's sampling.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..rules.errors import ProtocolError
from ..rules.jobs import sub_job_by_id
from ..rules.sub_jobs import field_error

LORA_METHODS = ("auto", "shm", "safetensors", "collective", "nccl")
POOL_METHODS = ("auto", "shm", "safetensors")  # a pooled job's (the module docstring)


def check_lora_sync(job: Any, body: Mapping[str, Any], path: str, pool: str = "") -> None:
    """A LoRA job's sync: a file, blob or weight-group method (a job in LoRA pool `pool`: a
    file or blob), sampling targets only."""
    method = str(body.get("method") or "auto").lower()
    opt = f"{path}method"
    if method not in LORA_METHODS:
        raise ProtocolError(
            "unsupported_option",
            f"{opt}: {method!r}; a LoRA job syncs its adapter as a file, a blob or over its "
            "weight group, one of "
            f"{list(LORA_METHODS)}",
            options=[opt],
            field=opt,
        )
    if pool and method not in POOL_METHODS:
        raise ProtocolError(
            "unsupported_option",
            f"{opt}: {method!r}; this job's adapter trains and samples in LoRA pool {pool}, "
            "whose trainer and sampler other jobs share, so it syncs as a file or a blob, one "
            f"of {list(POOL_METHODS)} (a weight group would hold every job's sampling until "
            "the shared trainer sends)",
            options=[opt],
            field=opt,
        )
    for i, tid in enumerate(body.get("target_sub_job_ids") or []):
        if sub_job_by_id(job, tid).role != "sampling":
            raise field_error(
                f"{path}target_sub_job_ids[{i}]",
                f"{tid} is not a sampling sub-job; a LoRA job's adapter loads into its "
                "samplers only (the reference model stays the base model)",
                expected="a sampling sub-job",
            )


def lora_method(method: str, shm_ok: bool, *, pooled: bool = False, same_host: bool = True) -> str:
    """The method a LoRA sync runs with: the picked one, except CUDA IPC (`auto` with the
    legacy `cuda_ipc` knob), which becomes the file on one host or the weight group. A pooled
    job's is a file or a blob (`POOL_METHODS`; what `auto` picked otherwise becomes the file when
    its pool's workers share a host with /dev/shm, the blob when not)."""
    if pooled:
        if method in POOL_METHODS:
            return method
        return "shm" if shm_ok and same_host else "safetensors"
    if method != "cuda_ipc":
        return method
    return "shm" if shm_ok else "collective"


def adapter_load_args(tag_dir: Path, ckpt: str) -> dict[str, Any]:
    """`load_weights` arguments that load a LoRA checkpoint's adapter into a LoRA job's sampler
    (a full-weight checkpoint cannot go there: `invalid_argument`)."""
    adapter = tag_dir / "adapter"
    if not (adapter / "adapter_config.json").is_file():
        raise field_error(
            "checkpoint_id",
            f"{ckpt!r} holds full weights; a LoRA job's sampler loads a LoRA checkpoint's adapter",
            expected="a checkpoint of a LoRA job",
        )
    return {
        "path": str(adapter / "adapter_model.safetensors"),
        "adapter_config": json.loads((adapter / "adapter_config.json").read_text()),
    }
