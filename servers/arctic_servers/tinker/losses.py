"""Tinker's losses on ours, exactly (Tinker docs "Loss functions"; `training.proto`).

Tinker's datum: model input x[0..N-1] and per-position inputs of shape [N], where position i
predicts `target_tokens[i]` (= the next input token), and every loss is a plain sum over
tokens. Ours: token-aligned `input_ids` (column i is token i), prediction-aligned
("shifted") log-probs, `loss_agg_mode` "sum". So a datum becomes the row x + [t[N-1]] (N + 1
columns; the last one only as a target), its token-aligned inputs move one column right
(column 0 is never a target) and its shifted inputs stay where they are.

Natively (one forward-backward of our loss of the same name):
- cross_entropy (target_tokens, weights; absent = 1) -> cross_entropy with `context.weights`
  (and `kwargs.labels` where the targets are not the next inputs);
- importance_sampling / ppo / cispo whose targets are the next inputs -> ours with
  `old_log_probs_shifted`, `advantages`, `loss_mask`, and eps_clip = 1 - low,
  eps_clip_high = high - 1 (Tinker's defaults: `tinker_losses.DEFAULTS`).

Through Tinker's own custom-loss decomposition (`tinker_losses.py`: a forward, then the linear
surrogate's forward-backward): dro (`beta` required: Tinker documents none), gspo
(`sequence_ratio_mask` required) and the ratio losses whose targets are not the next inputs.

Refused by name: `stable_reinforce` (Tinker does not publish its objective: it reads
"stability information" its sampler records, whose content is not documented, so no loss of
ours can claim to be it) and `custom` (server-side traced graphs; the SDK's client-side
`forward_backward_custom` sends cross_entropy, which works).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .errors import TinkerError
from .tinker_losses import DEFAULTS
from .wire import Datum, FwdBwd

__all__ = [
    "LOSSES",
    "REFUSED",
    "check",
    "from_protocol",
    "logprobs_of",
    "native",
    "surrogate",
    "to_protocol",
]

RATIO = ("target_tokens", "logprobs", "advantages")
CLIP = ("clip_low_threshold", "clip_high_threshold")
LOSSES: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    # loss: (required inputs, optional inputs, config keys)
    "cross_entropy": (("target_tokens",), ("weights",), ()),
    "importance_sampling": (RATIO, (), ()),
    "ppo": (RATIO, (), CLIP),
    "cispo": (RATIO, (), CLIP),
    "gspo": ((*RATIO, "sequence_ratio_mask"), (), CLIP),
    "dro": (RATIO, (), ("beta",)),
}
REQUIRED_CONFIG = {"dro": ("beta",)}
REFUSED = {
    "stable_reinforce": (
        "Tinker does not publish its objective (it reads 'stability information' recorded at "
        "sampling whose content is undocumented), so this server cannot claim to compute it; "
        "for off-policy data use 'ppo' or 'cispo' (the cookbook's AsyncConfig.loss_fn)"
    ),
    "custom": (
        "server-side custom losses (traced graphs) are not served; the SDK's client-side "
        "forward_backward_custom works"
    ),
}


def check(fb: FwdBwd) -> None:
    """Refuse what `to_protocol` cannot map (at submit, before the op is queued)."""
    if fb.loss_fn not in LOSSES:
        why = REFUSED.get(fb.loss_fn, "is unknown")
        raise TinkerError(
            400,
            f"loss_fn {fb.loss_fn!r}: {why}; served: {sorted(LOSSES)}",
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
    for k in REQUIRED_CONFIG.get(fb.loss_fn, ()):
        if k not in fb.config:
            raise TinkerError(
                400,
                f"loss_fn_config[{k!r}] is required by {fb.loss_fn!r} (Tinker documents no "
                f"default), e.g. {{'{k}': 0.05}}",
                "missing_field",
                field=f"loss_fn_config.{k}",
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
    if set(keys) == set(CLIP):
        lo, hi = _thresholds(fb)
        if not lo <= 1.0 <= hi:
            raise TinkerError(
                400,
                f"clip thresholds {lo} / {hi} must bracket 1 (low <= 1 <= high)",
                "invalid_argument",
                field="loss_fn_config",
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


def _thresholds(fb: FwdBwd) -> tuple[float, float]:
    cfg = {**DEFAULTS.get(fb.loss_fn, {}), **fb.config}
    return float(cfg["clip_low_threshold"]), float(cfg["clip_high_threshold"])


def _next_inputs(d: Datum) -> bool:
    t = d.inputs["target_tokens"].astype(np.int64)
    return bool(np.array_equal(t[:-1], d.tokens[1:]))


def native(fb: FwdBwd) -> bool:
    """Whether our loss of the same name computes `fb` exactly in one call (else the surface
    decomposes it, `tinker_losses.py`)."""
    if fb.loss_fn == "cross_entropy":
        return True
    if fb.loss_fn in ("importance_sampling", "ppo", "cispo"):
        return all(_next_inputs(d) for d in fb.data)
    return False


def _rows(fb: FwdBwd) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int]]:
    """input_ids [B, S], attention_mask, token-aligned labels (-100 = none) and the lengths."""
    lens = [d.tokens.size for d in fb.data]
    b, s = len(lens), max(lens) + 1
    ids = np.zeros((b, s), np.int64)
    mask = np.zeros((b, s), np.int64)
    labels = np.full((b, s), -100, np.int64)
    for i, d in enumerate(fb.data):
        n = lens[i]
        t = d.inputs["target_tokens"].astype(np.int64)
        ids[i, :n], ids[i, n] = d.tokens, t[-1]
        mask[i, : n + 1] = 1
        labels[i, 1 : n + 1] = t
    return ids, mask, labels, lens


def _body(
    kwargs: dict[str, Any], context: Mapping[str, Any], loss: str, config: dict[str, Any]
) -> dict[str, Any]:
    return {
        "args": [],
        "kwargs": kwargs,
        "context": dict(context),
        "processing": {"loss_fn": loss, "config": config, "post": ["compute_logprobs"]},
    }


def to_protocol(fb: FwdBwd) -> tuple[dict[str, Any], list[int]]:
    """Our forward-backward / forward body computing `fb` natively (`native`), and each
    datum's length."""
    check(fb)
    ids, mask, labels, lens = _rows(fb)
    b, s = ids.shape
    kwargs: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
    ctx: dict[str, np.ndarray] = {}
    config: dict[str, Any] = {"loss_agg_mode": "sum"}
    if fb.loss_fn == "cross_entropy":
        weights = ctx.setdefault("weights", np.zeros((b, s), np.float32))
        for i, d in enumerate(fb.data):
            w = d.inputs.get("weights")
            weights[i, 1 : lens[i] + 1] = 1.0 if w is None else w.astype(np.float32)
        if not all(_next_inputs(d) for d in fb.data):
            kwargs["labels"] = labels
        return _body(kwargs, ctx, fb.loss_fn, config), lens
    ctx["loss_mask"] = np.zeros((b, s), np.float32)
    ctx["advantages"] = np.zeros((b, s), np.float32)
    ctx["old_log_probs_shifted"] = np.zeros((b, s), np.float32)
    for i, d in enumerate(fb.data):
        n = lens[i]
        ctx["loss_mask"][i, 1 : n + 1] = 1.0
        ctx["advantages"][i, 1 : n + 1] = d.inputs["advantages"].astype(np.float32)
        ctx["old_log_probs_shifted"][i, :n] = d.inputs["logprobs"].astype(np.float32)
    if fb.loss_fn in ("ppo", "cispo"):
        lo, hi = _thresholds(fb)
        config.update(eps_clip=1.0 - lo, eps_clip_high=hi - 1.0)
    return _body(kwargs, ctx, fb.loss_fn, config), lens


def surrogate(fb: FwdBwd, grads: Sequence[np.ndarray] | None) -> dict[str, Any]:
    """The body of the decomposition's calls (`tinker_losses.py`): cross_entropy on the
    targets (`labels`) with `weights` = -d loss / d lp (None: ones, for the forward that reads
    lp), summed."""
    check(fb)
    ids, mask, labels, lens = _rows(fb)
    weights = np.zeros(ids.shape, np.float32)
    for i, n in enumerate(lens):
        weights[i, 1 : n + 1] = 1.0 if grads is None else -np.asarray(grads[i], np.float32)
    kwargs = {"input_ids": ids, "attention_mask": mask, "labels": labels}
    return _body(kwargs, {"weights": weights}, "cross_entropy", {"loss_agg_mode": "sum"})


def _array(v: Any) -> np.ndarray:
    """A result tensor as float32 NumPy: results reach the surface as the servicer returned
    them (`backend.py`), a NumPy array or, from an engine in this process, a torch tensor."""
    if hasattr(v, "detach"):  # torch (also bf16, which NumPy lacks)
        v = v.detach().float().cpu().numpy()
    return np.asarray(v, dtype=np.float32)


METRIC_REDUCTIONS = {"num_tokens": "sum", "clip_fraction": "mean", "approx_kl": "mean"}


def logprobs_of(result: Mapping[str, Any], lens: Sequence[int]) -> list[np.ndarray]:
    """Each datum's target log-probs [N] in a forward(-backward) result."""
    lp = _array((result.get("outputs") or {}).get("logprobs_shifted"))
    if lp.ndim != 2 or lp.shape[0] != len(lens):
        raise TinkerError(502, f"the trainer answered log-probs of shape {lp.shape}", "internal")
    return [lp[i, :n].copy() for i, n in enumerate(lens)]


def from_protocol(
    result: Mapping[str, Any], lens: Sequence[int]
) -> tuple[list[np.ndarray], dict[str, float]]:
    """Each datum's target log-probs [N] and Tinker metrics (`name:reduction` keys)."""
    out = logprobs_of(result, lens)
    metrics = {"loss:sum": float(result.get("loss") or 0.0)}
    for k, red in METRIC_REDUCTIONS.items():
        v = (result.get("metrics") or {}).get(k)
        if v is not None:
            metrics[f"{k}:{red}"] = float(v)
    return out, metrics
