"""Losses of the on-prem trainer (`training.proto`, PROTOCOL.md §9): pure torch, no I/O.

Alignment. `input_ids[:, i]` is token i. A *shifted* (prediction-aligned) tensor `t` has in
column i the value for predicting token i + 1, last column 0: `logprobs_shifted`, `entropy`,
`old_log_probs_shifted`, `ref_log_probs_shifted`, and the mask of `prediction_mask`.
`advantages`, `loss_mask` and `weights` are token-aligned; `_to_prediction` moves them to the
prediction alignment (column i <- column i + 1), so a mask on token i trains prediction i - 1 and
column 0 is never trained. Rows may be left- or right-padded: a prediction counts only when both
its context column and its target column are real.

`loss_mask` values are per-token weights >= 0 (0/1 in the common case): `num_tokens` counts the
non-zero ones and `token-mean` divides by their sum (= the count for a 0/1 mask).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .table import (
    AGG_MODES,
    CONFIG_KEYS,
    CONTEXT_KEYS,
    IGNORE_INDEX,
    KL_TYPES,
    LOSS_FNS,
    SHIFTED_KEYS,
    TOKEN_ALIGNED_KEYS,
    LossConfigError,
    LossSettings,
    check_context,
    config_error,
    parse_processing,
)

_LOG_RATIO_CLAMP = 20.0  # |log π/π_old| and the k3 exponent are clamped here, as verl does
_K3_CLAMP = 10.0
_CHUNK_ELEMENTS = 1 << 27  # row-chunk budget (logit elements) of `shifted_logprobs` without grad


@dataclass
class LossResult:
    loss: Tensor  # scalar; backprop this
    metrics: dict[str, float]


def shifted_logprobs(
    logits: Tensor,
    input_ids: Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """[B, S, V] logits -> ([B, S] F32 log-prob of `input_ids[:, i + 1]`, entropy or None).

    Both last columns are 0, and so is a column whose target id lies outside [0, V) (padding
    ids may be anything; real ids are the caller's to validate). One log_softmax serves both
    outputs; without autograd the rows are processed in chunks to bound peak memory. With
    `entropy_grad=False` the entropy is a detached metric and costs no saved activations.
    """
    if logits.dim() != 3 or tuple(logits.shape[:2]) != tuple(input_ids.shape):
        msg = f"shape {list(logits.shape)} does not match input_ids {list(input_ids.shape)}"
        raise config_error("logits", msg, "[B, S, V]", code="shape_mismatch")
    if not temperature > 0:
        raise config_error("processing.config.temperature", f"{temperature!r} is not > 0", "> 0")
    b, s, v = logits.shape
    zeros = torch.zeros((b, 1), dtype=torch.float32, device=logits.device)
    if s < 2:
        return zeros.expand(b, s).clone(), zeros.expand(b, s).clone() if with_entropy else None
    tgt = input_ids[:, 1:].to(device=logits.device, dtype=torch.long)
    bad = (tgt < 0) | (tgt >= v)
    tgt = tgt.clamp(0, v - 1).unsqueeze(-1)
    grad = torch.is_grad_enabled() and logits.requires_grad
    rows = b if grad else max(1, _CHUNK_ELEMENTS // max(1, (s - 1) * v))
    lps: list[Tensor] = []
    ents: list[Tensor] = []
    for r in range(0, b, rows):
        x = logits[r : r + rows, :-1].float()
        if temperature != 1.0:
            x = x / temperature
        lsm = torch.log_softmax(x, dim=-1)
        lps.append(lsm.gather(-1, tgt[r : r + rows]).squeeze(-1))
        if with_entropy:
            with torch.set_grad_enabled(grad and entropy_grad):
                p = lsm.exp()
                ents.append(-(p * torch.where(p > 0, lsm, 0.0)).sum(-1))
        del x, lsm
    lp = torch.cat([torch.cat(lps).masked_fill(bad, 0.0), zeros], dim=1)
    ent = torch.cat([torch.cat(ents).masked_fill(bad, 0.0), zeros], dim=1) if ents else None
    return lp, ent


def cross_entropy_targets(input_ids: Tensor, labels: Tensor | None) -> Tensor:
    """Ids `shifted_logprobs` scores for SFT: `labels` where != -100, else `input_ids`."""
    if labels is None:
        return input_ids
    return torch.where(labels == IGNORE_INDEX, input_ids, labels.to(input_ids.dtype))


def _to_prediction(t: Tensor) -> Tensor:
    """Token-aligned -> prediction-aligned: column i takes column i + 1; the last column is 0."""
    return torch.cat([t[:, 1:], torch.zeros_like(t[:, :1])], dim=1)


def prediction_mask(
    input_ids: Tensor,
    attention_mask: Tensor | None,
    loss_mask: Tensor | None,
    labels: Tensor | None,
    loss_fn: str,
) -> Tensor:
    """[B, S] float mask in the prediction alignment (see the module docstring); last column 0.

    Column i is the weight of predicting token i + 1: `loss_mask[:, i + 1]` (else, for
    cross_entropy, `labels[:, i + 1] != -100`, else 1), times "columns i and i + 1 are real".
    """
    real = (
        torch.ones(input_ids.shape, device=input_ids.device)
        if attention_mask is None
        else (attention_mask != 0).float()
    )
    if loss_mask is not None:
        base = loss_mask.to(device=real.device, dtype=torch.float32)
    elif loss_fn != "cross_entropy":
        raise config_error(
            "context.loss_mask", f"is required by loss_fn {loss_fn!r}", code="missing_field"
        )
    elif labels is not None:
        base = (labels != IGNORE_INDEX).to(device=real.device, dtype=torch.float32)
    else:
        base = torch.ones_like(real)
    pair = real * _to_prediction(real)
    return _to_prediction(base) * pair


def _check_tensors(
    shape: tuple[int, ...], named: Mapping[str, Tensor | None], finite: bool = True
) -> None:
    for name, t in named.items():
        if t is None:
            continue
        if tuple(t.shape) != shape:
            msg = f"has shape {list(t.shape)}, input_ids {list(shape)}"
            raise config_error(name, msg, f"shape {list(shape)}", code="shape_mismatch")
        if finite and t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise config_error(name, "holds NaN or infinity", "finite values")


def _kl(lp: Tensor, ref: Tensor, kl_type: str) -> Tensor:
    """k1 ("kl") = lp - ref; k2 ("mse") = (lp - ref)^2 / 2; k3 ("low_var_kl", verl-clamped)."""
    if kl_type == "kl":
        return lp - ref
    if kl_type == "mse":
        return 0.5 * (lp - ref).square()
    d = (ref - lp).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    return (d.exp() - d - 1.0).clamp(-_K3_CLAMP, _K3_CLAMP)


def _agg_weights(m: Tensor, st: LossSettings) -> Tensor:
    """g with loss = sum(g * per_token_loss) for `loss_agg_mode` (PROTOCOL.md §9)."""
    if st.loss_agg_mode == "sum":
        return m
    if st.loss_agg_mode == "seq-mean":
        row = m.sum(dim=1, keepdim=True)
        rows = int((row > 0).sum())
        return torch.where(row > 0, m / (row.clamp_min(1e-30) * max(rows, 1)), 0.0)
    denom = float(st.global_num_tokens) if st.global_num_tokens > 0 else float(m.sum())
    return m / denom if denom > 0 else torch.zeros_like(m)


def compute_loss(
    logprobs_shifted: Tensor,
    *,
    input_ids: Tensor,
    attention_mask: Tensor | None,
    context: Mapping[str, Tensor | None],
    processing: Mapping[str, Any] | None,
    entropy_shifted: Tensor | None = None,
    labels: Tensor | None = None,
) -> LossResult:
    """The loss of one forward-backward call and its metrics (module docstring for alignment).

    `logprobs_shifted` comes from `shifted_logprobs` (with `config.temperature`, and for
    cross_entropy with `labels` of `cross_entropy_targets`); `labels` (kwargs.labels) only
    selects cross_entropy's tokens when `context.loss_mask` is absent.
    """
    st = parse_processing(processing)
    check_context(st, context)
    shape = tuple(input_ids.shape)
    if len(shape) != 2:
        raise config_error(
            "kwargs.input_ids", f"has shape {list(shape)}", "[B, S]", "shape_mismatch"
        )
    outputs = {"logprobs_shifted": logprobs_shifted, "entropy_shifted": entropy_shifted}
    _check_tensors(shape, outputs, finite=False)
    _check_tensors(shape, {"kwargs.attention_mask": attention_mask, "kwargs.labels": labels})
    _check_tensors(shape, {f"context.{k}": context.get(k) for k in CONTEXT_KEYS})
    ctx_ids = context.get("input_ids")
    if ctx_ids is not None and not torch.equal(ctx_ids.to(input_ids), input_ids):
        raise config_error("context.input_ids", "differs from kwargs.input_ids", "equal tensors")
    loss_mask = context.get("loss_mask")
    if loss_mask is not None and bool((loss_mask < 0).any()):
        raise config_error("context.loss_mask", "holds a negative value", "values >= 0")
    if st.needs_entropy and entropy_shifted is None:
        msg = "is required when entropy_coeff != 0 (shifted_logprobs(with_entropy=True))"
        raise config_error("entropy_shifted", msg, code="missing_field")

    dev = logprobs_shifted.device
    dtype = torch.float64 if logprobs_shifted.dtype == torch.float64 else torch.float32
    m = prediction_mask(input_ids, attention_mask, loss_mask, labels, st.loss_fn).to(dev, dtype)
    on = m != 0
    n = int(on.sum())

    def pred(name: str, token_aligned: bool) -> Tensor:
        t = context[name]
        assert t is not None
        t = t.to(device=dev, dtype=dtype)
        return torch.where(on, _to_prediction(t) if token_aligned else t, 0.0)

    def mean(t: Tensor) -> float:
        return float(torch.where(on, t.detach(), 0.0).sum()) / n if n else 0.0

    metrics: dict[str, float] = {}
    lp = torch.where(on, logprobs_shifted.to(dtype), 0.0)
    if st.loss_fn == "cross_entropy":  # per-token weights (Tinker's), absent = 1
        per = -lp if context.get("weights") is None else -pred("weights", True) * lp
    elif st.loss_fn == "weighted_logprob":
        per = -pred("weights", True) * lp
    else:
        adv = pred("advantages", True)
        has_old = context.get("old_log_probs_shifted") is not None
        old = pred("old_log_probs_shifted", False) if has_old else lp.detach()
        log_ratio = (lp - old).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
        ratio = log_ratio.exp()
        lo, hi = 1.0 - st.eps_clip, 1.0 + st.eps_clip_high
        if st.loss_fn == "importance_sampling":
            per = -ratio * adv
        elif st.loss_fn == "cispo":
            per = -ratio.detach().clamp(lo, hi) * adv * lp
            metrics["clip_fraction"] = mean(((ratio < lo) | (ratio > hi)).to(dtype))
        else:  # ppo, grpo
            unclipped, clipped = -ratio * adv, -ratio.clamp(lo, hi) * adv
            per = torch.maximum(unclipped, clipped)
            metrics["clip_fraction"] = mean((clipped > unclipped).to(dtype))
        metrics["approx_kl"] = mean(old - lp.detach())  # k1, verl's ppo_kl (training.proto)
    if context.get("ref_log_probs_shifted") is not None:  # reported; a penalty when kl_coeff > 0
        kl = _kl(lp, pred("ref_log_probs_shifted", False), st.kl_type)
        if st.kl_coeff > 0:
            per = per + st.kl_coeff * torch.where(on, kl, 0.0)
        metrics["kl"] = mean(kl)
    if entropy_shifted is not None:
        ent = torch.where(on, entropy_shifted.to(dtype), 0.0)
        metrics["entropy"] = mean(ent)
        if st.needs_entropy:
            per = per - st.entropy_coeff * ent
    loss = (_agg_weights(m, st) * per).sum()
    metrics.update(loss=float(loss.detach()), num_tokens=n, num_sequences=int(shape[0]))
    return LossResult(loss=loss, metrics=metrics)


__all__ = [
    "AGG_MODES",
    "CONFIG_KEYS",
    "CONTEXT_KEYS",
    "KL_TYPES",
    "LOSS_FNS",
    "SHIFTED_KEYS",
    "TOKEN_ALIGNED_KEYS",
    "LossConfigError",
    "LossResult",
    "LossSettings",
    "check_context",
    "compute_loss",
    "cross_entropy_targets",
    "parse_processing",
    "prediction_mask",
    "shifted_logprobs",
]
