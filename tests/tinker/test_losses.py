"""Each Tinker loss, mapped onto ours (`arctic_servers.tinker.losses`), gives the loss and the
gradients of Tinker's own definition on the same logits (Tinker docs "Loss functions": sums
over tokens, position i predicts target_tokens[i])."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from arctic_servers.engines.losses import torch_losses as ours
from arctic_servers.tinker.errors import TinkerError
from arctic_servers.tinker.losses import from_protocol, to_protocol
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


@pytest.mark.parametrize("loss", ["dro", "gspo", "stable_reinforce", "custom", "nope"])
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
    d = _data("importance_sampling", shifted_targets=False)
    with pytest.raises(TinkerError, match="target_tokens"):
        to_protocol(FwdBwd("m", 1, "importance_sampling", {}, False, d))
    d = _data("cross_entropy")
    d[1].inputs["weights"] = np.ones(LENS[1] + 2, np.float32)
    with pytest.raises(TinkerError, match="weights"):
        to_protocol(FwdBwd("m", 1, "cross_entropy", {}, False, d))
