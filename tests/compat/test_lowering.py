"""The `{batch, meta, processing}` lowering: pure, no server."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from arctic_sdk import InvalidArgumentError
from arctic_sdk.compat.lowering import UnsupportedKnobsError, is_canonical, lower

from . import legacy_bodies as L


def test_skyrl_fwd_bwd_lowers_to_left_aligned_canonical_frame() -> None:
    low = lower(L.skyrl_fwd_bwd_payload(), train=True)
    f = low.frame
    assert set(f) == {"kwargs", "context", "processing"}
    assert f["kwargs"]["input_ids"].tolist() == [
        [11, 12, 21, 22, 23, 0, 0],
        [13, 14, 15, 24, 0, 0, 0],
    ]
    assert f["kwargs"]["attention_mask"].tolist() == [
        [1, 1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 0, 0, 0],
    ]
    assert f["kwargs"]["position_ids"].tolist() == [
        [0, 1, 2, 3, 4, 0, 0],
        [0, 1, 2, 3, 0, 0, 0],
    ]
    ctx = f["context"]
    assert ctx["loss_mask"].tolist() == [[0, 0, 1, 1, 1, 0, 0], [0, 0, 0, 1, 0, 0, 0]]
    assert ctx["advantages"].tolist() == [[0, 0, 0.5, 0.5, 0.5, 0, 0], [0, 0, 0, -1.0, 0, 0, 0]]
    # token-aligned old log-probs -> `_shifted`: column i is the log-prob of token i + 1
    assert ctx["old_log_probs_shifted"].tolist() == [
        [0, -0.25, -0.5, -0.75, 0, 0, 0],
        [0, 0, -1.5, 0, 0, 0, 0],
    ]
    assert "ref_log_probs_shifted" not in ctx  # use_kl_loss is False
    assert f["processing"] == {
        "post": ["compute_logprobs", "compute_entropy"],
        "loss_fn": "grpo",
        "config": {
            "loss_agg_mode": "token-mean",
            "global_num_tokens": 4,
            "eps_clip": 0.2,
            "eps_clip_high": 0.28,
        },
    }


def test_verl_update_actor_with_kl_and_temperature() -> None:
    low = lower(L.verl_update_actor_payload(use_kl_loss=True), train=True)
    cfg = low.frame["processing"]["config"]
    assert cfg["temperature"] == 0.7 and cfg["kl_coeff"] == 0.001 and cfg["kl_type"] == "low_var_kl"
    ref = low.frame["context"]["ref_log_probs_shifted"]
    assert ref[0].tolist() == pytest.approx([0, -0.3, -0.6, -0.9, 0, 0, 0])


def test_forward_bodies_have_no_loss() -> None:
    for payload in (L.skyrl_fwd_no_grad_payload(), L.verl_compute_log_prob_payload()):
        low = lower(payload, train=False)
        assert "loss_fn" not in low.frame["processing"]
        assert "context" not in low.frame
    # verl asks for entropy (calculate_entropy=True); no apply_temperature: no temperature
    proc = lower(L.verl_compute_log_prob_payload(), train=False).frame["processing"]
    assert proc == {"post": ["compute_logprobs", "compute_entropy"]}


def test_a_forward_gets_only_the_context_its_loss_reads() -> None:
    """SkyRL's `forward` sends its whole batch (`advantages`, `loss_mask`) without a loss: the
    forward gets no context; with a loss, only what the spec says that loss reads (issue 37)."""
    low = lower(L.skyrl_forward_payload(), train=False)
    assert "context" not in low.frame and "loss_fn" not in low.frame["processing"]
    sft = L.skyrl_forward_payload()
    sft["processing"] = {"post": ["compute_entropy_and_logprobs"], "loss_fn": "sft"}
    sft["meta"].pop("actor_config")
    sft["meta"].pop("policy_loss_config")
    context = lower(sft, train=False).frame["context"]
    assert set(context) == {"loss_mask"}  # cross_entropy does not read advantages
    # forward-backward is unchanged: what the caller sends is used or refused
    assert "advantages" in lower(L.skyrl_fwd_bwd_payload(), train=True).frame["context"]


def test_response_tensors_given_as_b_by_r_are_left_padded() -> None:
    full = L.skyrl_fwd_bwd_payload()
    short = L.skyrl_fwd_bwd_payload()
    for k, v in (
        ("advantages", L.ADV_R),
        ("old_log_probs", L.OLD_LP_R),
        ("response_mask", L.RESP_MASK_R),
        ("loss_mask", L.RESP_MASK_R),
    ):
        short["batch"][k] = v
    a, b = lower(full, train=True).frame, lower(short, train=True).frame
    for k in ("advantages", "loss_mask", "old_log_probs_shifted"):
        np.testing.assert_array_equal(a["context"][k], b["context"][k])


def test_outputs_map_back_to_the_callers_columns() -> None:
    low = lower(L.skyrl_fwd_no_grad_payload(), train=False)
    # a server answer in the left-aligned rows: 0.1 * (column + 1) on scored columns
    compact = np.zeros((2, 7), np.float32)
    compact[0, :4] = [0.1, 0.2, 0.3, 0.4]
    compact[1, :3] = [0.1, 0.2, 0.3]
    batch = low.lift_outputs({"outputs": {"logprobs_shifted": compact, "entropy": compact}})
    np.testing.assert_allclose(
        batch["logprobs"], [[0, 0.1, 0.2, 0.3, 0.4, 0, 0], [0.1, 0.2, 0.3, 0, 0, 0, 0]]
    )
    assert batch["log_probs"] is batch["logprobs"] and batch["entropies"] is batch["entropy"]


def test_every_refused_knob_is_listed_in_one_error() -> None:
    p = L.skyrl_fwd_bwd_payload(
        rollout_is_weights=[1.0],
        new_knob=1,
        policy_loss_config={"loss_mode": "gspo"},
        actor_config=L.skyrl_actor_config(
            loss_agg_mode="seq-mean-token-sum", use_kl_loss=True, kl_loss_type="abs"
        ),
    )
    p["processing"]["post"].append("tiled_logits")
    p["batch"]["extra_tensor"] = np.zeros((2, 7))
    with pytest.raises(UnsupportedKnobsError) as info:
        lower(p, train=True)
    err = info.value
    assert err.code == "unsupported_option" and isinstance(err, InvalidArgumentError)
    assert sorted(err.options) == sorted(
        [
            "batch.extra_tensor",
            "processing.post='tiled_logits'",
            "meta.new_knob",
            "meta.rollout_is_weights",
            "meta.policy_loss_config.loss_mode='gspo'",
            "meta.actor_config.loss_agg_mode='seq-mean-token-sum'",
            "meta.actor_config.kl_loss_type='abs'",
            "meta.actor_config.use_kl_loss=True",
        ]
    )
    assert err.details["options"] == err.options


def test_other_refusals() -> None:
    p = L.skyrl_fwd_bwd_payload()
    p["processing"]["loss_fn"] = None
    with pytest.raises(UnsupportedKnobsError, match="needs a loss"):
        lower(p, train=True)
    p["processing"] = {"loss_fn": "my.module.loss", "extra": 1}
    with pytest.raises(UnsupportedKnobsError) as info:
        lower(p, train=True)
    assert info.value.options == ["processing.extra", "processing.loss_fn='my.module.loss'"]
    p = L.verl_update_actor_payload()
    p["meta"]["actor_config"]["loss_scale_factor"] = 2.0
    with pytest.raises(UnsupportedKnobsError, match="loss_scale_factor"):
        lower(p, train=True)


def test_structural_errors() -> None:
    p = L.skyrl_fwd_no_grad_payload()
    p["batch"]["attention_mask"] = np.array([[1, 0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0, 0]])
    with pytest.raises(InvalidArgumentError, match="row 0 has padding between real tokens"):
        lower(p, train=False)
    p = L.skyrl_fwd_no_grad_payload()
    del p["batch"]["input_ids"]
    with pytest.raises(InvalidArgumentError, match=r"batch\.input_ids: required"):
        lower(p, train=False)
    p = L.skyrl_fwd_bwd_payload()
    p["batch"]["advantages"] = np.zeros((2, 5), np.float32)
    with pytest.raises(InvalidArgumentError, match=r"batch.advantages: shape \[2, 5\]"):
        lower(p, train=True)


def test_torch_in_torch_out() -> None:
    torch = pytest.importorskip("torch")
    p = L.skyrl_fwd_bwd_payload()
    p["batch"] = {k: torch.from_numpy(np.asarray(v)) for k, v in p["batch"].items()}
    p["batch"]["advantages"] = p["batch"]["advantages"].to(torch.bfloat16)
    low = lower(p, train=True)
    assert isinstance(low.frame["kwargs"]["input_ids"], np.ndarray)
    assert low.frame["context"]["advantages"].dtype == np.float32
    out = low.lift_outputs({"outputs": {"logprobs_shifted": np.zeros((2, 7), np.float32)}})
    assert isinstance(out["logprobs"], torch.Tensor) and out["logprobs"].shape == (2, 7)


def test_canonical_detection() -> None:
    assert is_canonical({"kwargs": {}, "context": {}})
    assert not is_canonical(L.skyrl_fwd_no_grad_payload())


# ---------------------------------------------------------------- alignment (the deployed contract)


def _answer(low: Any) -> np.ndarray:
    """A server's shifted log-probs for the lowered rows: -(row + 1) - 0.01 * column, 0 on
    columns that predict nothing (the last real one and padding)."""
    lengths = low.lengths
    out = np.zeros((len(lengths), low.width), np.float32)
    for b, n in enumerate(lengths):
        out[b, : max(0, n - 1)] = -(b + 1) - 0.01 * np.arange(max(0, n - 1))
    return out


@pytest.mark.parametrize("zorro", [False, True])
def test_skyrl_round_trip_feeds_the_answer_back_exactly(zorro: bool) -> None:
    """SkyRL sends `fwd_no_grad`'s `batch.logprobs` straight back as `old_log_probs`: lowered,
    it is exactly the log-probs the trainer will compute (on-policy: ratio 1)."""
    fwd = L.skyrl_fwd_no_grad_payload()
    fwd["meta"]["zorro_train_enable"] = zorro
    low = lower(fwd, train=False)
    answer = _answer(low)
    lp = low.lift_outputs({"outputs": {"logprobs_shifted": answer}})["logprobs"]
    body = L.skyrl_fwd_bwd_payload(zorro_train_enable=zorro)
    body["batch"]["old_log_probs"] = lp
    # without ZoRRO the answer is predict-next: only this client knows (it returned the array)
    aligned = {"old_log_probs": "predict_next"} if not zorro else {}
    ctx = lower(body, train=True, aligned=aligned).frame["context"]
    trained = L.left_pad(L.RESP_MASK_R)  # token-aligned response tokens, caller columns
    lowered_mask = ctx["loss_mask"]
    for b in range(2):
        cols = np.nonzero(lowered_mask[b])[0]  # token positions k in the left-aligned row
        np.testing.assert_array_equal(
            ctx["old_log_probs_shifted"][b, cols - 1], answer[b, cols - 1]
        )
    assert int(lowered_mask.sum()) == int(trained.sum())


def test_zorro_outputs_are_response_aligned() -> None:
    fwd = L.skyrl_fwd_no_grad_payload()
    fwd["meta"]["zorro_train_enable"] = True
    low = lower(fwd, train=False)
    lp = low.lift_outputs({"outputs": {"logprobs_shifted": _answer(low)}})["logprobs"]
    # row 0: prompt [PAD, 11, 12] then responses 21 22 23 in columns 3..5; column 3 is the
    # log-prob of token 21 = the prediction of row position 1 (token 12)
    np.testing.assert_allclose(lp[0], [0, 0, 0, -1.01, -1.02, -1.03, 0], atol=1e-6)
    np.testing.assert_allclose(lp[1], [0, 0, 0, -2.02, 0, 0, 0], atol=1e-6)
    off = lower(L.skyrl_fwd_no_grad_payload(), train=False)
    np.testing.assert_allclose(  # ZoRRO off: predict-next, column i = token i + 1
        off.lift_outputs({"outputs": {"logprobs_shifted": _answer(off)}})["logprobs"][0],
        [0, -1.0, -1.01, -1.02, -1.03, 0, 0],
        atol=1e-6,
    )


def test_a_predict_next_tensor_is_not_taken_for_a_response_tensor() -> None:
    """A [B, P+R] log-prob input with values on the prompt columns is refused by name, unless
    the client knows it (it returned it); never guessed."""
    body = L.skyrl_fwd_bwd_payload()
    bad = L.left_pad(L.OLD_LP_R)
    bad[0, 2] = -0.5  # column 2 < P = 3: the prompt
    body["batch"]["old_log_probs"] = bad
    with pytest.raises(InvalidArgumentError, match=r"batch\.old_log_probs: column 2 of row 0"):
        lower(body, train=True)
    ok = lower(body, train=True, aligned={"old_log_probs": "predict_next"})
    assert "old_log_probs_shifted" in ok.frame["context"]
    body["batch"]["old_log_probs"] = L.OLD_LP_R  # [B, R]: token-aligned by its shape
    lower(body, train=True)


@pytest.mark.parametrize(
    ("meta", "balanced"),
    [
        ({}, False),
        ({"load_balancer": True}, True),  # verl's switch (stock arctic.yaml: on)
        ({"zorro_train_enable": True}, True),  # SkyRL: zorro_train_load_balancer defaults on
        ({"zorro_train_enable": True, "zorro_train_load_balancer": False}, False),
        ({"zorro_train_load_balancer": True}, False),  # the balancer of ZoRRO, ZoRRO off
    ],
)
def test_zorro_and_load_balancer_ask_for_balanced_rows(
    meta: dict[str, Any], balanced: bool
) -> None:
    body = L.skyrl_fwd_bwd_payload()
    body["meta"].pop("zorro_train_load_balancer")
    body["meta"].update(meta)
    proc = lower(body, train=True).frame["processing"]
    assert proc.get("balance_rows", False) is balanced
