"""NUMERICS.md, checked against an independent scalar re-implementation of its formulas."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable

import numpy as np
import pytest

from arctic_servers.engines.fake import numerics as nx
from arctic_servers.engines.fake import tokenizer


def lp_ref(t: int, p: int, q: int, s: int) -> float:
    return -(((31 * t + 13 * q + 17 * p + 7 * s) % 97) + 1) / 16


def ent_ref(q: int, p: int, s: int) -> float:
    return (((7 * q + 3 * p + 5 * s) % 64) + 1) / 32


def test_tokenizer_is_byte_level() -> None:
    assert tokenizer.encode("hé") == [ord("h") + 3, 0xC3 + 3, 0xA9 + 3]
    assert tokenizer.decode(tokenizer.encode("hé ✓")) == "hé ✓"
    assert tokenizer.decode([0, 1, 2, ord("a") + 3, 400]) == "a"
    assert tokenizer.decode([0xFF + 3]) == "\ufffd"
    assert tokenizer.VOCAB_SIZE == 259


def test_logprob_and_entropy_formulas() -> None:
    assert float(nx.token_logprob(5, 1, 4, 0)) == -31 / 16  # (155 + 52 + 17) % 97 = 30
    for t, p, q, s in [(0, 0, 0, 0), (258, 17, 3, 2), (151_935, 4000, 9, 99)]:
        assert float(nx.token_logprob(t, p, q, s)) == lp_ref(t, p, q, s) < 0
        assert float(nx.token_entropy(q, p, s)) == ent_ref(q, p, s) > 0


def test_shifted_logprobs_padding_and_alignment() -> None:
    row = [10, 20, 30, 40]
    right = nx.make_batch([[*row, 0, 0]], [[1, 1, 1, 1, 0, 0]])
    left = nx.make_batch([[0, 0, *row]], [[0, 0, 1, 1, 1, 1]])
    r = nx.shifted_logprobs(right, 3)
    g = nx.shifted_logprobs(left, 3)
    want = [lp_ref(row[j + 1], j + 1, row[j], 3) for j in range(3)]
    assert r[0].tolist() == [*want, 0.0, 0.0, 0.0]
    assert g[0].tolist() == [0.0, 0.0, *want, 0.0]
    ent = nx.shifted_entropy(right, 3)
    assert ent[0, :3].tolist() == [ent_ref(row[j], j + 1, 3) for j in range(3)]
    assert ent[0, 3:].tolist() == [0.0] * 3
    # explicit position ids are used as given
    pos = nx.make_batch([row], None, [[5, 6, 7, 8]])
    assert nx.shifted_logprobs(pos, 0)[0, 0] == lp_ref(20, 6, 10, 0)


def _ref_loss(
    ids: list[list[int]],
    mask: list[list[float]],
    s: int,
    fn: str,
    agg: str,
    adv: list[list[float]] | None = None,
    old: list[list[float]] | None = None,
    gnt: int = 0,
    eps: float = 0.2,
) -> tuple[float, int]:
    """Loss of NUMERICS.md §3 with scalar loops (rows fully real, no padding)."""
    per_row: list[list[tuple[float, float]]] = []
    for b, row in enumerate(ids):
        items = []
        for i in range(1, len(row)):
            lp = lp_ref(row[i], i, row[i - 1], s)
            o = old[b][i - 1] if old is not None else lp
            a = adv[b][i] if adv is not None else 0.0
            r = math.exp(lp - o)
            if fn == "cross_entropy":
                loss = -lp
            elif fn == "importance_sampling":
                loss = -r * a
            elif fn == "ppo":
                loss = max(-r * a, -min(max(r, 1 - eps), 1 + eps) * a)
            else:  # cispo
                loss = -min(max(r, 1 - eps), 1 + eps) * a * lp
            items.append((mask[b][i], loss))
        per_row.append(items)
    n = sum(1 for items in per_row for m, _ in items if m)
    if agg == "sum":
        return sum(m * x for items in per_row for m, x in items), n
    if agg == "seq-mean":
        rows = [
            sum(m * x for m, x in it) / sum(m for m, _ in it)
            for it in per_row
            if sum(m for m, _ in it)
        ]
        return sum(rows) / len(rows), n
    denom: float = gnt or sum(m for items in per_row for m, _ in items)
    return sum(m * x for items in per_row for m, x in items) / denom, n


IDS = [[5, 9, 13, 40, 41], [7, 8, 100, 3, 250]]
MASK: list[list[float]] = [[0, 1, 1, 0, 1], [0, 0, 1, 1, 1]]
ADV = [[0.0, 1.0, -0.5, 2.0, 0.25], [0.0, 0.0, -1.0, 1.5, 3.0]]
OLD = [[-1.0, -2.0, -0.5, -3.0, 0.0], [-0.25, -1.5, -2.5, -1.0, 0.0]]


@pytest.mark.parametrize("fn", ["cross_entropy", "importance_sampling", "ppo", "cispo"])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean", "sum"])
def test_losses_match_the_formulas(fn: str, agg: str) -> None:
    b = nx.make_batch(IDS)
    spec = nx.LossSpec(loss_fn=fn, loss_agg_mode=agg)
    x = nx.LossInputs(
        loss_mask=np.array(MASK, float), advantages=np.array(ADV), old_shifted=np.array(OLD)
    )
    res = nx.compute_loss(b, 2, spec, x)
    want, n = _ref_loss(IDS, MASK, 2, fn, agg, ADV, OLD)
    assert res.loss == pytest.approx(want, rel=1e-12)
    assert res.metrics["num_tokens"] == n == 6
    assert sum(res.grad.values()) == pytest.approx(res.loss, rel=1e-12)


def test_kl_entropy_and_weighted_terms() -> None:
    b = nx.make_batch([[5, 6, 7]])
    ref = np.array([[-1.0, -2.0, 0.0]])
    lp = [lp_ref(6, 1, 5, 0), lp_ref(7, 2, 6, 0)]
    kls: list[tuple[str, Callable[[float, float], float]]] = [
        ("kl", lambda a, r: a - r),
        ("mse", lambda a, r: 0.5 * (a - r) ** 2),
        (
            "low_var_kl",
            lambda a, r: min(10.0, math.exp(max(-20.0, min(20.0, r - a))) - (r - a) - 1),
        ),
    ]
    for kl_type, k in kls:
        spec = nx.LossSpec(loss_agg_mode="sum", kl_coeff=0.5, kl_type=kl_type, entropy_coeff=0.1)
        res = nx.compute_loss(b, 0, spec, nx.LossInputs(ref_shifted=ref))
        want = sum(
            -lp[i] + 0.5 * k(lp[i], ref[0, i]) - 0.1 * ent_ref([5, 6][i], i + 1, 0)
            for i in range(2)
        )
        assert res.loss == pytest.approx(want, rel=1e-12)
    w = np.array([[0.0, 2.0, -1.0]])
    res = nx.compute_loss(
        b,
        0,
        nx.LossSpec(loss_fn="weighted_logprob", loss_agg_mode="sum"),
        nx.LossInputs(loss_mask=np.ones((1, 3)), weights=w),
    )
    assert res.loss == pytest.approx(-2.0 * lp[0] + lp[1], rel=1e-12)


def test_cross_entropy_labels_pick_the_target_and_mask() -> None:
    b = nx.make_batch([[5, 6, 7, 8]])
    labels = np.array([[-100, 9, -100, 8]])
    res = nx.compute_loss(b, 0, nx.LossSpec(loss_agg_mode="sum"), nx.LossInputs(labels=labels))
    assert res.metrics["num_tokens"] == 2
    assert res.loss == pytest.approx(-lp_ref(9, 1, 5, 0) - lp_ref(8, 3, 7, 0), rel=1e-12)
    assert set(res.grad) == {8, 9}


def test_split_batch_with_global_num_tokens_accumulates_like_one_call() -> None:
    whole = nx.make_batch(IDS)
    mask = np.array(MASK, float)
    one = nx.compute_loss(whole, 0, nx.LossSpec(), nx.LossInputs(loss_mask=mask))
    acc: dict[int, float] = {}
    total = 0.0
    for r in range(2):
        part = nx.make_batch([IDS[r]])
        res = nx.compute_loss(
            part, 0, nx.LossSpec(global_num_tokens=6), nx.LossInputs(loss_mask=mask[r : r + 1])
        )
        total += res.loss
        for t, g in res.grad.items():
            acc[t] = acc.get(t, 0.0) + g
    assert total == pytest.approx(one.loss, rel=1e-12)
    assert nx.grad_norm(acc) == pytest.approx(nx.grad_norm(one.grad), rel=1e-12)


def test_generation_stream_is_splitmix64_over_the_sha256_seed() -> None:
    assert nx.splitmix64(0)[1] == 0xE220A8397B1DCDAF  # the reference first output for seed 0
    digest = hashlib.sha256(b"7|1|3|10,11").digest()[:8]
    assert nx.generation_seed(7, 1, 3, [10, 11]) == int.from_bytes(digest, "little")
    state, out = nx.generation_seed(7, 1, 3, [10, 11]), []
    for _ in range(4):
        state, z = nx.splitmix64(state)
        out.append(32 + z % 95 + 3)
    assert nx.token_stream(7, 1, 3, [10, 11], 4) == out
    assert all(35 <= t <= 129 for t in nx.token_stream(1, 0, 0, [5], 200))
