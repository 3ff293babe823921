"""SkyRL's Arctic integration (NovaSky-AI/SkyRL `integrations/arctic_rl`, PR #1837), transcribed
as data: what `build_rl_config` passes to `create_arctic_rl_client`, what `ArcticGenerator`
sends to `generate`, and what `_ArcticDispatch` sends to `fwd_no_grad` / `fwd_bwd` / `step` /
`sync_weights`, with the same keys, shapes, dtypes (torch, as SkyRL holds them) and order.

Read from the upstream code (config.py `ArcticRLTrainerConfig` defaults and `build_rl_config`;
trainer.py `_repack_to_verl_shape`, `_build_meta`, `_compute_old_log_probs`, `forward_backward`,
`optim_step`, `save_weights_for_sampler`; generator.py `ArcticGenerator.generate`; SkyRL's
`get_vllm_sampling_params`); the calls are ours, the values theirs.
"""

from __future__ import annotations

import asyncio
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from .conftest import TOKEN, Server

PAD = 0
N_SAMPLES = 2  # generator.n_samples_per_prompt
MAX_PROMPT = 96  # trainer.max_prompt_length
MAX_RESP = 12  # generator.sampling_params.max_generate_length


def run(coro: Any) -> Any:
    """`trainer._run`: `asyncio.run`, or a fresh loop on a worker thread inside a running one."""
    try:
        return asyncio.run(coro)
    except RuntimeError:
        with ThreadPoolExecutor(1) as ex:
            return ex.submit(lambda: asyncio.new_event_loop().run_until_complete(coro)).result()


def stock_sampling_params(max_tokens: int = MAX_RESP) -> dict[str, Any]:
    """`get_vllm_sampling_params(cfg.generator.sampling_params)` with SkyRL's defaults."""
    return {
        "min_tokens": 1,
        "skip_special_tokens": True,
        "include_stop_str_in_output": True,
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
        "min_p": 0.0,
        "logprobs": 1,
        "stop": None,
    }


def build_rl_config(
    server: Server,
    *,
    use_zorro: bool = True,
    training_gpus: int = 1,
    lr: float = 1e-6,
    bf16: bool = True,
    **arl: Any,
) -> dict[str, Any]:
    """`config.build_rl_config(cfg)` with `trainer.arctic_rl={}` (every default of
    `ArcticRLTrainerConfig`: ZoRRO on, Liger, flash_attention_2, gradient checkpointing, ...) and
    SkyRL's optimizer defaults; `arl` overrides fields of `trainer.arctic_rl`, `bf16` the
    hard-coded `"bf16": {"enabled": True}` (CPU proofs run float32)."""
    a: dict[str, Any] = {
        "colocate": False,
        "zero_stage": 0,
        "log_prob_gpus": 0,
        "use_liger": True,
        "attn_implementation": "flash_attention_2",
        "enable_gradient_checkpointing": True,
        "logits_optimization": "memory",
        "logits_optimization_peak_mem_size_in_gib": 4.0,
        "determinism_full": False,
        "determinism_seed": 42,
        "lr_warmup_ratio": 0.0,
        "lr_scheduler_type": "constant",
        "vllm_max_num_seqs": 256,
        "vllm_enforce_eager": True,
        "use_arctic_inference": True,
        **arl,
    }
    host, port = server.host_port
    n = N_SAMPLES
    mini = 2 * n  # policy_mini_batch_size 2
    micro = n if use_zorro else 1
    grad_accum = max(1, (mini // training_gpus) // micro)
    max_length = MAX_PROMPT + MAX_RESP
    vllm_cfg = {
        "tensor_parallel_size": 1,
        "gpu_memory_utilization": 0.8,
        "max_model_len": max_length,
        "max_num_seqs": a["vllm_max_num_seqs"],
        "enforce_eager": a["vllm_enforce_eager"],
        "enable_chunked_prefill": True,
        "enable_prefix_caching": True,
    }
    if a["use_arctic_inference"]:
        vllm_cfg["forest_cascade_attn_configs"] = "{}"
    ds_worker: dict[str, Any] = {
        "use_liger": a["use_liger"],
        "enable_gradient_checkpointing": a["enable_gradient_checkpointing"],
        "attn_implementation": a["attn_implementation"],
    }
    if use_zorro:
        ds_worker.update(
            zorro_train_enable=True,
            response_len=MAX_RESP,
            max_token_len=MAX_PROMPT + n * MAX_RESP,
            rollout_n=n,
            temperature=1.0,
            use_unpad=True,
            logits_optimization=a["logits_optimization"],
            logits_optimization_peak_mem_size_in_gib=a["logits_optimization_peak_mem_size_in_gib"],
            logits_compute_from_fp32_inputs=False,
            logits_compute_in_fp32=False,
        )
    return {
        "model_name": "tiny",
        "backend": "local",
        "comm_protocol": "ray",
        "host": host,
        "port": port,
        "pat": TOKEN,
        "checkpoint_path": server.ckpt_dir(),
        "training_gpus": training_gpus,
        "sampling_gpus": 1,
        "log_prob_gpus": a["log_prob_gpus"],
        "log_prob_engine": "deepspeed" if a["log_prob_gpus"] > 0 else "vllm",
        "colocate": a["colocate"],
        "vllm_config": vllm_cfg,
        "ds_config": {
            "train_micro_batch_size_per_gpu": micro,
            "train_batch_size": mini,
            "gradient_accumulation_steps": grad_accum,
            "sequence_parallel_size": 1,
            "bf16": {"enabled": bf16},
            "gradient_clipping": 1.0,
            "optimizer": {
                "type": "AdamW",
                "params": {"lr": lr, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01},
            },
            "zero_optimization": {
                "stage": a["zero_stage"],
                "offload_optimizer": {"device": "none"},
                "offload_param": {"device": "none"},
            },
        },
        "ds_worker_config": ds_worker,
        "training_config": {
            "training_horizon": 1000,
            "optimizer": {
                "lr": lr,
                "weight_decay": 0.01,
                "betas": [0.9, 0.999],
                "gradient_clipping": 1.0,
            },
            "lr_scheduler": {"type": a["lr_scheduler_type"], "warmup_ratio": a["lr_warmup_ratio"]},
            "max_length": max_length,
            "model_config": None,
            "attn_implementation": a["attn_implementation"],
        },
        "arctic_inference_config": None,
        "full_determinism": a["determinism_full"],
        "seed": a["determinism_seed"],
        "startup_timeout": 300.0,
        "server_logs": False,
        "job_ready_timeout": 600.0,
    }


@dataclass
class Rollouts:
    """`GeneratorOutput` of one batch: prompt and response token ids, as SkyRL keeps them."""

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    logprobs: list[list[float]]


async def generate(client: Any, prompts: list[str], max_tokens: int = MAX_RESP) -> Rollouts:
    """`ArcticGenerator.generate`: `GeneratorInput.prompts` as text (chat template applied;
    SkyRL repeats each prompt `n_samples_per_prompt` times), the stock sampling params, one
    output per prompt."""
    raw = await client.generate(prompts=prompts, sampling_params=stock_sampling_params(max_tokens))
    assert len(raw) == len(prompts)
    return Rollouts(
        [list(o["prompt_token_ids"]) for o in raw],
        [list(o.get("token_ids", [])) for o in raw],
        [list(o.get("logprobs") or []) for o in raw],
    )


def repack(r: Rollouts, *, use_zorro: bool, advantages: list[float]) -> dict[str, Any]:
    """`_repack_to_verl_shape`: prompt left-padded to P, response right-padded to R (R at least
    `max_generate_length` with ZoRRO), response tensors `[B, R]` left-aligned."""
    b = len(r.prompt_ids)
    max_p = max(len(p) for p in r.prompt_ids)
    max_r = max(len(x) for x in r.response_ids)
    if use_zorro and max_r < MAX_RESP:
        max_r = MAX_RESP
    ids = torch.full((b, max_p + max_r), PAD, dtype=torch.long)
    attn = torch.zeros((b, max_p + max_r), dtype=torch.long)
    resp_mask = torch.zeros((b, max_r), dtype=torch.long)
    adv = torch.zeros((b, max_r), dtype=torch.float32)
    for i, (p, x) in enumerate(zip(r.prompt_ids, r.response_ids, strict=True)):
        ids[i, max_p - len(p) : max_p] = torch.tensor(p)
        ids[i, max_p : max_p + len(x)] = torch.tensor(x, dtype=torch.long)
        attn[i, max_p - len(p) : max_p + len(x)] = 1
        resp_mask[i, : len(x)] = 1
        adv[i, : len(x)] = advantages[i]
    pos = attn.cumsum(-1) - 1
    pos.masked_fill_(attn == 0, 0)
    return {
        "input_ids": ids,
        "attention_mask": attn,
        "prompts": ids[:, :max_p],
        "responses": ids[:, max_p:],
        "response_mask": resp_mask,
        "position_ids": pos,
        "advantages": adv,
        "_max_prompt_len": max_p,
        "_max_response_len": max_r,
    }


def build_meta(
    *, max_p: int, max_r: int, batch_num_tokens: int, use_zorro: bool, training_gpus: int = 1
) -> dict[str, Any]:
    """`_build_meta`: every key, SkyRL's algorithm defaults in `actor_config`."""
    n = N_SAMPLES
    return {
        "pad_token_id": PAD,
        "rollout_n": n,
        "max_prompt_len": max_p,
        "max_response_len": max_r,
        "max_token_len_per_gpu": MAX_PROMPT + (n if use_zorro else 1) * MAX_RESP,
        "temperature": 1.0,
        "calculate_entropy": True,
        "drop_position_ids": False,
        "logits_optimization": "none",
        "logits_optimization_peak_mem_size_in_gib": 4,
        "logits_compute_in_fp32": False,
        "dp_size": training_gpus,
        "batch_num_tokens": int(batch_num_tokens),
        "global_batch_size": 2 * n,
        "rollout_is_weights": None,
        "zorro_train_enable": use_zorro,
        "zorro_train_max_rollouts": n,
        "zorro_train_load_balancer": True,
        "actor_config": {
            "loss_agg_mode": "token-mean",
            "kl_loss_coef": 0.001,
            "kl_loss_type": "low_var_kl",
            "clip_ratio": 0.2,
            "clip_ratio_low": 0.2,
            "clip_ratio_high": 0.2,
            "clip_ratio_c": 3.0,
            "entropy_coeff": 0.0,
            "use_kl_loss": False,
            "calculate_entropy": True,
            "rollout_n": n,
        },
        "policy_loss_config": {"loss_mode": "vanilla"},
    }


def _left_pad_to_seq(t: torch.Tensor, seq_len: int) -> torch.Tensor:
    """`_ArcticDispatch._left_pad_to_seq`: `t` itself when it is already `seq_len` wide."""
    pad_len = seq_len - t.shape[-1]
    if pad_len <= 0:
        return t
    return torch.cat([torch.zeros(*t.shape[:-1], pad_len, dtype=t.dtype), t], dim=-1)


@dataclass
class Step:
    old_log_probs: torch.Tensor  # what fwd_no_grad answered (sent back as is)
    fwd_bwd_payload: dict[str, Any]
    metrics: dict[str, Any]  # forward_backward's return (`result.get("metrics", result)`)
    grad_norm: float | None  # optim_step's return
    step_metrics: dict[str, Any]


def forward_backward_and_step(
    client: Any, r: Rollouts, advantages: list[float], *, use_zorro: bool, training_gpus: int = 1
) -> Step:
    """`forward_backward("policy", data, loss_fn="verl_grpo")` then `optim_step("policy")`,
    through SkyRL's sync bridge (`_run`)."""
    repacked = repack(r, use_zorro=use_zorro, advantages=advantages)
    max_p = repacked.pop("_max_prompt_len")
    max_r = repacked.pop("_max_response_len")
    meta = build_meta(
        max_p=max_p,
        max_r=max_r,
        batch_num_tokens=int(repacked["response_mask"].sum().item()),
        use_zorro=use_zorro,
        training_gpus=training_gpus,
    )
    # 1) _compute_old_log_probs
    sub_meta = dict(meta)
    sub_meta["calculate_entropy"] = False
    sub_meta.pop("actor_config", None)
    sub_meta.pop("policy_loss_config", None)
    fwd = {
        "batch": {
            k: repacked[k] for k in ("input_ids", "attention_mask", "prompts", "position_ids")
        },
        "meta": sub_meta,
        "processing": {"post": ["compute_entropy_and_logprobs"], "loss_fn": None},
    }
    result = run(client.fwd_no_grad(fwd, reference_model=False))
    lp = result["batch"].get("logprobs")
    if lp is None:
        lp = result["batch"].get("log_probs")
    assert lp is not None
    # 2) the fwd_bwd payload: response tensors left-padded to P+R, old log-probs as returned
    seq_len = repacked["input_ids"].shape[-1]
    batch = {k: repacked[k] for k in ("input_ids", "attention_mask", "prompts", "responses")}
    batch["position_ids"] = repacked["position_ids"]
    batch["response_mask"] = _left_pad_to_seq(repacked["response_mask"], seq_len)
    batch["advantages"] = _left_pad_to_seq(repacked["advantages"], seq_len)
    batch["old_log_probs"] = _left_pad_to_seq(lp.to(repacked["input_ids"].device), seq_len)
    batch["loss_mask"] = batch["response_mask"]
    payload = {
        "batch": batch,
        "meta": meta,
        "processing": {
            "post": ["apply_temperature", "compute_entropy_and_logprobs"],
            "loss_fn": "verl_grpo",
        },
    }
    out = run(client.fwd_bwd(payload))
    out.pop("job_id", None)
    metrics = out.get("metrics", out)
    # 3) optim_step: the first of the per-rank grad_norm list
    resp = run(client.step())
    step_metrics = resp.get("metrics", resp)
    grad_norm = step_metrics.get("grad_norm")
    if isinstance(grad_norm, list | tuple):
        grad_norm = float(grad_norm[0]) if grad_norm else None
    return Step(lp, payload, metrics, grad_norm, step_metrics)


async def save_weights_for_sampler(client: Any, *, colocate: bool = False) -> dict[str, Any]:
    """`_ArcticDispatch.save_weights_for_sampler`, both branches."""
    if colocate:
        await client.empty_training_cache()
        await client.wake_training()
        await client.wake_inference()
        return dict(await client.sync_weights(cuda_ipc=False, low_memory=False))
    return dict(await client.sync_weights(cuda_ipc=False, low_memory=False))


def grpo_advantages(rewards: list[float]) -> list[float]:
    """Group-relative advantages (SkyRL's GRPO estimator): reward minus its group's mean over
    the group's std (+1e-6), per prompt group of N_SAMPLES."""
    out = []
    for g in range(0, len(rewards), N_SAMPLES):
        grp = rewards[g : g + N_SAMPLES]
        mean = sum(grp) / len(grp)
        std = math.sqrt(sum((x - mean) ** 2 for x in grp) / max(1, len(grp) - 1))
        out += [(x - mean) / (std + 1e-6) for x in grp]
    return out


def is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(float(v))
