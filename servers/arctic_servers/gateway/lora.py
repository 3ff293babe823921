"""LoRA jobs on the gateway (PROTOCOL.md §3.6): what the gateway adds to the rules every server
shares (`rules/lora_config.py`) and to the engines' own LoRA support (the on-prem trainer's
PEFT adapter, the vLLM sampler's adapter versions), which its workers run as they are.

- The job's normalised `lora` (its training sub-job's config, filled in at CreateJob by the
  profile's checks), and whether its samplers load adapters (`adapter_sync`) or take merged full
  weights (an embedding / lm_head adapter: merge-and-push).
- The worker spec of such a sampler names the adapter (`lora`), as the on-prem server's does.
- generate's `adapter` ("base": version 0, the base model) and a sync's LoRA rules.
- Checkpoints: the meta records the job's `lora`, so an export knows a LoRA checkpoint; its
  `format: "peft"` export is the PEFT adapter directory, beside the merged HF export.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..rules.lora_config import PEFT_EXPORT, PEFT_FILES, adapter_sync, check_adapter, job_lora
from ..serving import checkpoint_files as cf
from ..serving.checkpoint_files import copy_tree
from ..serving.lora_pools import syncs_adapter
from ..serving.lora_sync import check_lora_sync
from .model import Job, SubJob

__all__ = ["check_adapter"]  # generate's `adapter` rule, for the servicer's checks


def lora_of(job: Job) -> dict[str, Any] | None:
    """The job's normalised `training_config.lora`; None for a full-weight job."""
    return job_lora([(s.role, s.config) for s in job.sub_jobs])


def adapter_job(job: Job) -> bool:
    """The job's samplers load its adapter as adapter versions (not merged full weights; a
    pooled job's always do: its pool's sampler serves embedding / lm_head adapters too)."""
    return syncs_adapter(lora_of(job), bool(job.pool))


def engine_spec(job: Job, sub: SubJob, spec: dict[str, Any]) -> dict[str, Any]:
    """A sampler of an adapter job starts with LoRA on (`engines/vllm/lora_sampler.py`)."""
    lora = lora_of(job)
    if sub.role == "sampling" and lora is not None and adapter_sync(lora):
        return {**spec, "lora": lora}
    return spec


def generate_args(job: Job, body: Mapping[str, Any], args: dict[str, Any]) -> str:
    """generate's `adapter` into the worker's arguments: "base" (the base model, version 0)
    or "". Checked when the request was accepted too."""
    adapter = check_adapter(body, adapter_job(job))
    if adapter:
        args["adapter"] = adapter
        if "weight_version" in args:  # the fake engine: its numerics follow the version
            args["weight_version"] = 0
    return adapter


def check_sync(job: Job, body: Mapping[str, Any], path: str) -> None:
    """An adapter job's sync: a file, blob or weight-group method (a pooled job's: a file or
    blob), sampling targets only (`serving/lora_sync.py`)."""
    if adapter_job(job):
        check_lora_sync(job, body, path, job.pool)


def is_lora_checkpoint(meta: Mapping[str, Any]) -> bool:
    return bool(meta.get("lora"))


async def export_peft(profile: Any, root: Path, meta: Mapping[str, Any]) -> str:
    """The checkpoint's PEFT adapter directory (`export-peft/`), made on first use; its name."""
    out = root / PEFT_EXPORT
    if not all((out / f).is_file() for f in PEFT_FILES):
        if profile.name == "fake":
            from ..engines.fake.engine import export_peft as fake_peft

            await asyncio.to_thread(fake_peft, root, cf.ENGINE_TAG, out, dict(meta["lora"]))
        else:  # the trainer saved its adapter as a PEFT directory (engines/deepspeed)
            await asyncio.to_thread(copy_tree, root / cf.ENGINE_TAG / "adapter", out)
    return PEFT_EXPORT


def file_dir(meta: Mapping[str, Any], name: str) -> str:
    """Which export directory a downloaded file comes from."""
    return PEFT_EXPORT if name in PEFT_FILES and is_lora_checkpoint(meta) else "export"
