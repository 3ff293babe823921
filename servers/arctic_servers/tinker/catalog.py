"""The models a server serves to Tinker clients: their names, context windows and tokenizers.

The Tinker surface is a client of the protocol, which has no model listing: the server that
mounts it says which base models its engines serve (`get_server_capabilities`, item 10 of
issue 31), how long a sequence each can take (`max_context_length`: the limit every Tinker
route enforces, and the `max_seq_len` its jobs' sub-jobs are created with, so the engines
enforce the same one) and where each model's tokenizer is (`/hf/...`, `hf_files.py`).

- `EmbeddedCatalog`: the DeepSpeed / vLLM engines (the on-prem server, the gateway's `onprem`
  engine): the embedded tiny models by name and any local Hugging Face directory; the context
  window is the model's `max_position_embeddings` (what vLLM's `max_model_len` defaults to).
- `StaticCatalog`: fixed names and one window (the fake engine: `FAKE_CONTEXT_LENGTH`).

Free of the `tinker` package (a server builds its catalog at start).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ..engines.fake.sampling import CONTEXT_LENGTH

__all__ = [
    "FAKE_CONTEXT_LENGTH",
    "FAKE_MODEL",
    "Catalog",
    "EmbeddedCatalog",
    "ModelInfo",
    "StaticCatalog",
    "engine_catalog",
]

#: The fake engine's context window (prompt + sampled tokens; a datum's model input): the fake
#: model's own (`engines/fake/sampling.py`), which its jobs enforce.
FAKE_CONTEXT_LENGTH = CONTEXT_LENGTH


@dataclass(frozen=True)
class ModelInfo:
    name: str
    context_length: int
    tokenizer_dir: Path | None = None  # a Hugging Face tokenizer directory, when there is one


class Catalog(Protocol):
    def names(self) -> Sequence[str]:
        """The base models `get_server_capabilities` lists (the server's own names)."""
        ...

    def info(self, name: str) -> ModelInfo | None:
        """The model `name` (may build or read files: call it off the event loop); None when
        this server does not serve it."""
        ...


class StaticCatalog:
    """Fixed model names, one context window, no tokenizer files (the fake engine)."""

    def __init__(
        self, names: Iterable[str], context_length: int = FAKE_CONTEXT_LENGTH, *, any_name: bool
    ) -> None:
        self._names = tuple(names)
        self.context_length = int(context_length)
        self.any_name = any_name  # the fake engine serves any model name

    def names(self) -> Sequence[str]:
        return self._names

    def info(self, name: str) -> ModelInfo | None:
        if name in self._names or (self.any_name and name):
            return ModelInfo(name, self.context_length)
        return None


class _ModelSettings(Protocol):
    @property
    def model(self) -> str: ...

    @property
    def tiny_model_seed(self) -> int: ...


class EmbeddedCatalog:
    """The DeepSpeed / vLLM engines' models: the embedded tiny ones by name (built on first
    use, cached) and local Hugging Face directories, as `engines.config.resolve_model` finds
    them for the workers."""

    PRIMARY = ("tiny-qwen2", "tiny-4l")  # listed; the other aliases resolve too

    def __init__(self, settings: _ModelSettings) -> None:
        self.settings = settings
        self._cache: dict[str, ModelInfo | None] = {}

    def names(self) -> Sequence[str]:
        return self.PRIMARY

    def info(self, name: str) -> ModelInfo | None:
        if name not in self._cache:
            self._cache[name] = self._resolve(name)
        return self._cache[name]

    def _resolve(self, name: str) -> ModelInfo | None:
        from ..engines.config import resolve_model
        from ..rules.errors import ProtocolError

        try:
            d = resolve_model(name, self.settings)
        except ProtocolError:
            return None
        return ModelInfo(name, context_window(d), d)


FAKE_MODEL = "fake-model"  # the name a fake-engine server lists (it serves any name)


def engine_catalog(engine: str) -> Catalog:
    """The gateway's catalog for its engine kind ("fake" or "onprem")."""
    if engine == "fake":
        return StaticCatalog((FAKE_MODEL,), any_name=True)
    from ..engines.config import ModelChoice

    return EmbeddedCatalog(ModelChoice())


def context_window(model_dir: Path) -> int:
    """A Hugging Face model directory's context window: `max_position_embeddings` of its
    config (of its text config for a multimodal one); 0 when it says none."""
    try:
        cfg: Any = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return 0
    for c in (cfg, cfg.get("text_config") or {}):
        v = c.get("max_position_embeddings") if isinstance(c, dict) else None
        if isinstance(v, int) and v > 0:
            return v
    return 0
