"""The engine registry: engine name -> what builds it and what it imports before any job needs it.

The one module that knows every engine, each imported only when its builder runs, so importing one
engine (the fake, say) imports none of the others; the engines themselves import `errors.py`,
never this. Used by the on-prem worker process (`worker/worker.py`) and the gateway's worker host
(`gateway/worker_process.py`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import WorkerError
from .worker.process_env import use_op_cache

Builder = Callable[[str, dict[str, Any]], Any]  # (role, spec) -> the engine


@dataclass(frozen=True)
class Engine:
    build: Builder
    preload: Callable[[], None]  # imports the engine's libraries (the slow part of a start-up)


def _deepspeed(role: str, spec: dict[str, Any]) -> Any:
    if role == "log_prob":  # a forward-only reference model
        from .deepspeed.ds_scoring import DeepSpeedScoringEngine

        return DeepSpeedScoringEngine(spec)
    from .deepspeed.ranks import world_size

    if world_size(spec) > 1:  # n_gpus ranks under torch.distributed (dp_training.py)
        from .deepspeed.dp_training import DataParallelTrainer

        return DataParallelTrainer(spec)
    from .deepspeed.training import TrainingEngine

    return TrainingEngine(spec)


def _vllm(role: str, spec: dict[str, Any]) -> Any:
    from .vllm.sampling import SamplingEngine

    return SamplingEngine(spec)


def _hf(role: str, spec: dict[str, Any]) -> Any:
    from .deepspeed.scoring import ScoringEngine

    return ScoringEngine(spec)


def _fake(role: str, spec: dict[str, Any]) -> Any:
    from .fake.engine import FakeEngine

    return FakeEngine(spec)


def _pool_trainer(role: str, spec: dict[str, Any]) -> Any:
    from .deepspeed.lora_pool_trainer import LoraPoolTrainer

    return LoraPoolTrainer(spec)


def _pool_sampler(role: str, spec: dict[str, Any]) -> Any:
    from .vllm.lora_pool_sampler import LoraPoolSampler

    return LoraPoolSampler(spec)


def _cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _preload_deepspeed() -> None:
    if not _cuda():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed  # noqa: F401
    from transformers import AutoModelForCausalLM  # noqa: F401


def _preload_vllm() -> None:
    from .vllm.sampling import set_vllm_env

    set_vllm_env(_cuda())
    from vllm import LLM, SamplingParams  # noqa: F401


def _preload_hf() -> None:
    _cuda()  # torch first, as the others
    from transformers import AutoModelForCausalLM  # noqa: F401


def _preload_nothing() -> None:
    """The fake engine is NumPy only."""


ENGINES: Mapping[str, Engine] = {
    "deepspeed": Engine(_deepspeed, _preload_deepspeed),
    "vllm": Engine(_vllm, _preload_vllm),
    "hf": Engine(_hf, _preload_hf),
    "fake": Engine(_fake, _preload_nothing),
}
#: a LoRA pool's engines (many jobs' adapters over one base model), by (engine, role)
POOL_ENGINES: Mapping[tuple[str, str], Builder] = {
    ("deepspeed", "training"): _pool_trainer,
    ("vllm", "sampling"): _pool_sampler,
}
#: the engine of a spec that names none
DEFAULT_ENGINE = {"training": "deepspeed", "sampling": "vllm"}
#: what the on-prem worker process runs (`python -m arctic_servers.engines.worker.worker`)
WORKER_ENGINES = ("deepspeed", "vllm", "hf")


def engine_name(role: str, spec: Mapping[str, Any]) -> str:
    return str(spec.get("engine") or DEFAULT_ENGINE.get(role, "hf"))


def build_engine(role: str, spec: dict[str, Any]) -> Any:
    """The engine of a sub-job of `role` from its spec; `invalid_argument` naming an engine
    (or a LoRA pool's engine) that does not exist."""
    engine = engine_name(role, spec)
    use_op_cache()
    if spec.get("pool"):
        pooled = POOL_ENGINES.get((engine, role))
        if pooled is None:
            raise WorkerError("invalid_argument", f"no LoRA pool engine for {role} on {engine}")
        return pooled(role, spec)
    entry = ENGINES.get(engine)
    if entry is None:
        raise WorkerError("invalid_argument", f"unknown engine {engine!r}")
    return entry.build(role, spec)


def preload(engine: str) -> None:
    """Import the engine's libraries before any job needs them (the slow part of a start-up)."""
    use_op_cache()
    ENGINES[engine].preload()
