"""The loss table's NumPy reference: each loss's per-token formula, in float64.

The fake engine (`engines/fake/numerics.py`, NUMERICS.md §3) computes its losses with these, on
its deterministic log-probs; the trainer runs the same formulas in torch (`torch_losses.py`), and
both read the declarations of `table.py` (names, options, defaults). A new loss: its name in
`table.py`, a branch here and one in `torch_losses.compute_loss`, the proto, and their tests.
Arrays are token-aligned [B, S] (column i: the prediction of token i), masked by `m`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .table import ADVANTAGE_LOSSES, LossSettings

F64 = npt.NDArray[np.float64]


@dataclass
class LossTerms:
    """A call's loss context besides its log-probs (None when absent)."""

    old: F64 | None = None  # the behaviour policy's log-probs (absent: the current ones)
    advantages: F64 | None = None
    weights: F64 | None = None
    ref: F64 | None = None  # the reference policy's log-probs (KL)
    entropy: F64 | None = None  # needed when entropy_coeff != 0


def token_losses(lp: F64, m: F64, spec: LossSettings, x: LossTerms) -> tuple[F64, dict[str, Any]]:
    """Each token's weighted loss (their sum is the call's loss) and the loss's metrics."""
    on = m != 0
    old = lp if x.old is None else x.old
    adv = np.zeros_like(lp) if x.advantages is None else x.advantages
    metrics: dict[str, Any] = {}
    ratio = np.exp(lp - old)
    if spec.loss_fn == "cross_entropy":  # per-token weights, absent = 1
        per = -lp if x.weights is None else -x.weights * lp
    elif spec.loss_fn == "weighted_logprob":
        assert x.weights is not None
        per = -x.weights * lp
    elif spec.loss_fn == "importance_sampling":
        per = -ratio * adv
    elif spec.loss_fn in ("ppo", "grpo"):
        clipped = np.clip(ratio, 1.0 - spec.eps_clip, 1.0 + spec.eps_clip_high)
        per = np.maximum(-ratio * adv, -clipped * adv)
        metrics["clip_fraction"] = mean(((-clipped * adv) > (-ratio * adv)), on)
    else:  # cispo: -stopgrad(clip(r, 1 - eps_clip, 1 + eps_clip_high)) * A * logp
        lo, hi = 1.0 - spec.eps_clip, 1.0 + spec.eps_clip_high
        per = -np.clip(ratio, lo, hi) * adv * lp
        metrics["clip_fraction"] = mean((ratio < lo) | (ratio > hi), on)
    if spec.loss_fn in ADVANTAGE_LOSSES:
        metrics["approx_kl"] = mean(old - lp, on)
    if x.ref is not None:  # reported whenever given; a penalty when kl_coeff > 0
        kl = kl_term(lp, x.ref, spec.kl_type)
        if spec.kl_coeff > 0:
            per = per + spec.kl_coeff * kl
        metrics["kl"] = mean(kl, on)
    if spec.needs_entropy:
        assert x.entropy is not None
        per = per - spec.entropy_coeff * x.entropy
    return agg_weights(m, spec) * per, metrics


def kl_term(lp: F64, ref: F64, kl_type: str) -> F64:
    """k1 ("kl") = lp - ref; k2 ("mse") = (lp - ref)^2 / 2; k3 ("low_var_kl") = e^d - d - 1.

    Here d = ref - lp.
    """
    if kl_type == "kl":
        return lp - ref
    if kl_type == "mse":
        return 0.5 * (lp - ref) ** 2
    d = np.clip(ref - lp, -20.0, 20.0)
    return np.asarray(np.clip(np.exp(d) - d - 1.0, -10.0, 10.0), np.float64)


def agg_weights(m: F64, spec: LossSettings) -> F64:
    """Per-token weight w so that loss = sum(w * per_token_loss) (NUMERICS.md §3.3)."""
    if spec.loss_agg_mode == "sum":
        return m
    if spec.loss_agg_mode == "seq-mean":
        row = m.sum(axis=1, keepdims=True)
        rows = int((row[:, 0] > 0).sum())
        if rows == 0:
            return np.zeros_like(m)
        out: F64 = np.divide(m, row * rows, out=np.zeros_like(m), where=row > 0)
        return out
    denom = float(spec.global_num_tokens) if spec.global_num_tokens > 0 else float(m.sum())
    return m / denom if denom > 0 else np.zeros_like(m)


def mean(values: Any, on: npt.NDArray[np.bool_]) -> float:
    """The mean of `values` over the masked-in tokens (0 when there are none)."""
    n = int(on.sum())
    return float(np.asarray(values, np.float64)[on].sum() / n) if n else 0.0
