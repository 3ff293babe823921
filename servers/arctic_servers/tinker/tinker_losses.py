"""Tinker's RL losses as Tinker's docs define them ("Loss functions": importance_sampling, ppo,
cispo, dro, gspo), per datum, on the target log-probs `lp` [N] of a forward: the loss and its
derivative d loss / d lp.

`losses.py` serves a loss whose targets are the datum's next inputs natively (our protocol's
loss of the same name, one forward-backward). Otherwise — `dro` and `gspo`, which our protocol
has no loss for, and any RL loss whose `target_tokens` are not the next inputs (the cookbook's
`rl_loop` pads prompt positions with target 0) — the surface does what Tinker's own
`forward_backward_custom` does: a forward for `lp`, then a forward-backward of the linear
surrogate `sum(-g * lp)` with `g = -d loss / d lp` (cross_entropy with `labels` = the targets,
`weights` = g, `loss_agg_mode` "sum"), whose gradient is exactly the loss's: the trainer's
weights do not change between the two calls (they run in the model's turn).

Every loss is a plain sum over tokens (Tinker's). `r = exp(lp - q)`, `q` = `logprobs` (the
sampler's), `A` = `advantages`.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

__all__ = ["DEFAULTS", "loss_and_grad"]

F64 = npt.NDArray[np.float64]

# Tinker's defaults of `loss_fn_config` (docs "Loss functions"): ppo's epsilon is 0.2; cispo
# clips its ratio coefficient to [0, 4]; gspo's page gives the PPO-style clip without a number
# of its own, so it takes ppo's; dro documents no default beta (`losses.py` requires it).
DEFAULTS: Mapping[str, Mapping[str, float]] = {
    "importance_sampling": {},
    "ppo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    "cispo": {"clip_low_threshold": 0.0, "clip_high_threshold": 4.0},
    "gspo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    "dro": {},
}


def _clipped_pg(ratio: F64, adv: F64, lo: float, hi: float) -> tuple[float, F64]:
    """-sum(min(ratio * A, clip(ratio, lo, hi) * A)) and d/d lp where d ratio / d lp = ratio:
    zero where the clipped term is the smaller and its clip is active."""
    clipped = np.clip(ratio, lo, hi)
    loss = -float(np.minimum(ratio * adv, clipped * adv).sum())
    dead = (clipped * adv < ratio * adv) & (clipped != ratio)
    grad = np.where(dead, 0.0, -adv * ratio)
    return loss, grad


def loss_and_grad(
    loss_fn: str,
    lp: F64,
    inputs: Mapping[str, npt.NDArray[np.generic]],
    config: Mapping[str, float | str],
) -> tuple[float, F64]:
    """One datum's loss and d loss / d lp ([N], float64) under Tinker's definition of
    `loss_fn`, `config` being the request's `loss_fn_config` over `DEFAULTS`."""
    cfg = {**DEFAULTS[loss_fn], **config}
    q = np.asarray(inputs["logprobs"], np.float64)
    adv = np.asarray(inputs["advantages"], np.float64)
    ratio = np.exp(lp - q)
    lo = float(cfg.get("clip_low_threshold", 0.0))
    hi = float(cfg.get("clip_high_threshold", 0.0))
    if loss_fn == "importance_sampling":
        return -float((ratio * adv).sum()), -adv * ratio
    if loss_fn == "ppo":
        return _clipped_pg(ratio, adv, lo, hi)
    if loss_fn == "cispo":  # sg(clip(r)) * lp * A: the coefficient carries no gradient
        coef = np.clip(ratio, lo, hi)
        return -float((coef * lp * adv).sum()), -coef * adv
    if loss_fn == "dro":
        beta = float(cfg["beta"])
        d = lp - q
        return -float((lp * adv - 0.5 * beta * d * d).sum()), -(adv - beta * d)
    if loss_fn == "gspo":
        # GSPO-token: every token's ratio has the value of the sequence ratio s (the geometric
        # mean of the per-token ratios over `sequence_ratio_mask`) and its own lp's gradient
        mask = np.asarray(inputs["sequence_ratio_mask"]) != 0
        s = float(np.exp((lp - q)[mask].mean())) if mask.any() else 1.0
        return _clipped_pg(np.full_like(lp, s), adv, lo, hi)
    raise ValueError(f"no Tinker formula for {loss_fn!r}")
