"""The fake engine's job configs: CreateJob's `sub_job_configs`, checked, as sub-jobs.

The standard config keys get the checks every server shares (`rules.sub_job_config`), so the
fake refuses exactly what the on-prem server refuses, with the same codes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...rules import lora_config
from ...rules.errors import ProtocolError
from ...rules.jobs import INFERENCE_KEYS, TRAINING_KEYS, config_keys_json
from ...rules.sub_job_config import walk_sub_job_configs
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
    """Check `sub_job_configs` (the rules every engine shares, `walk_sub_job_configs`) and build
    the sub-jobs (the server gives the ids)."""
    known = {"training": FAKE_TRAINING_KEYS, "sampling": INFERENCE_KEYS, "log_prob": INFERENCE_KEYS}
    out: list[SubJob] = []
    for c in walk_sub_job_configs(
        body,
        known_keys=known,
        dtypes=DTYPES,
        default_dtype="",
        lora=lora_config.SUPPORT,
        require_model_name=True,
    ):
        if c.n_gpus > max_total_gpus:
            raise bad(
                f"{c.config_path}.n_gpus",
                f"{c.n_gpus} exceeds the server's max_total_gpus {max_total_gpus}",
                expected=f"<= {max_total_gpus}",
            )
        model = str(c.source.get("model_name"))
        out.append(SubJob("", c.role, 0, model, c.config, n_gpus=c.n_gpus))
    return out
