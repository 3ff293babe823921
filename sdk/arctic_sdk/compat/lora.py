"""verl's and SkyRL's LoRA fields onto the protocol's `training_config.lora` (PROTOCOL.md §3.6).

A legacy `training_config` may carry LoRA in either framework's shape:

- verl (`actor_rollout_ref.model.*`): flat `lora_rank` (0 = off), `lora_alpha`, `target_modules`
  (`"all-linear"` or a list), `exclude_modules`, `use_shm`, `layered_summon`,
  `lora_adapter_path`;
- SkyRL (`trainer.policy.model.lora`): a `lora` block with `rank` (0 = off), `alpha`, `dropout`,
  `target_modules`, `exclude_modules`, `init_method`, `lora_sync_path`, `max_loras`.

`lora_fields` maps them field by field: rank, alpha, dropout and target modules are sent (the
server checks them with the rules every server shares); `init_method: "kaiming"` is what the
server does (PEFT's default: Kaiming-uniform A, zero B) and others are refused; the
framework-side memory and transport knobs (`use_shm`, `layered_summon`, `lora_sync_path`,
`max_loras`) decide nothing here — the server syncs the adapter itself — and are reported as
accepted without effect; `exclude_modules` (name the kept ones in `target_modules` instead) and
`lora_adapter_path` (a pretrained adapter to start from) are refused by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["LORA_TRAINING_KEYS", "LoraFields", "lora_fields"]

VERL_KEYS = (
    "lora_rank",
    "lora_alpha",
    "target_modules",
    "exclude_modules",
    "use_shm",
    "layered_summon",
    "lora_adapter_path",
)
SKYRL_KEYS = frozenset(
    {
        "rank",
        "alpha",
        "dropout",
        "target_modules",
        "exclude_modules",
        "init_method",
        "lora_sync_path",
        "max_loras",
    }
)
#: the legacy `training_config` keys this module reads
LORA_TRAINING_KEYS = frozenset({"lora", *VERL_KEYS})
NO_EFFECT = ("use_shm", "layered_summon", "lora_sync_path", "max_loras")


@dataclass
class LoraFields:
    """The protocol's `lora` (None: no LoRA) and what the mapping refused / found no use for."""

    lora: dict[str, Any] | None = None
    problems: list[str] = field(default_factory=list)
    no_effect: list[str] = field(default_factory=list)


def lora_fields(tc: Mapping[str, Any]) -> LoraFields:
    """The LoRA fields of a legacy `training_config` (verl's flat ones or SkyRL's `lora`)."""
    out = LoraFields()
    block = tc.get("lora")
    flat = {k: tc[k] for k in VERL_KEYS if tc.get(k) is not None}
    if block is not None and flat:
        out.problems.append(
            f"training_config.lora (and verl's {sorted(flat)} both set LoRA; use one shape)"
        )
        return out
    if block is not None:
        if not isinstance(block, Mapping):
            out.problems.append("training_config.lora (must be an object, SkyRL's lora block)")
            return out
        prefix = "training_config.lora."
        for k in sorted(set(block) - SKYRL_KEYS):
            out.problems.append(f"{prefix}{k} (unknown; known: {sorted(SKYRL_KEYS)})")
        src, name = dict(block), {k: k for k in SKYRL_KEYS}
    else:
        prefix = "training_config."
        name = {k: k for k in VERL_KEYS} | {"rank": "lora_rank", "alpha": "lora_alpha"}
        src = {{"lora_rank": "rank", "lora_alpha": "alpha"}.get(k, k): v for k, v in flat.items()}
    rank = src.get("rank")
    if not rank:  # both frameworks: rank 0 (or absent) = no LoRA
        extra = sorted(name.get(k, k) for k in src if k != "rank")
        if extra:
            out.problems.append(
                f"{prefix}{extra[0]} (a LoRA field, but the LoRA rank is 0: LoRA is off)"
            )
        return out
    lora: dict[str, Any] = {"rank": rank}
    for k in ("alpha", "dropout", "target_modules"):
        if src.get(k) is not None:
            lora[k] = src[k]
    if src.get("exclude_modules"):
        out.problems.append(
            f"{prefix}exclude_modules (name the modules to adapt in target_modules instead)"
        )
    if src.get("lora_adapter_path"):
        out.problems.append(
            f"{prefix}lora_adapter_path (starting from a pretrained adapter is not offered)"
        )
    init = src.get("init_method")
    if init is not None and str(init).lower() not in ("kaiming", "default"):
        out.problems.append(
            f"{prefix}init_method ({init!r}: the server initialises as PEFT does, Kaiming A "
            "and zero B, i.e. 'kaiming')"
        )
    out.no_effect += [f"{prefix}{name[k]}" for k in NO_EFFECT if src.get(k) is not None]
    out.lora = lora
    return out
