"""The losses' configuration (`training.proto` LossConfig, PROTOCOL.md §9): names, defaults and
the checks of `processing` and `context`, without torch, so a server can refuse a bad request
before anything is sent to a trainer (and without importing torch on its event loop)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

LOSS_FNS = ("cross_entropy", "grpo", "ppo", "importance_sampling", "cispo", "weighted_logprob")
ADVANTAGE_LOSSES = frozenset({"grpo", "ppo", "importance_sampling", "cispo"})
CLIPPED_LOSSES = frozenset({"grpo", "ppo", "cispo"})
AGG_MODES = ("token-mean", "seq-mean", "sum")
KL_TYPES = ("low_var_kl", "kl", "mse")
TOKEN_ALIGNED_KEYS = ("advantages", "loss_mask", "weights")
SHIFTED_KEYS = ("old_log_probs_shifted", "ref_log_probs_shifted")
CONTEXT_KEYS = ("input_ids", *TOKEN_ALIGNED_KEYS, *SHIFTED_KEYS)
IGNORE_INDEX = -100
# Deployed (arctic_platform / verl) knob names: refused like any unknown key, with a hint.
_DEPLOYED_NAMES = {
    "eps_clip_higher": "eps_clip_high",
    "clip_ratio": "eps_clip",
    "clip_ratio_low": "eps_clip",
    "clip_ratio_high": "eps_clip_high",
    "kl_loss_coef": "kl_coeff",
    "kl_loss_type": "kl_type",
    "use_kl_loss": "kl_coeff > 0",
    "dp_size": "nothing (ranks never scale the loss)",
    "batch_num_tokens": "global_num_tokens",
}


class LossConfigError(ValueError):
    """A `processing` / `context` the losses cannot honour; maps onto the spec's error body."""

    def __init__(
        self,
        code: str,
        field: str,
        message: str,
        *,
        expected: Any = None,
        options: Iterable[str] = (),
    ) -> None:
        super().__init__(message)
        self.code = code  # "invalid_argument" | "missing_field" | "unsupported_option" | ...
        self.field = field
        self.message = message
        self.expected = expected
        self.options = list(options)

    @property
    def details(self) -> dict[str, Any]:
        """`ErrorBody.details`: `field`, plus `expected` / `options` when set."""
        out: dict[str, Any] = {"field": self.field}
        if self.expected is not None:
            out["expected"] = self.expected
        if self.options:
            out["options"] = self.options
        return out


def config_error(
    field: str, message: str, expected: Any = None, code: str = "invalid_argument"
) -> LossConfigError:
    return LossConfigError(code, field, f"field {field}: {message}", expected=expected)


@dataclass(frozen=True)
class LossSettings:
    """`processing.loss_fn` and `processing.config` with the spec's defaults applied."""

    loss_fn: str = "cross_entropy"
    loss_agg_mode: str = "token-mean"
    global_num_tokens: int = 0
    eps_clip: float = 0.2
    eps_clip_high: float = 0.2
    entropy_coeff: float = 0.0
    kl_coeff: float = 0.0
    kl_type: str = "low_var_kl"
    temperature: float = 1.0

    @property
    def needs_entropy(self) -> bool:
        """The caller must pass `entropy_shifted` (with grad) to `compute_loss`."""
        return self.entropy_coeff != 0.0

    @property
    def required_context(self) -> tuple[str, ...]:
        """Context tensors this loss needs (`missing_field` when absent)."""
        names = [] if self.loss_fn == "cross_entropy" else ["loss_mask"]
        if self.loss_fn in ADVANTAGE_LOSSES:
            names.append("advantages")
        if self.loss_fn == "weighted_logprob":
            names.append("weights")
        if self.kl_coeff > 0:
            names.append("ref_log_probs_shifted")
        return tuple(names)


CONFIG_KEYS = tuple(f.name for f in fields(LossSettings) if f.name != "loss_fn")


def _number(cfg: Mapping[str, Any], name: str, default: float, want: str = "finite") -> float:
    """`cfg[name]` (None: `default`) as a float that is finite and `want` (">= 0" / "> 0")."""
    v = cfg.get(name)
    if v is None:
        return default
    x = float(v) if isinstance(v, numbers.Real) and not isinstance(v, bool) else math.nan
    ok = math.isfinite(x) and (x >= 0 if want == ">= 0" else x > 0 if want == "> 0" else True)
    if not ok:
        raise config_error(
            f"processing.config.{name}", f"{v!r} is not a number {want}", f"a number {want}"
        )
    return x


def _choice(cfg: Mapping[str, Any], name: str, known: tuple[str, ...], path: str) -> str:
    v = cfg.get(name) or known[0]
    if v not in known:
        raise config_error(path, f"{v!r} is not one of {list(known)}", list(known))
    return str(v)


def parse_processing(processing: Mapping[str, Any] | None) -> LossSettings:
    """Validate `processing` (`loss_fn`, `config`; `post` is the caller's) into LossSettings."""
    processing = processing or {}
    fn = _choice(processing, "loss_fn", LOSS_FNS, "processing.loss_fn")
    cfg = processing.get("config") or {}
    if not isinstance(cfg, Mapping):
        raise config_error("processing.config", f"{cfg!r} is not an object", "a LossConfig object")
    unknown = [str(k) for k in cfg if k not in CONFIG_KEYS]
    if unknown:
        paths = [f"processing.config.{k}" for k in unknown]
        hints = [f"{k} (use {_DEPLOYED_NAMES[k]})" for k in unknown if k in _DEPLOYED_NAMES]
        raise LossConfigError(
            "unsupported_option",
            paths[0],
            f"unknown option(s) {', '.join(paths)}; known: {list(CONFIG_KEYS)}"
            + (f"; deployed names: {', '.join(hints)}" if hints else ""),
            expected=list(CONFIG_KEYS),
            options=paths,
        )
    agg = _choice(cfg, "loss_agg_mode", AGG_MODES, "processing.config.loss_agg_mode")
    gnt_raw = cfg.get("global_num_tokens") or 0
    path = "processing.config.global_num_tokens"
    integral = isinstance(gnt_raw, numbers.Real) and float(gnt_raw).is_integer()
    if isinstance(gnt_raw, bool) or not integral or gnt_raw < 0:
        raise config_error(path, f"{gnt_raw!r} is not an integer >= 0", "an integer >= 0")
    gnt = int(gnt_raw)
    if gnt > 0 and agg != "token-mean":
        raise config_error(
            path, f"{gnt} needs loss_agg_mode token-mean, not {agg!r}", "0 or token-mean"
        )
    eps = _number(cfg, "eps_clip", 0.2, ">= 0")
    return LossSettings(
        loss_fn=fn,
        loss_agg_mode=agg,
        global_num_tokens=gnt,
        eps_clip=eps,
        eps_clip_high=_number(cfg, "eps_clip_high", eps, ">= 0"),
        entropy_coeff=_number(cfg, "entropy_coeff", 0.0),
        kl_coeff=_number(cfg, "kl_coeff", 0.0, ">= 0"),
        kl_type=_choice(cfg, "kl_type", KL_TYPES, "processing.config.kl_type"),
        temperature=_number(cfg, "temperature", 1.0, "> 0"),
    )


def check_context(settings: LossSettings, context: Mapping[str, Any]) -> None:
    """Raise `missing_field` for the first context tensor the loss needs but did not get."""
    for name in settings.required_context:
        if context.get(name) is None:
            why = " with kl_coeff > 0" if name == "ref_log_probs_shifted" else ""
            msg = f"is required by loss_fn {settings.loss_fn!r}{why}"
            raise config_error(f"context.{name}", msg, code="missing_field")
