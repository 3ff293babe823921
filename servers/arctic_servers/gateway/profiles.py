"""Engine profiles: what differs between fake workers and the on-prem DeepSpeed / vLLM workers.

The gateway itself is engine-agnostic: it sends the on-prem engines' command set
(`forward_backward`, `step`, `generate`, `export_weights`, `load_weights`, `save`, `load`, ...)
to a sub-job's worker. A profile adds what depends on the engine: how CreateJob configs are
checked, the spec a worker builds its engine from, the semantic checks a data-plane body gets
before it is accepted (a 4xx, never a failed request), and how a checkpoint is exported.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..engines.op_checks import CallFacts, vocab_of
from ..rules.errors import ProtocolError
from ..rules.lora_config import SUPPORT as LORA_SUPPORT
from ..rules.lora_config import LoraSupport
from ..serving.checkpoint_files import run_export
from .model import SubJob
from .settings import GatewaySettings


def _has_cuda() -> bool:
    return shutil.which("nvidia-smi") is not None and os.path.exists("/dev/nvidia0")


GATEWAY_REFUSED = "checkpoint_path"
DEFAULT_VOCAB_SIZE = 151_936  # a fake sub-job's before its worker reports one (Qwen2's)


class FakeProfile:
    """Fake workers (`engines/fake/engine.py`): NUMERICS.md, any model name, no torch anywhere."""

    name = "fake"
    collective_sync = False  # no torch in a fake worker: syncs go by file or through the gateway
    lora: LoraSupport = LORA_SUPPORT  # the fake's: LoRA jobs with adapter versions (NUMERICS.md §6)

    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings

    @property
    def config_keys(self) -> dict[str, list[str]]:
        """The fake's keys: the standard ones and `lora` (what `sub_jobs_of` checks)."""
        from ..engines.fake.config import FAKE_CONFIG_KEYS

        return dict(FAKE_CONFIG_KEYS)

    def sub_jobs(self, body: Mapping[str, Any]) -> list[SubJob]:
        from ..engines.fake.config import sub_jobs_of

        out = []
        configs = body.get("sub_job_configs") or []
        for cfg, fake in zip(configs, sub_jobs_of(body, self.settings.max_total_gpus), strict=True):
            out.append(
                SubJob(
                    sub_job_id="",
                    role=fake.role,
                    index=0,
                    model_name=fake.model_name,
                    dtype=str(cfg.get("dtype") or "float32"),
                    seed=int(cfg.get("seed") or 0),
                    config=dict(fake.config),
                    n_gpus=fake.n_gpus,
                )
            )
        return out

    def engine_spec(self, sub: SubJob) -> dict[str, Any]:
        return {
            "model_name": sub.model_name,
            "config": sub.config,
            "latency_s": dict(self.settings.fake_latency_s),
        }

    def facts(self, base: CallFacts, sub: SubJob) -> CallFacts:
        """What the per-op checks (`engines/op_checks.py`) know of a fake sub-job: a forward
        on a sampler is refused what the vLLM sampler refuses."""
        return replace(
            base,
            vocab=vocab_of(sub.vocab_size or DEFAULT_VOCAB_SIZE),
            engine="fake",
            scores_with_vllm=sub.role == "sampling",
            max_context=sub.max_seq_len,
        )

    def generate_args(self, body: Mapping[str, Any], sub: SubJob) -> dict[str, Any]:
        return {
            "prompts": list(body["prompts"]),
            "sampling_params": dict(body.get("sampling_params") or {}),
            "strict": bool(body.get("strict")),
            "clamp_max_tokens": bool(body.get("clamp_max_tokens")),
            "weight_version": sub.weight_version,  # NUMERICS.md: generation depends on it
        }

    async def export(self, ckpt_dir: Path, meta: Mapping[str, Any], out: Path) -> None:
        from ..engines.fake.engine import export_checkpoint

        await asyncio.to_thread(export_checkpoint, ckpt_dir, "ds", out)


class OnpremProfile:
    """The on-prem engines (`arctic_servers.engines`): DeepSpeed trainers, vLLM samplers."""

    name = "onprem"
    collective_sync = True  # the trainer broadcasts to its targets (serving/collective_sync.py)

    def __init__(self, settings: GatewaySettings) -> None:
        from ..engines.config import LORA

        self.settings = settings
        self.cuda = _has_cuda() or bool(settings.ray_address)
        self.lora: LoraSupport = LORA  # the on-prem engines' (none without peft)

    @property
    def config_keys(self) -> dict[str, list[str]]:
        """The on-prem engines' keys, but `checkpoint_path`: checkpoints live in the gateway's
        store, not at a path of some host."""
        from ..engines.config import config_keys
        from ..rules.jobs import config_keys_json

        keys = {role: frozenset(ks - {GATEWAY_REFUSED}) for role, ks in config_keys().items()}
        return config_keys_json(keys)

    def sub_jobs(self, body: Mapping[str, Any]) -> list[SubJob]:
        from ..engines.config import sub_job_specs

        for i, cfg in enumerate(body.get("sub_job_configs") or []):
            if GATEWAY_REFUSED in (cfg.get("training_config") or {}):
                path = f"sub_job_configs[{i}].training_config.{GATEWAY_REFUSED}"
                raise ProtocolError(
                    "unsupported_option",
                    f"{path}: the gateway keeps checkpoints in its store (save / load / list), "
                    "not at a path of some host",
                    options=[path],
                    field=path,
                )
        return [
            SubJob(
                sub_job_id="",
                role=s.role,
                index=0,
                model_name=s.model_name,
                dtype=s.dtype,
                seed=s.seed,
                config=dict(s.config),
                n_gpus=s.n_gpus,
            )
            for s in sub_job_specs(body, cuda=self.cuda)
        ]

    def engine_spec(self, sub: SubJob) -> dict[str, Any]:
        return {
            "role": sub.role,
            "model_name": sub.model_name,
            "dtype": sub.dtype,
            "seed": sub.seed,
            "config": sub.config,
            "engine": engine_kind(sub.role, sub.config),
            "sub_job_id": sub.sub_job_id,
            "num_threads": sub.config.get("num_threads") or self.settings.worker_threads or 1,
        }

    def facts(self, base: CallFacts, sub: SubJob) -> CallFacts:
        """What the per-op checks (`engines/op_checks.py`) know of an on-prem sub-job: its
        vocabulary and a sampler's context once its worker reported them."""
        engine = engine_kind(sub.role, sub.config)
        info = dict((sub.worker or {}).get("info") or {})
        return replace(
            base,
            vocab=vocab_of(sub.vocab_size),
            engine=engine,
            scores_with_vllm=engine == "vllm",
            max_context=int(info.get("max_model_len") or 0),
        )

    def generate_args(self, body: Mapping[str, Any], sub: SubJob) -> dict[str, Any]:
        from ..engines import checks

        return {
            "prompts": checks.prompts(body, 0),
            "sampling_params": dict(body.get("sampling_params") or {}),
            "strict": bool(body.get("strict")),
            "clamp_max_tokens": bool(body.get("clamp_max_tokens")),
        }

    async def export(self, ckpt_dir: Path, meta: Mapping[str, Any], out: Path) -> None:
        from .supervisor import worker_env

        env = worker_env(self.settings)
        await run_export(self.settings.worker_python, env, ckpt_dir, meta, out)


def engine_kind(role: str, config: Mapping[str, Any]) -> str:
    """The on-prem engine of a sub-job (`arctic_servers.engines.config.engine_kind`)."""
    try:
        from ..engines.config import engine_kind as onprem_kind
    except ImportError:  # an on-prem package without it: its documented defaults
        defaults = {"training": "deepspeed", "sampling": "vllm"}
        return defaults.get(role) or str(config.get("engine") or "hf")
    return str(onprem_kind(role, dict(config)))


Profile = FakeProfile | OnpremProfile


def make_profile(settings: GatewaySettings) -> Profile:
    if settings.engine == "fake":
        return FakeProfile(settings)
    if settings.engine == "onprem":
        return OnpremProfile(settings)
    raise ValueError(f"engine {settings.engine!r} is not 'fake' or 'onprem'")
