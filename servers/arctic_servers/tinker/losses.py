"""Tinker's losses on our losses, exactly (Tinker docs "Loss functions"; `training.proto`).

Tinker's datum: model input x[0..N-1] and per-position inputs of shape [N], where position i
predicts `target_tokens[i]` (= the next input token), and every loss is a plain sum over
tokens. Ours: token-aligned `input_ids` (column i is token i), prediction-aligned
("shifted") log-probs, `loss_agg_mode` "sum". So a datum becomes the row x + [t[N-1]] (N + 1
columns; the last one only as a target), its token-aligned inputs move one column right
(column 0 is never a target) and its shifted inputs stay where they are:

- cross_entropy (target_tokens, weights; absent = 1) -> cross_entropy with `context.weights`
  (and `kwargs.labels` where the targets are not the next inputs);
- importance_sampling (target_tokens, logprobs, advantages) -> importance_sampling with
  `old_log_probs_shifted`, `advantages`, `loss_mask`;
- ppo / cispo (the same, + clip_low_threshold / clip_high_threshold, ratio bounds) -> ppo /
  cispo with eps_clip = 1 - low, eps_clip_high = high - 1.

dro, gspo, stable_reinforce and custom (server side) have no loss of ours: refused by name
(the SDK's `forward_backward_custom` runs client-side and sends cross_entropy, which works).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .errors import TinkerError
from .wire import Datum, FwdBwd

__all__ = ["LOSSES", "REFUSED", "check", "from_protocol", "to_protocol"]

RATIO = ("target_tokens", "logprobs", "advantages")
LOSSES: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    # loss: (required inputs, optional inputs, config keys)
    "cross_entropy": (("target_tokens",), ("weights",), ()),
    "importance_sampling": (RATIO, (), ()),
    "ppo": (RATIO, (), ("clip_low_threshold", "clip_high_threshold")),
    "cispo": (RATIO, (), ("clip_low_threshold", "clip_high_threshold")),
}
REFUSED = ("dro", "gspo", "stable_reinforce", "custom")


def check(fb: FwdBwd) -> None:
    """Refuse what `to_protocol` cannot map (at submit, before the op is queued)."""
    if fb.loss_fn not in LOSSES:
        why = "has no equivalent loss on this server" if fb.loss_fn in REFUSED else "is unknown"
        raise TinkerError(
            400,
            f"loss_fn {fb.loss_fn!r} {why}; served: {sorted(LOSSES)}",
            "unsupported_option",
            field="loss_fn",
        )
    if not fb.data:
        raise TinkerError(400, "data is empty: send at least one Datum", "invalid_argument")
    required, optional, keys = LOSSES[fb.loss_fn]
    extra = sorted(set(fb.config) - set(keys))
    if extra:
        raise TinkerError(
            400,
            f"loss_fn_config key(s) {extra} are not read by {fb.loss_fn!r}; it reads "
            f"{list(keys) or 'none'}",
            "unsupported_option",
            field="loss_fn_config",
        )
    for k in keys:
        v = fb.config.get(k)
        if v is not None and (isinstance(v, str) or not np.isfinite(v) or v < 0):
            raise TinkerError(
                400,
                f"loss_fn_config[{k!r}] = {v!r}; expected a finite number >= 0",
                "invalid_argument",
                field=f"loss_fn_config.{k}",
            )
    for i, d in enumerate(fb.data):
        n = d.tokens.size
        missing = [k for k in required if k not in d.inputs]
        unknown = sorted(set(d.inputs) - set(required) - set(optional))
        if missing or unknown:
            raise TinkerError(
                400,
                f"data[{i}].loss_fn_inputs: {fb.loss_fn!r} needs {list(required)} "
                f"(optional {list(optional)}); missing {missing}, not read {unknown}",
                "invalid_argument",
                field="loss_fn_inputs",
            )
        for k, a in d.inputs.items():
            if a.size != n:
                raise TinkerError(
                    400,
                    f"data[{i}].loss_fn_inputs[{k!r}] has {a.size} values; the model input "
                    f"has {n} tokens (one value per position)",
                    "shape_mismatch",
                    field=f"loss_fn_inputs.{k}",
                )


def _clip(config: Mapping[str, float | str]) -> dict[str, float]:
    out = {}
    if "clip_low_threshold" in config:
        out["eps_clip"] = 1.0 - float(config["clip_low_threshold"])
    if "clip_high_threshold" in config:
        out["eps_clip_high"] = float(config["clip_high_threshold"]) - 1.0
    if out.get("eps_clip", 0.0) < 0 or out.get("eps_clip_high", 0.0) < 0:
        raise TinkerError(
            400,
            f"clip thresholds {dict(config)} must bracket 1 (low <= 1 <= high)",
            "invalid_argument",
            field="loss_fn_config",
        )
    return out


def _next_inputs(d: Datum) -> bool:
    t = d.inputs["target_tokens"].astype(np.int64)
    return bool(np.array_equal(t[:-1], d.tokens[1:]))


def to_protocol(fb: FwdBwd) -> tuple[dict[str, Any], list[int]]:
    """Our forward-backward / forward body for a Tinker request, and each datum's length."""
    check(fb)
    ce = fb.loss_fn == "cross_entropy"
    if not ce:
        for i, d in enumerate(fb.data):
            if not _next_inputs(d):
                raise TinkerError(
                    400,
                    f"data[{i}].loss_fn_inputs['target_tokens'] are not the model input "
                    f"shifted by one (target_tokens[i] == model_input[i + 1]); {fb.loss_fn!r} "
                    "scores the sequence's own next tokens here",
                    "invalid_argument",
                    field="loss_fn_inputs.target_tokens",
                )
    lens = [d.tokens.size for d in fb.data]
    b, s = len(lens), max(lens) + 1
    ids = np.zeros((b, s), np.int64)
    mask = np.zeros((b, s), np.int64)
    labels = np.full((b, s), -100, np.int64)
    aligned: dict[str, np.ndarray] = {}
    shifted: dict[str, np.ndarray] = {}
    for i, d in enumerate(fb.data):
        n = lens[i]
        t = d.inputs["target_tokens"].astype(np.int64)
        ids[i, :n], ids[i, n] = d.tokens, t[-1]
        mask[i, : n + 1] = 1
        labels[i, 1 : n + 1] = t
        if ce:
            w = d.inputs.get("weights")
            weights = aligned.setdefault("weights", np.zeros((b, s), np.float32))
            weights[i, 1 : n + 1] = 1.0 if w is None else w.astype(np.float32)
        else:
            aligned.setdefault("loss_mask", np.zeros((b, s), np.float32))[i, 1 : n + 1] = 1.0
            adv = aligned.setdefault("advantages", np.zeros((b, s), np.float32))
            adv[i, 1 : n + 1] = d.inputs["advantages"].astype(np.float32)
            old = shifted.setdefault("old_log_probs_shifted", np.zeros((b, s), np.float32))
            old[i, :n] = d.inputs["logprobs"].astype(np.float32)
    kwargs: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
    if ce and not all(_next_inputs(d) for d in fb.data):
        kwargs["labels"] = labels
    config: dict[str, Any] = {"loss_agg_mode": "sum", **_clip(fb.config)}
    body = {
        "args": [],
        "kwargs": kwargs,
        "context": {**aligned, **shifted},
        "processing": {"loss_fn": fb.loss_fn, "config": config, "post": ["compute_logprobs"]},
    }
    return body, lens


METRIC_REDUCTIONS = {"num_tokens": "sum", "clip_fraction": "mean", "approx_kl": "mean"}


def from_protocol(
    result: Mapping[str, Any], lens: Sequence[int]
) -> tuple[list[np.ndarray], dict[str, float]]:
    """Each datum's target log-probs [N] and Tinker metrics (`name:reduction` keys)."""
    lp = np.asarray((result.get("outputs") or {}).get("logprobs_shifted"), dtype=np.float32)
    if lp.ndim != 2 or lp.shape[0] != len(lens):
        raise TinkerError(502, f"the trainer answered log-probs of shape {lp.shape}", "internal")
    out = [lp[i, :n].copy() for i, n in enumerate(lens)]
    metrics = {"loss:sum": float(result.get("loss") or 0.0)}
    for k, red in METRIC_REDUCTIONS.items():
        v = (result.get("metrics") or {}).get(k)
        if v is not None:
            metrics[f"{k}:{red}"] = float(v)
    return out, metrics
