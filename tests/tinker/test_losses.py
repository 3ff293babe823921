"""Each Tinker loss, mapped onto ours (`arctic_servers.tinker.losses`), gives the loss and the
gradients of Tinker's own definition on the same logits (Tinker docs "Loss functions": sums
over tokens, position i predicts target_tokens[i])."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from arctic_servers.engines.losses import torch_losses as ours
from arctic_servers.tinker.errors import TinkerError
from arctic_servers.tinker.losses import check, from_protocol, native, surrogate, to_protocol
from arctic_servers.tinker.tinker_losses import loss_and_grad
from arctic_servers.tinker.wire import Datum, FwdBwd

V = 11
LENS = (5, 3, 7)


def _data(loss: str, seed: int = 0, shifted_targets: bool = True) -> list[Datum]:
    g = np.random.default_rng(seed)
    out = []
    for n in LENS:
        full = g.integers(0, V, n + 1)
        tgt = full[1:] if shifted_targets else g.integers(0, V, n)
        inputs = {"target_tokens": tgt.astype(np.int64)}
        if loss == "cross_entropy":
            inputs["weights"] = g.uniform(-0.5, 2.0, n).astype(np.float32)
        else:
            inputs["logprobs"] = g.uniform(-3.0, -0.1, n).astype(np.float32)
            inputs["advantages"] = g.normal(0, 1, n).astype(np.float32)
        out.append(Datum(full[:-1].astype(np.int64), inputs))
    return out


def _tinker(loss: str, data: list[Datum], logits: torch.Tensor, cfg: dict) -> torch.Tensor:
    """Tinker's formulas, per datum, summed."""
    total = torch.zeros((), dtype=torch.float64)
    lo, hi = cfg.get("clip_low_threshold", 0.8), cfg.get("clip_high_threshold", 1.2)
    for i, d in enumerate(data):
        n = d.tokens.size
        t = torch.as_tensor(d.inputs["target_tokens"])
        logp = torch.log_softmax(logits[i, :n].double(), -1).gather(-1, t[:, None])[:, 0]
        if loss == "cross_entropy":
            total = total - (logp * torch.as_tensor(d.inputs["weights"]).double()).sum()
            continue
        q = torch.as_tensor(d.inputs["logprobs"]).double()
        a = torch.as_tensor(d.inputs["advantages"]).double()
        r = torch.exp(logp - q)
        if loss == "importance_sampling":
            total = total - (r * a).sum()
        elif loss == "ppo":
            total = total - torch.minimum(r * a, torch.clamp(r, lo, hi) * a).sum()
        elif loss == "cispo":
            total = total - (torch.clamp(r, lo, hi).detach() * logp * a).sum()
    return total


def _ours(body: dict, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    kw = {k: torch.as_tensor(v) for k, v in body["kwargs"].items()}
    ctx = {k: torch.as_tensor(v) for k, v in body["context"].items()}
    proc = {k: v for k, v in body["processing"].items() if k != "post"}
    st = ours.parse_processing(proc)
    targets = kw["input_ids"]
    if st.loss_fn == "cross_entropy":
        targets = ours.cross_entropy_targets(kw["input_ids"], kw.get("labels"))
    lp, _ = ours.shifted_logprobs(logits.double(), targets)
    res = ours.compute_loss(
        lp,
        input_ids=kw["input_ids"],
        attention_mask=kw["attention_mask"],
        context=ctx,
        processing=proc,
        labels=kw.get("labels"),
    )
    return res.loss, lp


CASES = [
    ("cross_entropy", {}, True),
    ("cross_entropy", {}, False),  # targets that are not the next inputs: kwargs.labels
    ("importance_sampling", {}, True),
    ("ppo", {}, True),
    ("ppo", {"clip_low_threshold": 0.7, "clip_high_threshold": 1.1}, True),
    ("cispo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.3}, True),
]


@pytest.mark.parametrize(("loss", "cfg", "shifted"), CASES)
def test_loss_and_gradients_match_tinker(loss: str, cfg: dict, shifted: bool) -> None:
    data = _data(loss, seed=len(cfg) + shifted, shifted_targets=shifted)
    fb = FwdBwd("m", 1, loss, dict(cfg), False, data)
    body, lens = to_protocol(fb)
    assert ("labels" in body["kwargs"]) is (not shifted)
    s = max(LENS) + 1
    base = torch.randn(
        len(LENS), s, V, dtype=torch.float64, generator=(gen := torch.Generator().manual_seed(7))
    )
    if loss != "cross_entropy":  # ratios near 1, some clipped, as in RL
        for i, d in enumerate(data):
            n = d.tokens.size
            t = torch.as_tensor(d.inputs["target_tokens"])
            ref = torch.log_softmax(base[i, :n], -1).gather(-1, t[:, None])[:, 0]
            noise = torch.randn(n, dtype=torch.float64, generator=gen) * 0.3
            d.inputs["logprobs"] = (ref + noise).float().numpy()
        body, lens = to_protocol(fb)
    a = base.clone().requires_grad_(True)
    want = _tinker(loss, data, a, cfg)
    want.backward()
    b = base.clone().requires_grad_(True)
    got, lp = _ours(body, b)
    got.backward()
    assert got.item() == pytest.approx(
        want.item(),
        rel=1e-5,
        abs=1e-5,  # float32 inputs: ~1e-7 per term, terms of both signs
    )  # float32 inputs, as on the wire
    assert a.grad is not None and b.grad is not None
    torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-6)
    assert float(a.grad.abs().sum()) > 0
    # the per-datum log-probs handed back are the targets' log-probs
    outs, metrics = from_protocol(
        {"loss": got.item(), "outputs": {"logprobs_shifted": lp.detach().numpy()}}, lens
    )
    for i, d in enumerate(data):
        t = torch.as_tensor(d.inputs["target_tokens"])
        ref = torch.log_softmax(base[i, : lens[i]], -1).gather(-1, t[:, None])[:, 0]
        np.testing.assert_allclose(outs[i], ref.numpy(), rtol=1e-5, atol=1e-6)
    assert metrics["loss:sum"] == pytest.approx(want.item())


@pytest.mark.parametrize("loss", ["stable_reinforce", "custom", "nope"])
def test_losses_we_do_not_have_are_refused_by_name(loss: str) -> None:
    with pytest.raises(TinkerError) as e:
        to_protocol(FwdBwd("m", 1, loss, {}, False, _data("ppo")))
    assert e.value.status == 400 and loss in e.value.message and e.value.extra["field"] == "loss_fn"


def test_refusals_name_the_field() -> None:
    d = _data("ppo")
    with pytest.raises(TinkerError, match="beta"):
        to_protocol(FwdBwd("m", 1, "ppo", {"beta": 0.1}, False, d))
    with pytest.raises(TinkerError, match="mask"):
        d[0].inputs["mask"] = np.ones(LENS[0], np.float32)
        to_protocol(FwdBwd("m", 1, "ppo", {}, False, d))
    with pytest.raises(TinkerError) as e:  # Tinker documents no default beta
        check(FwdBwd("m", 1, "dro", {}, False, _data("ppo")))
    assert e.value.extra["field"] == "loss_fn_config.beta"
    with pytest.raises(TinkerError) as e:
        check(FwdBwd("m", 1, "gspo", {}, False, _data("ppo")))
    assert "sequence_ratio_mask" in e.value.message
    d = _data("cross_entropy")
    d[1].inputs["weights"] = np.ones(LENS[1] + 2, np.float32)
    with pytest.raises(TinkerError, match="weights"):
        to_protocol(FwdBwd("m", 1, "cross_entropy", {}, False, d))
    # a ratio loss whose targets are not the next inputs is not native: it is decomposed
    d = _data("importance_sampling", shifted_targets=False)
    assert not native(FwdBwd("m", 1, "importance_sampling", {}, False, d))


def _docs_loss(loss: str, lp: torch.Tensor, d: Datum, cfg: dict) -> torch.Tensor:
    """Tinker's docs' implementations ("Loss functions" and its GSPO / DRO / CISPO pages),
    with the docs' numbers: ppo and gspo clip at 0.2, cispo's ratio to [0, 4]."""
    q = torch.as_tensor(d.inputs["logprobs"]).double()
    adv = torch.as_tensor(d.inputs["advantages"]).double()
    ratio = torch.exp(lp - q)
    if loss == "importance_sampling":
        return -(ratio * adv).sum()
    if loss == "ppo":
        clipped = torch.clamp(
            ratio, cfg.get("clip_low_threshold", 0.8), cfg.get("clip_high_threshold", 1.2)
        )
        return -torch.min(ratio * adv, clipped * adv).sum()
    if loss == "cispo":
        clipped = torch.clamp(
            ratio, cfg.get("clip_low_threshold", 0.0), cfg.get("clip_high_threshold", 4.0)
        )
        return -(clipped.detach() * lp * adv).sum()
    if loss == "dro":
        return -(lp * adv - 0.5 * cfg["beta"] * (lp - q) ** 2).sum()
    if loss == "gspo":
        in_ratio = torch.as_tensor(d.inputs["sequence_ratio_mask"]) != 0
        log_ratio = (lp.detach() - q)[in_ratio].mean()
        r = torch.exp(log_ratio + lp - lp.detach())
        clipped = torch.clamp(
            r, cfg.get("clip_low_threshold", 0.8), cfg.get("clip_high_threshold", 1.2)
        )
        return -torch.min(r * adv, clipped * adv).sum()
    raise AssertionError(loss)


DECOMPOSED = [
    ("importance_sampling", {}),
    ("ppo", {}),
    ("cispo", {}),
    ("cispo", {"clip_low_threshold": 0.5, "clip_high_threshold": 1.5}),
    ("dro", {"beta": 0.05}),
    ("dro", {"beta": 1.5}),
    ("gspo", {}),
    ("gspo", {"clip_low_threshold": 0.95, "clip_high_threshold": 1.02}),
]


@pytest.mark.parametrize(("loss", "cfg"), DECOMPOSED)
def test_decomposed_losses_match_tinkers_docs(loss: str, cfg: dict) -> None:
    """A loss served by Tinker's own decomposition (a forward for the target log-probs, then
    our cross_entropy on the targets with weights -d loss / d lp): its value and its gradient
    in the logits equal the docs' implementation under autograd, targets not the next inputs
    (the cookbook's rl_loop) included."""
    data = _data("ppo", seed=11, shifted_targets=False)
    gen = torch.Generator().manual_seed(3)
    for d in data:  # ratios spread around 1, some far outside any clip
        d.inputs["logprobs"] = (
            d.inputs["logprobs"] * 0 + np.linspace(-3.5, -0.2, d.tokens.size)
        ).astype(np.float32)
        if loss == "gspo":
            d.inputs["sequence_ratio_mask"] = (np.arange(d.tokens.size) > 0).astype(np.float32)
    fb = FwdBwd("m", 1, loss, dict(cfg), False, data)
    check(fb)
    assert not native(fb)
    base = torch.randn(len(LENS), max(LENS) + 1, V, dtype=torch.float64, generator=gen) * 1.5
    # the docs' loss, by autograd
    a = base.clone().requires_grad_(True)
    want = torch.zeros((), dtype=torch.float64)
    for i, d in enumerate(data):
        n = d.tokens.size
        t = torch.as_tensor(d.inputs["target_tokens"])
        lp = torch.log_softmax(a[i, :n], -1).gather(-1, t[:, None])[:, 0]
        want = want + _docs_loss(loss, lp, d, cfg)
    want.backward()
    # ours: the forward's lp (no gradient), the loss and weights, then the surrogate body
    b = base.clone().requires_grad_(True)
    with torch.no_grad():
        _, lp_fwd = _ours(surrogate(fb, None), b.detach())
    lens = [d.tokens.size for d in data]
    lps = [lp_fwd[i, :n].numpy() for i, n in enumerate(lens)]
    total, grads = 0.0, []
    for lp, d in zip(lps, data, strict=True):
        value, g = loss_and_grad(loss, lp, d.inputs, fb.config)
        total += value
        grads.append(g)
    assert total == pytest.approx(want.item(), rel=1e-6, abs=1e-6)
    got, _ = _ours(surrogate(fb, grads), b)
    got.backward()
    assert a.grad is not None and b.grad is not None and float(a.grad.abs().sum()) > 0
    torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-7)
