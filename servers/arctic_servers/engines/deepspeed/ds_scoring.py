"""The forward-only DeepSpeed log-prob engine: a `log_prob` sub-job with `engine: "deepspeed"`.

The deployed server's reference model ran on DeepSpeed with its own config
(`log_prob_ds_config`): ZeRO parameter partitioning (stage, `offload_param`), no optimizer.
Here the model is `deepspeed.initialize`d without one, from the sub-job's `deepspeed` config
(merged over `train_micro_batch_size_per_gpu: 1`, the dtype and ZeRO stage 0); forward passes go
through DeepSpeed (ZeRO-3 gathers), weights sync in through a parameter gather.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from typing import Any

import torch

from ..errors import WorkerError
from ..weight_transfer.member import receive_into_module
from .ds_setup import _merge, _unlink_allreduce_buffers, set_ds_env
from .scoring import ScoringEngine


def inference_config(conf: Mapping[str, Any], dtype: str) -> dict[str, Any]:
    """The DeepSpeed config of the forward-only engine (no optimizer state; CreateJob refused
    the keys only an optimizer uses: `train_options.check_forward_only_deepspeed`)."""
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 1,
        "steps_per_print": 10**12,
        "bf16": {"enabled": dtype == "bfloat16"},
        "fp16": {"enabled": dtype == "float16"},
        "zero_optimization": {"stage": 0},
    }
    _merge(cfg, dict(conf.get("deepspeed") or {}))
    return cfg


class DeepSpeedScoringEngine(ScoringEngine):
    def __init__(self, spec: Mapping[str, Any]) -> None:
        super().__init__(spec)  # the HF model, attention, determinism
        set_ds_env()
        import deepspeed

        self.ds_config = inference_config(spec.get("config") or {}, spec.get("dtype") or "float32")
        engine, *_ = deepspeed.initialize(model=self.model, config=self.ds_config)
        _unlink_allreduce_buffers()
        engine.eval()
        self.engine = engine
        self.model = engine  # _Forward calls go through DeepSpeed's hooks (ZeRO-3 gathers)
        self.stage = int(engine.zero_optimization_stage())

    ENGINE_NAME = "DeepSpeed"

    def info(self) -> dict[str, Any]:
        return {**super().info(), "engine": "deepspeed", "zero_stage": self.stage}

    def op_load_weights(
        self,
        path: str | None = None,
        blob: bytes | None = None,
        method: str = "shm",
        group_id: str = "",
        weight_version: int = 0,
        **_: Any,
    ) -> dict[str, Any]:
        self.refuse_gpu_method(method)
        import deepspeed
        from safetensors.torch import load, load_file

        t = time.perf_counter()
        params = dict(self.engine.module.named_parameters())
        if method == "collective":  # every parameter whole (ZeRO-3), each bucket copied in
            whole = deepspeed.zero.GatheredParameters(
                list(params.values()), modifier_rank=0, enabled=self.stage == 3
            )
            with whole:
                return receive_into_module(self, params, group_id, int(weight_version))
        sd = load_file(path) if path else load(blob or b"")
        missing = [n for n in params if n not in sd]
        if missing:
            raise WorkerError(
                "invalid_argument", f"weights lack {len(missing)} tensors, e.g. {missing[:3]}"
            )
        gathered = deepspeed.zero.GatheredParameters(
            list(params.values()), modifier_rank=0, enabled=self.stage == 3
        )
        with gathered, torch.no_grad():
            for n, p in params.items():
                p.copy_(sd[n].to(p.dtype))
        return {"num_tensors": len(sd), "seconds": time.perf_counter() - t}

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.engine.destroy()
