"""A worker's torch.distributed / DeepSpeed setup: the single-process rendezvous environment,
the rank's device, DeepSpeed's shared-memory buffers, and a training sub-job's DeepSpeed config."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import Any

import torch


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def set_ds_env() -> None:
    """Single-process torch.distributed rendezvous for DeepSpeed (no launcher, no MPI)."""
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _unlink_allreduce_buffers() -> None:
    """Unlink DeepSpeed's CPU all-reduce buffers (`/dev/shm`, ~70 MB a rank) as soon as every
    rank has mapped them: the mappings stay valid, and a worker killed with SIGKILL then leaves
    nothing behind. The barrier proves every rank is past DeepSpeed's init (where each rank maps
    all the others' buffers)."""
    from .ranks import remove_shm_buffers

    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        torch.distributed.barrier()
    remove_shm_buffers(os.environ.get("MASTER_ADDR", ""), int(os.environ.get("MASTER_PORT") or 0))


def device() -> torch.device:
    """This rank's device: GPU `LOCAL_RANK` (0 for a single-rank sub-job), or the CPU."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK") or 0) % torch.cuda.device_count())


def ds_config(conf: Mapping[str, Any], dtype: str, *, cuda: bool) -> dict[str, Any]:
    """The DeepSpeed config of a training sub-job (training_config keys, then `deepspeed`)."""
    opt = dict(conf.get("optimizer") or {})
    name = str(opt.pop("name", None) or opt.pop("type", None) or "adamw").lower()
    opt.pop("type", None)
    params: dict[str, Any] = {"lr": float(opt.get("lr", 1e-5))}
    if name in ("adamw", "adam"):
        params["betas"] = list(opt.get("betas", (0.9, 0.999)))
        params["eps"] = float(opt.get("eps", 1e-8))
        params["weight_decay"] = float(opt.get("weight_decay", 0.0 if name == "adam" else 0.01))
        if not cuda:
            params["torch_adam"] = True  # DeepSpeed's fused CPU Adam is a 40 s JIT build
    else:
        params["momentum"] = float(opt.get("momentum", 0.0))
        params["weight_decay"] = float(opt.get("weight_decay", 0.0))
    micro = int(conf.get("micro_batch_size") or 1)
    train_batch = conf.get("train_batch_size")
    gas = max(1, int(train_batch) // micro) if train_batch else 1
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": gas,
        "gradient_clipping": float(conf.get("gradient_clipping", 1.0)),
        "steps_per_print": 10**12,
        "wall_clock_breakdown": False,
        "bf16": {"enabled": dtype == "bfloat16"},
        "fp16": {"enabled": dtype == "float16"},
        "optimizer": {
            "type": {"adamw": "AdamW", "adam": "Adam", "sgd": "SGD"}[name],
            "params": params,
        },
        "zero_optimization": {"stage": int(conf.get("zero_stage", 1))},
    }
    if cfg["zero_optimization"]["stage"] == 3:
        cfg["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    _merge(cfg, dict(conf.get("deepspeed") or {}))
    # The protocol's accumulation contract (module docstring); not overridable.
    cfg["managed_gradient_accumulation"] = False
    return cfg


def _merge(dst: dict[str, Any], src: Mapping[str, Any]) -> None:
    for k, v in src.items():
        if isinstance(v, Mapping) and isinstance(dst.get(k), dict):
            _merge(dst[k], v)
        else:
            dst[k] = v
