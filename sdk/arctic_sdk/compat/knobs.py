"""The knobs of a verl / SkyRL body (`meta`, `processing`): which canonical loss, post-processors
and `LossConfig` they mean, and which of them cannot be honoured (see `lowering`'s module doc)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import UnsupportedOptionError

__all__ = ["BATCH_KEYS", "LOGPROB_KEYS", "RESPONSE_KEYS", "UnsupportedKnobsError", "knobs"]

BATCH_KEYS = frozenset(
    {
        "input_ids",
        "attention_mask",
        "position_ids",
        "prompts",
        "responses",
        "labels",
        "response_mask",
        "loss_mask",
        "advantages",
        "old_log_probs",
        "ref_log_prob",
        "rollout_is_weights",
    }
)
RESPONSE_KEYS = ("response_mask", "loss_mask", "advantages", "old_log_probs", "ref_log_prob")
LOGPROB_KEYS = ("old_log_probs", "ref_log_prob")
NO_EFFECT_META = frozenset(
    {
        "rollout_n",
        "max_prompt_len",
        "max_response_len",
        "max_token_len_per_gpu",
        "pad_token_id",
        "drop_position_ids",
        "logits_optimization",
        "logits_optimization_peak_mem_size_in_gib",
        "logits_compute_in_fp32",
        "load_balancer",
        "zorro_train_load_balancer",
        "zorro_train_max_rollouts",
        "global_batch_size",
        "dp_size",
        "calculate_entropy",
        "temperature",
        "actor_config",
        "policy_loss_config",
        "batch_num_tokens",
        "rollout_is_weights",
        "zorro_train_enable",
        "use_zorro",
    }
)
LOSS_FNS = {
    "verl_grpo": "grpo",
    "grpo": "grpo",
    "ppo": "ppo",
    "importance_sampling": "importance_sampling",
    "cispo": "cispo",
    "cross_entropy": "cross_entropy",
    "sft": "cross_entropy",
    "sft_ce": "cross_entropy",
    "weighted_logprob": "weighted_logprob",
}
POST = {
    "compute_entropy_and_logprobs": ("compute_logprobs", "compute_entropy"),
    "compute_logprobs": ("compute_logprobs",),
    "compute_entropy": ("compute_entropy",),
    "apply_temperature": (),
    "identity": (),
}
AGG_MODES = {"token-mean": "token-mean", "seq-mean-token-mean": "seq-mean", "seq-mean": "seq-mean"}
KL_TYPES = {
    "low_var_kl": "low_var_kl",
    "k3": "low_var_kl",
    "kl": "kl",
    "k1": "kl",
    "mse": "mse",
    "k2": "mse",
}
#: actor_config knobs that change the loss and have no canonical form: refused unless unset.
UNSET_ONLY = {"loss_scale_factor": (None,), "tis_imp_ratio_cap": (None, 0, -1, 0.0, -1.0)}


class UnsupportedKnobsError(UnsupportedOptionError):
    """Knobs of a legacy body the canonical frame cannot honour; `options` lists every one."""

    def __init__(self, problems: list[str]) -> None:
        self.options = [p.split(" ", 1)[0] for p in problems]
        super().__init__(
            f"{len(problems)} knob(s) cannot be honoured, nothing was sent: " + "; ".join(problems),
            code="unsupported_option",
            details={"options": self.options, "problems": problems},
        )


def _num(x: Any) -> int:
    if type(x).__module__.startswith("torch"):
        return int(x.item())
    return int(np.asarray(x))


def knobs(
    meta: Mapping[str, Any], processing: Mapping[str, Any], train: bool, batch: Mapping[str, Any]
) -> tuple[list[str], str | None, tuple[str, ...], dict[str, Any]]:
    """(problems, canonical loss_fn, post, config) of a legacy body."""
    problems: list[str] = []
    for k in sorted(set(processing) - {"post", "loss_fn", "config"}):
        problems.append(f"processing.{k} (unknown key; known: post, loss_fn, config)")
    raw_fn = processing.get("loss_fn")
    loss_fn: str | None = None
    if raw_fn is not None:
        loss_fn = LOSS_FNS.get(str(raw_fn))
        if loss_fn is None:
            problems.append(f"processing.loss_fn={raw_fn!r} (known: {sorted(LOSS_FNS)})")
    elif train:
        problems.append("processing.loss_fn=None (forward-backward needs a loss)")
    post: list[str] = []
    raw_post = list(processing.get("post") or [])
    for p in raw_post:
        if p not in POST:
            problems.append(f"processing.post={p!r} (known: {sorted(POST)})")
        post.extend(x for x in POST.get(p, ()) if x not in post)
    if "compute_logprobs" not in post:
        post.insert(0, "compute_logprobs")
    if meta.get("calculate_entropy") and "compute_entropy" not in post:
        post.append("compute_entropy")
    for k in sorted(set(meta) - NO_EFFECT_META):
        problems.append(f"meta.{k} (unknown key)")
    if meta.get("rollout_is_weights") is not None or batch.get("rollout_is_weights") is not None:
        problems.append("meta.rollout_is_weights (rollout importance-sampling weights)")
    config: dict[str, Any] = dict(processing.get("config") or {})
    if "apply_temperature" in raw_post:
        temp = float(meta.get("temperature") or 1.0)
        if temp != 1.0:
            config.setdefault("temperature", temp)
    actor = dict(meta.get("actor_config") or {})
    policy = dict(meta.get("policy_loss_config") or actor.get("policy_loss") or {})
    mode = policy.get("loss_mode", "vanilla")
    if mode not in (None, "vanilla"):
        problems.append(f"meta.policy_loss_config.loss_mode={mode!r} (only 'vanilla')")
    for k, ok in UNSET_ONLY.items():
        if actor.get(k) not in ok:
            problems.append(f"meta.actor_config.{k}={actor.get(k)!r} (no canonical form)")
    if loss_fn is None:
        return problems, loss_fn, tuple(post), config
    agg = actor.get("loss_agg_mode")
    if agg is not None:
        if agg in AGG_MODES:
            config.setdefault("loss_agg_mode", AGG_MODES[agg])
        else:
            problems.append(f"meta.actor_config.loss_agg_mode={agg!r} (known: {sorted(AGG_MODES)})")
    if config.get("loss_agg_mode", "token-mean") == "token-mean" and meta.get("batch_num_tokens"):
        config.setdefault("global_num_tokens", _num(meta["batch_num_tokens"]))
    if loss_fn in ("grpo", "ppo", "cispo"):
        low = actor.get("clip_ratio_low", actor.get("clip_ratio"))
        high = actor.get("clip_ratio_high", actor.get("clip_ratio"))
        if low is not None:
            config.setdefault("eps_clip", float(low))
        if high is not None:
            config.setdefault("eps_clip_high", float(high))
    if actor.get("entropy_coeff"):
        config.setdefault("entropy_coeff", float(actor["entropy_coeff"]))
    if actor.get("use_kl_loss"):
        kl_type = actor.get("kl_loss_type", "low_var_kl")
        if kl_type not in KL_TYPES:
            problems.append(
                f"meta.actor_config.kl_loss_type={kl_type!r} (known: {sorted(KL_TYPES)})"
            )
        if batch.get("ref_log_prob") is None:
            problems.append("meta.actor_config.use_kl_loss=True (batch.ref_log_prob is missing)")
        config.setdefault("kl_coeff", float(actor.get("kl_loss_coef", 0.001)))
        config.setdefault("kl_type", KL_TYPES.get(str(kl_type), "low_var_kl"))
    return problems, loss_fn, tuple(post), config
