"""The on-prem training options beyond the standard sub-job config keys (torch-free).

Checked at CreateJob (`settings.sub_job_specs`, a 4xx naming the field) and applied by the
engines (`training.py`, `scoring.py`, `ds_scoring.py`):

- `lr_scheduler` `{type, warmup_steps, total_steps, min_lr_ratio}`: the learning rate of
  optimizer step `t` (0 for the first) is the optimizer's `lr` times `lr_factor(t)`: a linear
  warm-up `(t + 1) / warmup_steps` for `t < warmup_steps`, then `constant` (1), or a `cosine` /
  `linear` decay from 1 to `min_lr_ratio` over the steps `warmup_steps .. total_steps` (then
  `min_lr_ratio`). A `step` with `learning_rate` replaces the schedule for that and later steps.
- `activation_checkpointing` (bool): Hugging Face gradient checkpointing of the trained model
  (activations recomputed in the backward; the same gradients, less memory).
- `attn_implementation`: `eager` (default), `sdpa`, `flash_attention_2`, `flash_attention_3`;
  a flash kernel this host cannot run (no CUDA, or the package missing) falls back to `sdpa`
  (the same attention), which the engine's info reports (`attn_implementation`,
  `attn_requested`).
- `full_determinism` (bool): `transformers.enable_full_determinism(seed)` in the engine
  (deterministic torch algorithms, seeded RNGs); also for a log-prob sub-job.
- `engine: "deepspeed"` + `deepspeed` (log-prob): the reference model on a forward-only
  DeepSpeed engine (`ds_scoring.py`) with these DeepSpeed keys (ZeRO stage, `offload_param`,
  ...); keys that only an optimizer uses are refused.
- `checkpoint_path` (training): an absolute directory on the server host. At start the sub-job
  resumes from the newest resumable checkpoint saved there (none: a fresh start); every
  `save-checkpoint` of the sub-job is also copied there (`{checkpoint_path}/{checkpoint_id}`).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

from ...rules.errors import ProtocolError
from ...rules.sub_jobs import refuse_unknown_keys

SCHEDULES = ("constant", "linear", "cosine")
SCHEDULER_KEYS = ("type", "warmup_steps", "total_steps", "min_lr_ratio")
ATTN = ("eager", "sdpa", "flash_attention_2", "flash_attention_3")
# the packages a flash attention implementation needs (besides CUDA)
FLASH_PACKAGES = {"flash_attention_2": "flash_attn", "flash_attention_3": "flash_attn_interface"}


def _bad(path: str, message: str, expected: Any, code: str = "invalid_argument") -> ProtocolError:
    return ProtocolError(code, f"field {path}: {message}", field=path, expected=expected)


def _int(value: Any, path: str, lo: int) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # Struct numbers arrive as floats over gRPC
    if not isinstance(value, int) or isinstance(value, bool) or value < lo:
        raise _bad(path, f"{value!r} is not an integer >= {lo}", f">= {lo}")
    return value


def check_scheduler(value: Any, path: str) -> dict[str, Any]:
    """A valid `lr_scheduler` with its defaults filled in."""
    if not isinstance(value, Mapping):
        raise _bad(path, f"{value!r} is not an object", '{"type": "cosine", ...}')
    refuse_unknown_keys(value, SCHEDULER_KEYS, path, "lr_scheduler")
    kind = value.get("type", "constant")
    if kind not in SCHEDULES:
        raise _bad(f"{path}.type", f"{kind!r} is not one of {list(SCHEDULES)}", list(SCHEDULES))
    warmup = _int(value.get("warmup_steps", 0), f"{path}.warmup_steps", 0)
    total = value.get("total_steps")
    if total is None and kind != "constant":
        msg = f"is required by a {kind} decay"
        raise _bad(f"{path}.total_steps", msg, ">= 1", "missing_field")
    total_n = _int(total, f"{path}.total_steps", 1) if total is not None else 0
    ratio = value.get("min_lr_ratio", 0.0)
    ok = isinstance(ratio, numbers.Real) and not isinstance(ratio, bool)
    if not ok or not (math.isfinite(float(ratio)) and 0.0 <= float(ratio) <= 1.0):
        raise _bad(f"{path}.min_lr_ratio", f"{ratio!r} is not a number in [0, 1]", "[0, 1]")
    return {"type": kind, "warmup_steps": warmup, "total_steps": total_n, "min_lr_ratio": ratio}


def lr_factor(t: int, sched: Mapping[str, Any]) -> float:
    """The schedule's multiplier of the optimizer's `lr` at optimizer step `t` (module doc)."""
    warmup = int(sched.get("warmup_steps") or 0)
    if t < warmup:
        return (t + 1) / warmup
    kind = sched.get("type", "constant")
    if kind == "constant":
        return 1.0
    low = float(sched.get("min_lr_ratio") or 0.0)
    span = max(1, int(sched.get("total_steps") or 1) - warmup)
    p = min(1.0, (t - warmup) / span)
    if kind == "linear":
        return low + (1.0 - low) * (1.0 - p)
    return low + (1.0 - low) * (1.0 + math.cos(math.pi * p)) / 2.0


def check_attn(value: Any, path: str) -> str:
    if value not in ATTN:
        raise _bad(path, f"{value!r} is not one of {list(ATTN)}", list(ATTN))
    return str(value)


def check_checkpoint_path(value: Any, path: str) -> str:
    """An absolute server-host directory path without `..` components."""
    if not isinstance(value, str) or not value or "\x00" in value:
        raise _bad(path, f"{value!r} is not a directory path", "an absolute directory path")
    p = PurePosixPath(value)
    if not p.is_absolute() or ".." in p.parts:
        raise _bad(path, f"{value!r} is not an absolute path without '..'", "an absolute path")
    return value


def check_bool(conf: Mapping[str, Any], key: str, path: str) -> None:
    v = conf.get(key)
    if v is not None and not isinstance(v, bool):
        raise _bad(f"{path}.{key}", f"{v!r} is not a boolean", "true or false")


#: keys of a training DeepSpeed config a forward-only engine has no use for
TRAINING_ONLY = ("optimizer", "scheduler", "gradient_clipping", "gradient_accumulation_steps")


def check_forward_only_deepspeed(ds: Mapping[str, Any], path: str) -> None:
    """A log-prob sub-job's `deepspeed` config: nothing an optimizer would need."""
    bad = [f"{path}.{k}" for k in TRAINING_ONLY if k in ds]
    zero = ds.get("zero_optimization")
    if isinstance(zero, Mapping) and "offload_optimizer" in zero:
        bad.append(f"{path}.zero_optimization.offload_optimizer")
    if bad:
        raise ProtocolError(
            "unsupported_option",
            f"the forward-only DeepSpeed log-prob engine has no optimizer: {', '.join(bad)} "
            "cannot apply",
            options=bad,
            field=bad[0],
        )
