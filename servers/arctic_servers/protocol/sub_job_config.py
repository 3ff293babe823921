"""The checks of a sub-job config's standard keys (jobs.proto `SubJobConfig`), shared by every
server: the fake gateway refuses exactly what the on-prem server refuses, with the same codes.

`training_config` / `inference_config` keys every server knows are `protocol.jobs.TRAINING_KEYS`
/ `INFERENCE_KEYS`; a server may accept more (the on-prem extensions) and checks those itself.
Unknown keys are the caller's to collect (all of them in one `unsupported_option`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, MutableMapping
from typing import Any

from .lora_config import LoraSupport, check_lora
from .sub_jobs import field_error, refuse_unknown_keys

OPTIMIZER_KEYS = frozenset({"name", "type", "lr", "betas", "eps", "weight_decay", "momentum"})
OPTIMIZERS = ("adamw", "adam", "sgd")
ZERO_STAGES = (0, 1, 2, 3)


def int_at(conf: Mapping[str, Any], key: str, path: str, *, lo: int = 1) -> int | None:
    """`conf[key]` as an integer >= `lo` (None when absent); Struct numbers arrive as floats over
    gRPC, so an integral float is accepted."""
    v = conf.get(key)
    if v is None:
        return None
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise field_error(
            f"{path}.{key}", f"{v!r} is not an integer >= {lo}", expected=f"an integer >= {lo}"
        )
    return v


def num_at(conf: Mapping[str, Any], key: str, path: str, *, lo: float = 0.0) -> float | None:
    """`conf[key]` as a finite number >= `lo` (None when absent)."""
    v = conf.get(key)
    if v is None:
        return None
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(float(v))
    if not ok or float(v) < lo:
        raise field_error(
            f"{path}.{key}", f"{v!r} is not a finite number >= {lo}", expected=f">= {lo}"
        )
    return float(v)


def check_optimizer(opt: Any, path: str) -> None:
    """`training_config.optimizer`: an object of known keys, a known name, numbers in range."""
    if not isinstance(opt, Mapping):
        raise field_error(path, "must be an object", expected='{"name": "adamw", "lr": ...}')
    refuse_unknown_keys(opt, OPTIMIZER_KEYS, path, "optimizer")
    name = str(opt.get("name") or opt.get("type") or "adamw").lower()
    if name not in OPTIMIZERS:
        raise field_error(
            f"{path}.name", f"{name!r} is not one of {list(OPTIMIZERS)}", expected=OPTIMIZERS
        )
    for key in ("lr", "eps", "weight_decay", "momentum"):
        num_at(opt, key, path)
    betas = opt.get("betas")
    if betas is not None and (
        not isinstance(betas, list | tuple)
        or len(betas) != 2
        or not all(
            isinstance(b, int | float) and not isinstance(b, bool) and 0 <= b < 1 for b in betas
        )
    ):
        raise field_error(
            f"{path}.betas", f"{betas!r} is not two numbers in [0, 1)", expected="[b1, b2]"
        )


def _object(conf: Mapping[str, Any], key: str, path: str, what: str) -> None:
    v = conf.get(key)
    if v is not None and not isinstance(v, Mapping):
        raise field_error(f"{path}.{key}", f"must be an object ({what})", expected="an object")


def check_standard_keys(
    conf: MutableMapping[str, Any], role: str, path: str, lora: LoraSupport | None = None
) -> int:
    """The standard keys of one sub-job's config (`path` names it); returns its `n_gpus`.
    With `lora` (the server's LoRA support), a training config's `lora` is checked and replaced
    by its normalised form (every default filled in; `lora_config.check_lora`)."""
    n_gpus = int_at(conf, "n_gpus", path) or 1
    int_at(conf, "max_seq_len", path)
    if role == "training":
        stage = int_at(conf, "zero_stage", path, lo=0)
        if stage is not None and stage not in ZERO_STAGES:
            raise field_error(
                f"{path}.zero_stage", f"{stage} is not 0, 1, 2 or 3", expected=list(ZERO_STAGES)
            )
        int_at(conf, "micro_batch_size", path)
        int_at(conf, "train_batch_size", path)
        num_at(conf, "gradient_clipping", path)
        if conf.get("optimizer") is not None:
            check_optimizer(conf["optimizer"], f"{path}.optimizer")
        _object(conf, "deepspeed", path, "DeepSpeed config keys")
        if lora is not None and conf.get("lora") is not None:
            conf["lora"] = check_lora(conf["lora"], f"{path}.lora", lora)
    else:
        _object(conf, "vllm_config", path, "vLLM engine arguments")
    return n_gpus
