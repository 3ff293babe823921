"""The verl / SkyRL request bodies, built exactly as the integrations build them.

Keys and values come from the reference tables (`adapters.md` §1.3 verl `compute_log_prob` /
`update_actor`, §2.2 SkyRL `_build_meta`, `_compute_old_log_probs`, `forward_backward`).
Layout: prompt left-padded (P columns), response right-padded (R columns); response-only
tensors zero-left-padded to P+R.
"""

from __future__ import annotations

from typing import Any

import numpy as np

P, R = 3, 4
PAD = 0
# row 0: 2 prompt tokens, 3 response tokens; row 1: 3 prompt tokens, 1 response token
PROMPTS = np.array([[PAD, 11, 12], [13, 14, 15]], np.int64)
RESPONSES = np.array([[21, 22, 23, PAD], [24, PAD, PAD, PAD]], np.int64)
INPUT_IDS = np.concatenate([PROMPTS, RESPONSES], axis=1)
ATTENTION_MASK = (np.array([[0, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0, 0]])).astype(np.int64)
POSITION_IDS = np.clip(np.cumsum(ATTENTION_MASK, axis=1) - 1, 0, None).astype(np.int64)
RESP_MASK_R = np.array([[1, 1, 1, 0], [1, 0, 0, 0]], np.int64)
ADV_R = np.array([[0.5, 0.5, 0.5, 0.0], [-1.0, 0, 0, 0]], np.float32)
OLD_LP_R = np.array([[-0.25, -0.5, -0.75, 0.0], [-1.5, 0, 0, 0]], np.float32)
REF_LP_R = np.array([[-0.3, -0.6, -0.9, 0.0], [-1.2, 0, 0, 0]], np.float32)


def left_pad(t: np.ndarray) -> np.ndarray:
    """verl's `_left_pad`: a response tensor [B, R] to [B, P+R] with zeros on the left."""
    return np.concatenate([np.zeros((t.shape[0], P), t.dtype), t], axis=1)


def skyrl_actor_config(**over: Any) -> dict[str, Any]:
    cfg = {
        "loss_agg_mode": "token-mean",
        "kl_loss_coef": 0.001,
        "kl_loss_type": "low_var_kl",
        "clip_ratio": 0.2,
        "clip_ratio_low": 0.2,
        "clip_ratio_high": 0.28,
        "clip_ratio_c": 3.0,
        "entropy_coeff": 0.0,
        "use_kl_loss": False,
        "calculate_entropy": False,
        "rollout_n": 2,
    }
    cfg.update(over)
    return cfg


def skyrl_meta(*, train: bool, **over: Any) -> dict[str, Any]:
    """SkyRL `_build_meta` (trainer.py), every key."""
    meta: dict[str, Any] = {
        "pad_token_id": PAD,
        "rollout_n": 2,
        "max_prompt_len": P,
        "max_response_len": R,
        "max_token_len_per_gpu": 4096,
        "temperature": 1.0,
        "calculate_entropy": False,
        "drop_position_ids": False,
        "logits_optimization": "none",
        "logits_optimization_peak_mem_size_in_gib": 4,
        "logits_compute_in_fp32": False,
        "dp_size": 1,
        "batch_num_tokens": int(RESP_MASK_R.sum()),
        "global_batch_size": 2,
        "rollout_is_weights": None,
        "zorro_train_enable": False,
        "zorro_train_max_rollouts": 0,
        "zorro_train_load_balancer": True,
        "actor_config": skyrl_actor_config(),
        "policy_loss_config": {"loss_mode": "vanilla"},
    }
    if not train:  # _compute_old_log_probs: calculate_entropy=False, actor/policy configs removed
        meta.pop("actor_config")
        meta.pop("policy_loss_config")
    meta.update(over)
    return meta


def skyrl_fwd_no_grad_payload() -> dict[str, Any]:
    return {
        "batch": {
            "input_ids": INPUT_IDS,
            "attention_mask": ATTENTION_MASK,
            "prompts": PROMPTS,
            "position_ids": POSITION_IDS,
        },
        "meta": skyrl_meta(train=False),
        "processing": {"post": ["compute_entropy_and_logprobs"], "loss_fn": None},
    }


def skyrl_forward_payload() -> dict[str, Any]:
    """SkyRL `_ArcticDispatch.forward` (trainer.py): the whole repacked batch — the response
    tensors `[B, R]`, `advantages` and `loss_mask` among them — with the train meta
    (`actor_config`, `policy_loss_config`, `calculate_entropy=True`) and no loss."""
    return {
        "batch": {
            "input_ids": INPUT_IDS,
            "attention_mask": ATTENTION_MASK,
            "prompts": PROMPTS,
            "responses": RESPONSES,
            "response_mask": RESP_MASK_R,
            "position_ids": POSITION_IDS,
            "advantages": ADV_R,
            "loss_mask": RESP_MASK_R,
        },
        "meta": skyrl_meta(train=True, calculate_entropy=True),
        "processing": {"post": ["compute_entropy_and_logprobs"], "loss_fn": None},
    }


def skyrl_fwd_bwd_payload(**meta_over: Any) -> dict[str, Any]:
    mask = left_pad(RESP_MASK_R)
    return {
        "batch": {
            "input_ids": INPUT_IDS,
            "attention_mask": ATTENTION_MASK,
            "prompts": PROMPTS,
            "responses": RESPONSES,
            "position_ids": POSITION_IDS,
            "response_mask": mask,
            "advantages": left_pad(ADV_R),
            "old_log_probs": left_pad(OLD_LP_R),
            "loss_mask": mask,
        },
        "meta": skyrl_meta(train=True, **meta_over),
        "processing": {
            "post": ["apply_temperature", "compute_entropy_and_logprobs"],
            "loss_fn": "verl_grpo",
        },
    }


def verl_meta(**over: Any) -> dict[str, Any]:
    """verl `compute_log_prob` meta (b2aef6e4a~1 arctic_rl.py)."""
    meta: dict[str, Any] = {
        "zorro_train_enable": False,
        "zorro_train_max_rollouts": 0,
        "load_balancer": False,
        "rollout_n": 2,
        "max_prompt_len": P,
        "max_response_len": R,
        "max_token_len_per_gpu": 4096,
        "temperature": 0.7,
        "calculate_entropy": True,
        "pad_token_id": PAD,
        "drop_position_ids": False,
        "logits_optimization": "none",
        "logits_optimization_peak_mem_size_in_gib": 4,
        "logits_compute_in_fp32": True,
    }
    meta.update(over)
    return meta


def verl_compute_log_prob_payload() -> dict[str, Any]:
    return {
        "batch": {
            "input_ids": INPUT_IDS,
            "attention_mask": ATTENTION_MASK,
            "prompts": PROMPTS,
            "position_ids": POSITION_IDS,
        },
        "meta": verl_meta(),
        "processing": {"post": ["compute_entropy_and_logprobs"], "loss_fn": None},
    }


def verl_actor_config(**over: Any) -> dict[str, Any]:
    """`vars(actor_config)`: the loss knobs plus keys the loss does not read."""
    cfg: dict[str, Any] = {
        "strategy": "fsdp",
        "ppo_mini_batch_size": 2,
        "ppo_micro_batch_size_per_gpu": 1,
        "use_dynamic_bsz": False,
        "ppo_max_token_len_per_gpu": 4096,
        "clip_ratio": 0.2,
        "clip_ratio_low": 0.2,
        "clip_ratio_high": 0.28,
        "clip_ratio_c": 3.0,
        "loss_agg_mode": "token-mean",
        "entropy_coeff": 0.0,
        "use_kl_loss": False,
        "kl_loss_coef": 0.001,
        "kl_loss_type": "low_var_kl",
        "ppo_epochs": 1,
        "shuffle": False,
        "loss_scale_factor": None,
        "calculate_entropy": True,
        "policy_loss": {"loss_mode": "vanilla"},
    }
    cfg.update(over)
    return cfg


def verl_update_actor_payload(*, use_kl_loss: bool = False) -> dict[str, Any]:
    mask = left_pad(RESP_MASK_R)
    batch = {
        "input_ids": INPUT_IDS,
        "attention_mask": ATTENTION_MASK,
        "prompts": PROMPTS,
        "responses": RESPONSES,
        "response_mask": mask,
        "old_log_probs": left_pad(OLD_LP_R),
        "advantages": left_pad(ADV_R),
        "position_ids": POSITION_IDS,
        "loss_mask": mask,
    }
    if use_kl_loss:
        batch["ref_log_prob"] = left_pad(REF_LP_R)
    meta = verl_meta(
        global_batch_size=2,
        batch_num_tokens=int(mask.sum()),
        rollout_is_weights=None,
        actor_config=verl_actor_config(use_kl_loss=use_kl_loss),
        policy_loss_config={"loss_mode": "vanilla"},
    )
    return {
        "batch": batch,
        "meta": meta,
        "processing": {
            "post": ["apply_temperature", "compute_entropy_and_logprobs"],
            "loss_fn": "verl_grpo",
        },
    }
