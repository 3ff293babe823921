"""Losses of the on-prem trainer: alignment, every loss_fn and aggregation mode, validation."""

from __future__ import annotations

import math
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from arctic_servers.engines.losses import torch_losses as L  # noqa: E402
from arctic_servers.engines.losses.torch_losses import LossConfigError, compute_loss  # noqa: E402

Tensor = Any  # torch.Tensor; torch is imported lazily so the suite runs without it
F64 = torch.float64


def t(rows: list[list[float]]) -> Tensor:
    return torch.tensor(rows, dtype=F64)


def leaf(rows: list[list[float]]) -> Tensor:
    return t(rows).requires_grad_(True)


def ids_like(x: Tensor) -> Tensor:
    return torch.arange(x.numel()).reshape(x.shape) % 5 + 1


def run(
    lp: Tensor,
    loss_fn: str = "cross_entropy",
    am: Tensor | None = None,
    entropy: Tensor | None = None,
    labels: Tensor | None = None,
    **ctx_and_cfg: Any,
) -> L.LossResult:
    """compute_loss on `lp` [B, S]; keys of CONTEXT_KEYS go to context, the rest to config."""
    ctx = {k: v for k, v in ctx_and_cfg.items() if k in L.CONTEXT_KEYS}
    cfg = {k: v for k, v in ctx_and_cfg.items() if k not in L.CONTEXT_KEYS}
    processing = {"loss_fn": loss_fn, "config": cfg, "post": []}
    return compute_loss(
        lp,
        input_ids=ids_like(lp),
        attention_mask=am,
        context=ctx,
        processing=processing,
        entropy_shifted=entropy,
        labels=labels,
    )


def grad_of(lp: Tensor, result: L.LossResult) -> list[float]:
    (g,) = torch.autograd.grad(result.loss, lp)
    return flat(g.tolist())


def flat(x: Any) -> list[float]:
    return [float(v) for row in x for v in row] if isinstance(x, list) else [float(x)]


def approx(x: Any) -> Any:
    """pytest.approx at float64 precision; nested lists (rows) are compared flattened."""
    return pytest.approx(flat(x) if isinstance(x, list) else x, rel=1e-12, abs=1e-12)


def old_for(lp: Tensor, ratios: list[float]) -> Tensor:
    """Shifted old log-probs giving ratio r_j = exp(lp_j - old_j) at prediction j; last col 0."""
    logr = torch.tensor([[math.log(r) for r in ratios] + [0.0]], dtype=F64)
    return lp.detach() - logr


# --------------------------------------------------------------------------- shifted_logprobs


def test_shifted_logprobs_gathers_next_token_and_entropy() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 4, 6, generator=g)
    ids = torch.randint(0, 6, (2, 4), generator=g)
    lp, ent = L.shifted_logprobs(logits, ids, with_entropy=True)
    assert lp.dtype == torch.float32 and ent is not None and ent.dtype == torch.float32
    ref = torch.log_softmax(logits, -1)
    for b in range(2):
        for i in range(3):
            assert lp[b, i].item() == pytest.approx(ref[b, i, ids[b, i + 1]].item(), abs=1e-6)
            want = -(ref[b, i].exp() * ref[b, i]).sum().item()
            assert ent[b, i].item() == pytest.approx(want, abs=1e-6)
    assert lp[:, -1].tolist() == [0.0, 0.0] and ent[:, -1].tolist() == [0.0, 0.0]
    lp2, none = L.shifted_logprobs(logits, ids, temperature=2.0)
    assert none is None
    ref2 = torch.log_softmax(logits / 2.0, -1)
    assert lp2[0, 0].item() == pytest.approx(ref2[0, 0, ids[0, 1]].item(), abs=1e-6)


def test_shifted_logprobs_chunked_no_grad_path_equals_grad_path(monkeypatch: Any) -> None:
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 5, 7, generator=g, requires_grad=True)
    ids = torch.randint(0, 7, (3, 5), generator=g)
    lp, ent = L.shifted_logprobs(logits, ids, with_entropy=True)
    assert lp.requires_grad and ent is not None and ent.requires_grad
    monkeypatch.setattr(L, "_CHUNK_ELEMENTS", 1)  # one row per chunk
    with torch.no_grad():
        lp_c, ent_c = L.shifted_logprobs(logits, ids, with_entropy=True)
    assert ent_c is not None and not lp_c.requires_grad
    assert torch.equal(lp.detach(), lp_c) and torch.equal(ent.detach(), ent_c)
    _, ent_d = L.shifted_logprobs(logits, ids, with_entropy=True, entropy_grad=False)
    assert ent_d is not None and not ent_d.requires_grad


def test_shifted_logprobs_edge_cases() -> None:
    logits = torch.zeros(1, 3, 4, dtype=torch.bfloat16)
    lp, _ = L.shifted_logprobs(logits, torch.tensor([[1, -1, 9]]))  # pad ids out of range
    assert lp.dtype == torch.float32 and lp.tolist() == [[0.0, 0.0, 0.0]]
    lp1, ent1 = L.shifted_logprobs(torch.zeros(2, 1, 4), torch.zeros(2, 1), with_entropy=True)
    assert lp1.shape == (2, 1) and ent1 is not None and ent1.tolist() == [[0.0], [0.0]]
    # -inf logits (a masked vocabulary) keep entropy and its gradient finite
    x = torch.tensor([[[0.0, 0.0, -math.inf], [0.0, 1.0, 2.0]]], requires_grad=True)
    lp, ent = L.shifted_logprobs(x, torch.tensor([[0, 1]]), with_entropy=True)
    assert ent is not None and ent[0, 0].item() == pytest.approx(math.log(2))
    (gx,) = torch.autograd.grad(lp.sum() + ent.sum(), x)
    assert bool(torch.isfinite(gx).all())
    with pytest.raises(LossConfigError) as e:
        L.shifted_logprobs(torch.zeros(1, 3, 4), torch.zeros(1, 2))
    assert e.value.code == "shape_mismatch"
    with pytest.raises(LossConfigError):
        L.shifted_logprobs(torch.zeros(1, 3, 4), torch.zeros(1, 3), temperature=0.0)


def test_cross_entropy_targets_use_labels() -> None:
    ids, labels = torch.tensor([[5, 6, 7]]), torch.tensor([[-100, 8, -100]])
    assert L.cross_entropy_targets(ids, labels).tolist() == [[5, 8, 7]]
    assert L.cross_entropy_targets(ids, None) is ids


# --------------------------------------------------------------------------- prediction_mask


def test_mask_on_token_i_trains_prediction_i_minus_1() -> None:
    ids = torch.tensor([[5, 6, 7, 8]])
    m = L.prediction_mask(ids, None, torch.tensor([[0, 0, 1, 0]]), None, "grpo")
    assert m.tolist() == [[0.0, 1.0, 0.0, 0.0]]
    # column 0 of the loss mask is never trained; values are weights
    m = L.prediction_mask(ids, None, torch.tensor([[1.0, 0.5, 0.0, 2.0]]), None, "ppo")
    assert m.tolist() == [[0.5, 0.0, 2.0, 0.0]]


def test_mask_padding_and_labels() -> None:
    right = L.prediction_mask(
        torch.tensor([[5, 6, 7, 0]]), torch.tensor([[1, 1, 1, 0]]), None, None, "cross_entropy"
    )
    left = L.prediction_mask(
        torch.tensor([[0, 5, 6, 7]]), torch.tensor([[0, 1, 1, 1]]), None, None, "cross_entropy"
    )
    assert right.tolist() == [[1.0, 1.0, 0.0, 0.0]]
    assert left.tolist() == [[0.0, 1.0, 1.0, 0.0]]  # pad -> first real token is not trained
    lab = L.prediction_mask(
        torch.tensor([[5, 6, 7, 8]]), None, None, torch.tensor([[5, -100, 7, 8]]), "cross_entropy"
    )
    assert lab.tolist() == [[0.0, 1.0, 1.0, 0.0]]
    with pytest.raises(LossConfigError) as e:
        L.prediction_mask(torch.tensor([[5, 6]]), None, None, None, "cispo")
    assert (e.value.code, e.value.field) == ("missing_field", "context.loss_mask")


# --------------------------------------------------------------------------- exact loss values

LP = [[-1.0, -2.0, -0.5, 0.0]]  # predictions 0..2 of a 4-token row; last column 0
ONES = [[0.0, 1.0, 1.0, 1.0]]  # token-aligned loss mask: tokens 1..3


def test_cross_entropy_token_mean_and_sum() -> None:
    lp = leaf(LP)
    r = run(lp)
    assert r.metrics["loss"] == approx(3.5 / 3) and r.loss.item() == approx(3.5 / 3)
    assert r.metrics["num_tokens"] == 3 and r.metrics["num_sequences"] == 1
    assert grad_of(lp, r) == approx([[-1 / 3, -1 / 3, -1 / 3, 0.0]])
    r = run(lp, loss_agg_mode="sum")
    assert r.metrics["loss"] == approx(3.5) and grad_of(lp, r) == approx([[-1, -1, -1, 0.0]])
    assert set(r.metrics) == {"loss", "num_tokens", "num_sequences"}


def test_weighted_logprob_is_minus_sum_w_logp_over_n() -> None:
    lp = leaf(LP)
    w = t([[9.0, 1.0, 2.0, 3.0]])  # token-aligned: prediction j uses w[j + 1]
    r = run(lp, "weighted_logprob", loss_mask=t(ONES), weights=w)
    assert r.metrics["loss"] == approx((1 * 1 + 2 * 2 + 3 * 0.5) / 3)
    assert grad_of(lp, r) == approx([[-1 / 3, -2 / 3, -3 / 3, 0.0]])
    r = run(lp, "weighted_logprob", loss_mask=t(ONES), weights=w, loss_agg_mode="sum")
    assert r.metrics["loss"] == approx(6.5)


def test_importance_sampling() -> None:
    lp = leaf(LP)
    old = old_for(lp, [2.0, 0.5, 1.0])
    adv = t([[7.0, 1.0, -1.0, 2.0]])  # token-aligned; column 0 unused
    r = run(lp, "importance_sampling", loss_mask=t(ONES), advantages=adv, old_log_probs_shifted=old)
    assert r.metrics["loss"] == approx((-2.0 + 0.5 - 2.0) / 3)
    assert grad_of(lp, r) == approx([[-2 / 3, 0.5 / 3, -2 / 3, 0.0]])
    kl = -(math.log(2.0) + math.log(0.5) + math.log(1.0)) / 3  # k1: mean(old - logp)
    assert r.metrics["approx_kl"] == approx(kl)
    assert "clip_fraction" not in r.metrics


PPO_LP = [[-1.0, -1.0, -1.0, -1.0, 0.0]]
PPO_MASK = [[0.0, 1.0, 1.0, 1.0, 1.0]]
PPO_ADV = [[0.0, 1.0, -1.0, 1.0, -1.0]]
PPO_RATIOS = [1.5, 0.5, 0.5, 1.5]


@pytest.mark.parametrize("loss_fn", ["ppo", "grpo"])
def test_ppo_clipped_surrogate_and_clip_fraction(loss_fn: str) -> None:
    lp = leaf(PPO_LP)
    ctx = {"loss_mask": t(PPO_MASK), "advantages": t(PPO_ADV)}
    r = run(lp, loss_fn, old_log_probs_shifted=old_for(lp, PPO_RATIOS), **ctx)
    # per token: max(-rA, -clip(r, .8, 1.2)A) = -1.2 (clipped), 0.8 (clipped), -0.5, 1.5
    assert r.metrics["loss"] == approx((-1.2 + 0.8 - 0.5 + 1.5) / 4)
    assert grad_of(lp, r) == approx([[0.0, 0.0, -0.5 / 4, 1.5 / 4, 0.0]])
    assert r.metrics["clip_fraction"] == approx(0.5)
    assert r.metrics["approx_kl"] == approx(math.log(4 / 3) / 2)
    # asymmetric clip: 1.5 < 1 + 0.6, so only the 0.5-ratio / negative-advantage token clips
    r = run(lp, loss_fn, old_log_probs_shifted=old_for(lp, PPO_RATIOS), eps_clip_high=0.6, **ctx)
    assert r.metrics["loss"] == approx((-1.5 + 0.8 - 0.5 + 1.5) / 4)
    assert r.metrics["clip_fraction"] == approx(0.25)


def test_eps_clip_zero_is_honoured_and_high_defaults_to_low() -> None:
    assert L.parse_processing({"config": {"eps_clip": 0.3}}).eps_clip_high == 0.3
    lp = leaf(PPO_LP)
    ctx = {"loss_mask": t(PPO_MASK), "advantages": t(PPO_ADV)}
    r = run(lp, "ppo", old_log_probs_shifted=old_for(lp, PPO_RATIOS), eps_clip=0.0, **ctx)
    # clip(r, 1, 1) = 1: max(-rA, -A) = -1, 1, -0.5, 1.5
    assert r.metrics["loss"] == approx((-1 + 1 - 0.5 + 1.5) / 4)


def test_cispo() -> None:
    lp = leaf([[-1.0, -2.0, -0.5, -1.0, 0.0]])
    ratios = [1.5, 0.5, 0.5, 1.1]
    r = run(
        lp,
        "cispo",
        loss_mask=t(PPO_MASK),
        advantages=t(PPO_ADV),
        old_log_probs_shifted=old_for(lp, ratios),
    )
    # c = clip(r, 0.8, 1.2) (detached) = 1.2, 0.8, 0.8, 1.1; per token -c·A·lp, A = ±1
    assert r.metrics["loss"] == approx((1.2 - 1.6 + 0.4 - 1.1) / 4)
    assert grad_of(lp, r) == approx([[-1.2 / 4, 0.8 / 4, -0.8 / 4, 1.1 / 4, 0.0]])
    assert r.metrics["clip_fraction"] == approx(0.75)


def test_on_policy_grpo_ratio_one_gradient_is_minus_a_grad_logp_over_n() -> None:
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 5, 9, generator=g, dtype=F64, requires_grad=True)
    ids = torch.randint(0, 9, (2, 5), generator=g)
    adv = torch.randn(2, 5, generator=g, dtype=F64)
    mask = torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 0, 0]])
    lp, _ = L.shifted_logprobs(logits, ids)
    ctx = {"advantages": adv, "loss_mask": mask}
    r = compute_loss(
        lp, input_ids=ids, attention_mask=None, context=ctx, processing={"loss_fn": "grpo"}
    )
    (g1,) = torch.autograd.grad(r.loss, logits)
    assert r.metrics["clip_fraction"] == 0.0 and r.metrics["approx_kl"] == 0.0
    assert r.metrics["num_tokens"] == 5
    lp2, _ = L.shifted_logprobs(logits, ids)
    m = L.prediction_mask(ids, None, mask, None, "grpo").to(F64)
    a_pred = torch.cat([adv[:, 1:], torch.zeros(2, 1, dtype=F64)], 1)
    manual = -(a_pred * lp2.to(F64) * m).sum() / 5
    (g2,) = torch.autograd.grad(manual, logits)
    assert torch.allclose(g1, g2, atol=1e-7)
    # the value is -sum(A)/N (ratio 1), the gradient that of -sum(A·logp)/N
    assert r.metrics["loss"] == pytest.approx(-(a_pred * m).sum().item() / 5, abs=1e-6)


@pytest.mark.parametrize(
    ("kl_type", "per_token"),
    [
        ("kl", [0.5, -0.5, 0.0]),
        ("mse", [0.125, 0.125, 0.0]),
        ("low_var_kl", [math.exp(-0.5) - 0.5, math.exp(0.5) - 1.5, 0.0]),
    ],
)
def test_kl_penalty(kl_type: str, per_token: list[float]) -> None:
    lp = leaf(LP)
    ref = t([[-1.5, -1.5, -0.5, 0.0]])
    r = run(lp, ref_log_probs_shifted=ref, kl_coeff=0.1, kl_type=kl_type)
    assert r.metrics["kl"] == approx(sum(per_token) / 3)
    assert r.metrics["loss"] == approx(3.5 / 3 + 0.1 * sum(per_token) / 3)
    if kl_type == "kl":
        assert grad_of(lp, r) == approx([[(-1 + 0.1) / 3] * 3 + [0.0]])


def test_low_var_kl_is_clamped_like_verl() -> None:
    lp = leaf([[-30.0, 0.0]])
    r = run(
        lp,
        "ppo",
        loss_mask=t([[0.0, 1.0]]),
        advantages=t([[0.0, 0.0]]),
        ref_log_probs_shifted=t([[0.0, 0.0]]),
        kl_coeff=1.0,
    )
    assert r.metrics["kl"] == 10.0 and r.metrics["loss"] == approx(10.0)


def test_entropy_bonus_and_metric() -> None:
    lp = leaf(LP)
    ent = leaf([[1.0, 2.0, 3.0, 0.0]])
    r = run(lp, entropy=ent, entropy_coeff=0.01)
    assert r.metrics["entropy"] == approx(2.0)
    assert r.metrics["loss"] == approx(3.5 / 3 - 0.01 * 2.0)
    (g,) = torch.autograd.grad(r.loss, ent)
    assert flat(g.tolist()) == approx([[-0.01 / 3] * 3 + [0.0]])
    r = run(leaf(LP), entropy=ent)  # metric only
    assert r.metrics["loss"] == approx(3.5 / 3) and r.metrics["entropy"] == approx(2.0)


# --------------------------------------------------------------------------- aggregation

AGG_LP = [[-1.0, -3.0, 0.0], [-4.0, -9.0, 0.0], [-5.0, -5.0, 0.0]]
AGG_MASK = [[0.0, 1.0, 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]  # third row trains nothing


@pytest.mark.parametrize(
    ("cfg", "loss", "grad"),
    [
        ({}, 8 / 3, [[-1 / 3, -1 / 3, 0], [-1 / 3, 0, 0]]),
        ({"global_num_tokens": 10}, 0.8, [[-0.1, -0.1, 0], [-0.1, 0, 0]]),
        ({"loss_agg_mode": "seq-mean"}, (2 + 4) / 2, [[-0.25, -0.25, 0], [-0.5, 0, 0]]),
        ({"loss_agg_mode": "sum"}, 8.0, [[-1, -1, 0], [-1, 0, 0]]),
    ],
)
def test_aggregation_modes(cfg: dict[str, Any], loss: float, grad: list[list[float]]) -> None:
    lp = leaf(AGG_LP)
    r = run(lp, "weighted_logprob", loss_mask=t(AGG_MASK), weights=t([[1.0] * 3] * 3), **cfg)
    assert r.metrics["loss"] == approx(loss)
    assert grad_of(lp, r) == approx([*grad, [0.0, 0.0, 0.0]])
    assert r.metrics["num_tokens"] == 3 and r.metrics["num_sequences"] == 3


def test_fractional_loss_mask_weights_tokens() -> None:
    lp = leaf([[-1.0, -2.0, 0.0]])
    r = run(lp, "weighted_logprob", loss_mask=t([[0.0, 1.0, 0.5]]), weights=t([[1.0] * 3]))
    assert r.metrics["loss"] == approx((1 + 0.5 * 2) / 1.5) and r.metrics["num_tokens"] == 2


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean", "sum"])
def test_no_trained_token_gives_zero_loss_and_zero_grad(mode: str) -> None:
    lp = leaf(LP)
    r = run(lp, "grpo", loss_mask=t([[1.0, 0.0, 0.0, 0.0]]), advantages=t(ONES), loss_agg_mode=mode)
    assert r.metrics["loss"] == 0.0 and r.metrics["num_tokens"] == 0
    assert grad_of(lp, r) == [0.0] * 4


# --------------------------------------------------------------------------- padding, accumulation

ROWS = [[3, 1, 4, 1, 5], [2, 6, 5]]
S, V = 6, 7


def _batch(left: bool, seed: int = 3) -> tuple[Tensor, dict[str, Tensor], Tensor, Tensor]:
    """Per-real-token logits W (the leaf) laid out right- or left-padded, and the context."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(len(ROWS), S, V, generator=g, dtype=F64, requires_grad=True)
    adv = torch.randn(len(ROWS), S, generator=g, dtype=F64)
    noise = 0.3 * torch.randn(len(ROWS), S, generator=g, dtype=F64)
    ids = torch.zeros(len(ROWS), S, dtype=torch.long)
    am = torch.zeros(len(ROWS), S, dtype=torch.long)
    for b, row in enumerate(ROWS):
        ids[b, : len(row)] = torch.tensor(row)
        am[b, : len(row)] = 1
    lm = am.clone()
    lm[0, 1] = 0  # a prompt token
    lp_right, _ = L.shifted_logprobs(w * am.unsqueeze(-1), ids)
    old = (lp_right.detach().to(F64) + noise) * L.prediction_mask(
        ids, am, None, None, "cross_entropy"
    )
    tensors = {"ids": ids, "am": am, "loss_mask": lm, "advantages": adv, "old": old}
    logits = w * am.unsqueeze(-1)
    if left:
        shifts = [S - len(row) for row in ROWS]
        tensors = {k: _roll_rows(v, shifts) for k, v in tensors.items()}
        logits = torch.stack([torch.roll(logits[b], shifts[b], 0) for b in range(len(ROWS))])
    ctx = {
        "loss_mask": tensors["loss_mask"],
        "advantages": tensors["advantages"],
        "old_log_probs_shifted": tensors["old"],
        "input_ids": tensors["ids"],
    }
    return w, ctx, logits, tensors["am"]


def _roll_rows(x: Tensor, shifts: list[int]) -> Tensor:
    return torch.stack([torch.roll(x[b], shifts[b], 0) for b in range(x.shape[0])])


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean", "sum"])
def test_left_and_right_padding_give_identical_loss_and_gradients(mode: str) -> None:
    results = []
    for left in (False, True):
        w, ctx, logits, am = _batch(left)
        lp, _ = L.shifted_logprobs(logits, ctx["input_ids"])
        proc = {"loss_fn": "ppo", "config": {"loss_agg_mode": mode, "eps_clip": 0.1}}
        r = compute_loss(
            lp, input_ids=ctx["input_ids"], attention_mask=am, context=ctx, processing=proc
        )
        (g,) = torch.autograd.grad(r.loss, w)
        results.append((r.metrics, g))
    (m_right, g_right), (m_left, g_left) = results
    assert m_right["num_tokens"] == m_left["num_tokens"] == 5
    for k in ("loss", "clip_fraction", "approx_kl"):
        assert m_right[k] == pytest.approx(m_left[k], abs=1e-6)
    assert m_right["clip_fraction"] > 0
    assert torch.allclose(g_right, g_left, atol=1e-6)  # W is indexed by real token, not column


def test_split_batch_with_global_num_tokens_accumulates_like_one_call() -> None:
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(4, 5, 8, generator=g, dtype=F64, requires_grad=True)
    ids = torch.randint(0, 8, (4, 5), generator=g)
    am = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [0, 0, 1, 1, 1], [1, 1, 1, 1, 0]])
    lm = torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 0, 0], [0, 0, 0, 1, 1], [0, 1, 1, 1, 0]])
    ctx = {
        "advantages": torch.randn(4, 5, generator=g, dtype=F64),
        "loss_mask": lm,
        "old_log_probs_shifted": -torch.rand(4, 5, generator=g, dtype=F64),
    }

    def call(rows: slice, gnt: int) -> L.LossResult:
        lp, _ = L.shifted_logprobs(logits[rows], ids[rows])
        proc = {"loss_fn": "grpo", "config": {"global_num_tokens": gnt}}
        return compute_loss(
            lp,
            input_ids=ids[rows],
            attention_mask=am[rows],
            context={k: v[rows] for k, v in ctx.items()},
            processing=proc,
        )

    whole = call(slice(0, 4), 0)
    (g_whole,) = torch.autograd.grad(whole.loss, logits)
    n = int(whole.metrics["num_tokens"])
    assert n == 10
    a, b = call(slice(0, 2), n), call(slice(2, 4), n)
    assert a.metrics["num_tokens"] + b.metrics["num_tokens"] == n
    (g_split,) = torch.autograd.grad(a.loss + b.loss, logits)
    assert a.metrics["loss"] + b.metrics["loss"] == pytest.approx(whole.metrics["loss"], abs=1e-6)
    assert torch.allclose(g_whole, g_split, atol=1e-6)


def test_cross_entropy_with_labels_selects_and_scores_label_tokens() -> None:
    logits = torch.randn(1, 4, 10, generator=torch.Generator().manual_seed(5))
    ids, labels = torch.tensor([[1, 2, 3, 4]]), torch.tensor([[-100, -100, 7, 8]])
    lp, _ = L.shifted_logprobs(logits, L.cross_entropy_targets(ids, labels))
    r = compute_loss(
        lp, input_ids=ids, attention_mask=None, context={}, processing=None, labels=labels
    )
    ref = torch.log_softmax(logits, -1)
    want = -(ref[0, 1, 7] + ref[0, 2, 8]).item() / 2
    assert r.metrics["num_tokens"] == 2 and r.metrics["loss"] == pytest.approx(want, abs=1e-6)


# --------------------------------------------------------------------------- validation


def _err(lp_fn: str = "grpo", **kw: Any) -> LossConfigError:
    with pytest.raises(LossConfigError) as e:
        run(leaf(LP), lp_fn, **kw)
    assert isinstance(e.value, ValueError)
    return e.value


CTX = {"loss_mask": t(ONES), "advantages": t(ONES)}


def test_unknown_loss_fn_lists_known_ones() -> None:
    e = _err("dpo")
    assert (e.code, e.field) == ("invalid_argument", "processing.loss_fn")
    assert "'dpo'" in str(e) and all(fn in str(e) for fn in L.LOSS_FNS)
    assert e.details == {"field": "processing.loss_fn", "expected": list(L.LOSS_FNS)}


def test_unknown_config_keys_are_all_listed_in_one_error() -> None:
    e = _err(clip_ratio=0.2, foo=1, eps_clip=0.2, **CTX)
    assert e.code == "unsupported_option" and e.field == "processing.config.clip_ratio"
    assert e.options == ["processing.config.clip_ratio", "processing.config.foo"]
    assert "use eps_clip" in str(e) and "foo" in str(e)
    assert e.details["options"] == e.options


@pytest.mark.parametrize(
    ("loss_fn", "ctx", "field"),
    [
        ("grpo", {"loss_mask": t(ONES)}, "context.advantages"),
        ("ppo", {"loss_mask": t(ONES)}, "context.advantages"),
        ("cispo", {"loss_mask": t(ONES)}, "context.advantages"),
        ("importance_sampling", {"loss_mask": t(ONES)}, "context.advantages"),
        ("weighted_logprob", {"loss_mask": t(ONES)}, "context.weights"),
        ("weighted_logprob", {"weights": t(ONES)}, "context.loss_mask"),
        ("grpo", {"advantages": t(ONES)}, "context.loss_mask"),
        ("cross_entropy", {"kl_coeff": 0.1}, "context.ref_log_probs_shifted"),
        ("grpo", {**CTX, "entropy_coeff": 0.1}, "entropy_shifted"),
    ],
)
def test_missing_fields(loss_fn: str, ctx: dict[str, Any], field: str) -> None:
    e = _err(loss_fn, **ctx)
    assert (e.code, e.field) == ("missing_field", field)
    assert field.split(".")[-1] in str(e)


@pytest.mark.parametrize(
    ("kw", "code", "field", "text"),
    [
        ({"loss_agg_mode": "mean"}, "invalid_argument", "processing.config.loss_agg_mode", "mean"),
        ({"eps_clip": -0.1}, "invalid_argument", "processing.config.eps_clip", ">= 0"),
        ({"eps_clip": "0.2"}, "invalid_argument", "processing.config.eps_clip", "'0.2'"),
        ({"eps_clip_high": -1}, "invalid_argument", "processing.config.eps_clip_high", "-1"),
        ({"kl_coeff": -1.0}, "invalid_argument", "processing.config.kl_coeff", ">= 0"),
        ({"kl_type": "k9"}, "invalid_argument", "processing.config.kl_type", "low_var_kl"),
        ({"temperature": 0.0}, "invalid_argument", "processing.config.temperature", "> 0"),
        ({"entropy_coeff": math.nan}, "invalid_argument", "processing.config.entropy_coeff", "nan"),
        ({"global_num_tokens": -1}, "invalid_argument", "processing.config.global_num_tokens", ""),
        ({"global_num_tokens": 2.5}, "invalid_argument", "processing.config.global_num_tokens", ""),
        (
            {"global_num_tokens": 8, "loss_agg_mode": "seq-mean"},
            "invalid_argument",
            "processing.config.global_num_tokens",
            "token-mean",
        ),
        ({"advantages": t([[1.0, 1.0]])}, "shape_mismatch", "context.advantages", "[1, 2]"),
        ({"advantages": t([[1.0, math.nan, 0, 0]])}, "invalid_argument", "context.advantages", ""),
        ({"loss_mask": t([[0, 1, -1, 1]])}, "invalid_argument", "context.loss_mask", "negative"),
        ({"input_ids": torch.tensor([[9, 9, 9, 9]])}, "invalid_argument", "context.input_ids", ""),
    ],
)
def test_invalid_arguments(kw: dict[str, Any], code: str, field: str, text: str) -> None:
    e = _err("grpo", **{**CTX, **kw})
    assert (e.code, e.field) == (code, field)
    assert text in str(e) and field in str(e)


def test_defaults() -> None:
    assert L.parse_processing(None) == L.LossSettings()
    st = L.parse_processing({"loss_fn": "ppo", "config": {"global_num_tokens": 0}})
    assert (st.eps_clip, st.eps_clip_high, st.kl_type, st.loss_agg_mode) == (
        0.2,
        0.2,
        "low_var_kl",
        "token-mean",
    )
    assert st.required_context == ("loss_mask", "advantages") and not st.needs_entropy
    assert set(L.CONFIG_KEYS) == {
        "loss_agg_mode",
        "global_num_tokens",
        "eps_clip",
        "eps_clip_high",
        "entropy_coeff",
        "kl_coeff",
        "kl_type",
        "temperature",
    }


def test_importance_sampling_without_old_is_on_policy() -> None:
    """training.proto: an absent old_log_probs_shifted means on-policy (r = 1)."""
    lp = leaf(LP)
    adv = t([[7.0, 1.0, -1.0, 2.0]])
    r = run(lp, "importance_sampling", loss_mask=t(ONES), advantages=adv)
    assert r.metrics["loss"] == approx(-(1.0 - 1.0 + 2.0) / 3)
    assert r.metrics["approx_kl"] == approx(0.0)
