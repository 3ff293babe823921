"""The fake engine's job configs: CreateJob's `sub_job_configs`, checked, as sub-jobs.

The standard config keys get the checks every server shares (`protocol.sub_job_config`), so the
fake refuses exactly what the on-prem server refuses, with the same codes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...protocol import lora_config
from ...protocol.errors import ProtocolError
from ...protocol.jobs import INFERENCE_KEYS, TRAINING_KEYS, config_keys_json, role_of
from ...protocol.sub_job_config import check_standard_keys
from .state import SubJob

DTYPES = ("", "float32", "bfloat16", "float16")
# the fake models LoRA jobs as the on-prem server does (adapter versions, NUMERICS.md §6)
FAKE_TRAINING_KEYS = TRAINING_KEYS | {"lora"}
#: The capabilities' `config_keys` of a server over the fake engine (fake gateway, --engine fake).
FAKE_CONFIG_KEYS = config_keys_json(
    {"sampling": INFERENCE_KEYS, "log_prob": INFERENCE_KEYS, "training": FAKE_TRAINING_KEYS}
)


def bad(path: str, message: str, code: str = "invalid_argument", **details: Any) -> ProtocolError:
    return ProtocolError(code, f"field {path}: {message}", field=path, **details)


def sub_jobs_of(body: Mapping[str, Any], max_total_gpus: int) -> list[SubJob]:
    """Check `sub_job_configs` and build the sub-jobs (the server gives the ids)."""
    configs = body.get("sub_job_configs") or []
    if not configs:
        raise bad(
            "sub_job_configs", "at least one sub-job config is required", code="missing_field"
        )
    out: list[SubJob] = []
    unsupported: list[str] = []
    checked: list[tuple[str, str, dict[str, Any]]] = []
    for i, cfg in enumerate(configs):
        path = f"sub_job_configs[{i}]"
        role = role_of(cfg.get("job_type"))
        if role is None:
            raise bad(
                f"{path}.job_type",
                "is required: training, sampling or log_prob",
                code="missing_field",
            )
        model = cfg.get("model_name") or ""
        if not model:
            raise bad(f"{path}.model_name", "is required", code="missing_field")
        dtype = cfg.get("dtype") or ""
        if dtype not in DTYPES:
            raise bad(
                f"{path}.dtype",
                f"{dtype!r} is not one of {list(DTYPES[1:])}",
                expected=list(DTYPES[1:]),
            )
        own, other = ("training_config", "inference_config")
        if role != "training":
            own, other = other, own
        if cfg.get(other):
            raise bad(f"{path}.{other}", f"is not used by a {role} sub-job; use {own}")
        conf: dict[str, Any] = dict(cfg.get(own) or {})
        known = FAKE_TRAINING_KEYS if role == "training" else INFERENCE_KEYS
        unsupported += [f"{path}.{own}.{k}" for k in conf if k not in known]
        n_gpus = check_standard_keys(conf, role, f"{path}.{own}", lora_config.SUPPORT)
        checked.append((role, f"{path}.{own}", conf))
        if n_gpus > max_total_gpus:
            raise bad(
                f"{path}.{own}.n_gpus",
                f"{n_gpus} exceeds the server's max_total_gpus {max_total_gpus}",
                expected=f"<= {max_total_gpus}",
            )
        out.append(SubJob("", role, 0, str(model), n_gpus, conf))
    if unsupported:
        raise ProtocolError(
            "unsupported_option",
            f"unknown config key(s): {', '.join(unsupported)}",
            options=unsupported,
            field=unsupported[0],
        )
    lora_config.check_job_lora(checked)
    return out
