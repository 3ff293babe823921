"""The loss of a whole call and its gradient with respect to the log-probs: shared by the
forward passes (`scoring._Forward`), the single-rank trainer (`training.py`) and the multi-rank
trainer (`dp_training.py`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..losses import torch_losses as losses
from .batch import Batch


def _loss_processing(body_processing: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body_processing.items() if k != "post"}


def fb_targets(b: Batch, st: losses.LossSettings | None) -> torch.Tensor:
    """The tokens the log-probs score: the inputs, or cross_entropy's labels where given."""
    if st is not None and st.loss_fn == "cross_entropy":
        return losses.cross_entropy_targets(b.ids, b.labels)
    return b.ids


def batch_loss(
    b: Batch, proc: Mapping[str, Any], lp: torch.Tensor, ent: torch.Tensor | None
) -> losses.LossResult:
    """The loss of the whole call `b` on its shifted log-probs (and entropy)."""
    return losses.compute_loss(
        lp,
        input_ids=b.ids,
        attention_mask=b.mask,
        context=b.context,
        processing=proc,
        entropy_shifted=ent,
        labels=b.labels,
    )


def loss_and_gradients(
    b: Batch,
    proc: Mapping[str, Any],
    st: losses.LossSettings,
    lp: torch.Tensor,
    ent: torch.Tensor | None,
) -> tuple[losses.LossResult, torch.Tensor, torch.Tensor | None]:
    """The loss of the call on detached log-probs (and entropy) of all its rows, and its
    gradient with respect to them (entropy's only when the loss uses it): the chain rule's
    outer half, which `TrainingEngine._backward_surrogate` completes per micro-batch / rank."""
    lp.requires_grad_(True)
    leaves = [lp]
    if ent is not None and st.needs_entropy:
        ent.requires_grad_(True)
        leaves.append(ent)
    res = batch_loss(b, proc, lp, ent)
    grads: tuple[torch.Tensor | None, ...] = (None,) * len(leaves)
    if res.loss.requires_grad:
        grads = torch.autograd.grad(res.loss, leaves, allow_unused=True)
    g_lp = grads[0] if grads[0] is not None else torch.zeros_like(lp)
    g_ent = grads[1] if len(grads) > 1 and grads[1] is not None else None
    return res, g_lp, g_ent
