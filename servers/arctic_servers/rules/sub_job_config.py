"""The checks of a sub-job config's standard keys (jobs.proto `SubJobConfig`), shared by every
server: the fake gateway refuses exactly what the on-prem server refuses, with the same codes.

`training_config` / `inference_config` keys every server knows are `protocol.jobs.TRAINING_KEYS`
/ `INFERENCE_KEYS`; a server may accept more (the on-prem extensions) and checks those itself.
Unknown keys are the caller's to collect (all of them in one `unsupported_option`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import ProtocolError
from .jobs import role_of
from .lora_config import LoraSupport, check_job_lora, check_lora
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


@dataclass(frozen=True)
class SubJobConfig:
    """One `sub_job_configs` entry whose common rules passed (`walk_sub_job_configs`)."""

    path: str  # "sub_job_configs[i]"
    role: str  # training, sampling or log_prob
    source: Mapping[str, Any]  # the entry as sent
    dtype: str
    config_path: str  # "sub_job_configs[i].training_config" (or inference_config)
    config: dict[str, Any]  # a copy of that config, which the engine's checks may normalise
    n_gpus: int


def walk_sub_job_configs(
    body: Mapping[str, Any],
    *,
    known_keys: Mapping[str, frozenset[str]],
    dtypes: Sequence[str],
    default_dtype: str,
    lora: LoraSupport,
    require_model_name: bool = False,
) -> Iterator[SubJobConfig]:
    """The rules of CreateJob's `sub_job_configs` that every engine shares, one entry at a time:
    at least one entry, a known `job_type`, a known `dtype`, only the role's own config object,
    the standard keys (`check_standard_keys`). The caller runs its engine's own checks on each
    entry it is handed; once it has seen them all, every key not in `known_keys[role]` is
    refused in one `unsupported_option`, then the job-level LoRA rules are checked."""
    configs = body.get("sub_job_configs") or []
    if not configs:
        raise field_error(
            "sub_job_configs", "at least one sub-job config is required", code="missing_field"
        )
    unsupported: list[str] = []
    checked: list[tuple[str, str, dict[str, Any]]] = []
    for i, cfg in enumerate(configs):
        path = f"sub_job_configs[{i}]"
        role = role_of(cfg.get("job_type"))
        if role is None:
            raise field_error(
                f"{path}.job_type", "is required: training, sampling or log_prob", "missing_field"
            )
        if require_model_name and not cfg.get("model_name"):
            raise field_error(f"{path}.model_name", "is required", "missing_field")
        dtype = cfg.get("dtype") or default_dtype
        if dtype not in dtypes:
            named = [d for d in dtypes if d]
            raise field_error(f"{path}.dtype", f"{dtype!r} is not one of {named}", expected=named)
        own, other = ("training_config", "inference_config")
        if role != "training":
            own, other = other, own
        if cfg.get(other):
            raise field_error(f"{path}.{other}", f"is not used by a {role} sub-job; use {own}")
        conf: dict[str, Any] = dict(cfg.get(own) or {})
        cpath = f"{path}.{own}"
        unsupported += [f"{cpath}.{k}" for k in conf if k not in known_keys[role]]
        n_gpus = check_standard_keys(conf, role, cpath, lora)
        checked.append((role, cpath, conf))
        yield SubJobConfig(path, role, cfg, str(dtype), cpath, conf, n_gpus)
    if unsupported:
        raise ProtocolError(
            "unsupported_option",
            f"config key(s) this server cannot honour: {', '.join(unsupported)}",
            options=unsupported,
            field=unsupported[0],
        )
    check_job_lora(checked, lora)
