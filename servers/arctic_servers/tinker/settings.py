"""`TinkerSettings`: how a server serves Tinker (the `--tinker-*` flags, `cli.py`).

Free of the `tinker` package, so a server reads and checks its settings at start and imports the
surface itself only when the first Tinker request comes (`mount`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .catalog import Catalog

__all__ = ["TinkerSettings"]


@dataclass
class TinkerSettings:
    """How a server serves Tinker. `lora`: "lora" (the default: a create_model's LoRA config
    becomes the training sub-job's `training_config.lora`, so the adapter is what trains and
    what syncs; a server without LoRA refuses the job naming `lora`), "refuse" (a create_model
    with a LoRA rank is refused, naming lora_config.rank) or "full_finetune" (an operator's
    explicit opt-in: LoRA requests train all weights, and get_info answers is_lora false)."""

    models: tuple[str, ...] = ()  # base models listed (empty: the catalog's names)
    only_listed: bool = False  # refuse other base models (else the server's job checks decide)
    lora: str = "lora"
    adam: Mapping[str, float] | None = None  # Adam's parameters at create_model (Tinker's)
    training_config: Mapping[str, Any] | None = None  # extra training_config keys
    # a cap on the models' context windows (0: each model's own, `catalog.py`)
    max_context_length: int = 0
    session_timeout_s: float = 180.0  # a session without a heartbeat this long expires
    # the models the server's engines serve (None: any name, the fake engine's window)
    catalog: Catalog | None = None
    # where sessions, models and futures are kept across restarts (None: memory only)
    state_path: str | None = None
