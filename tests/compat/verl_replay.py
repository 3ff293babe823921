"""verl's Arctic remote backend, transcribed as data: `ArcticRLClientWrapper` of verl PR #6422
(`verl/workers/remote_client/arctic_rl.py` at b2aef6e4a~1, on `arctic_platform.rl`) and of the
current plugin (Arctic-Platform `arctic_platform/integrations/verl/adapter.py`, on
`arctic_platform.client`), with the stock `remote_backend/arctic.yaml`, and what verl's worker
(`ArcticRLActorRolloutRefWorker`, `verl.remote_backend.worker_utils`) and trainer
(`no_padding_2_padding`) do with the answers.

The keys, shapes (torch, dense `[B, P+R]`: prompt left-padded, response right-padded), the call
order and the metric reduction are upstream's; the code is ours.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .conftest import TOKEN, Server

PAD = 0
ROLLOUT_N = 2
MAX_PROMPT = 96  # data.max_prompt_length
MAX_RESP = 12  # data.max_response_length

#: `_ARCTIC_METRIC_REDUCTION_FN`: reduced with np.mean (and every other key too)
REDUCED = (
    "actor/pg_clipfrac_lower",
    "actor/pg_clipfrac",
    "actor/pg_loss",
    "actor/ppo_kl",
    "grad_norm",
    "kl_coef",
    "kl_loss",
)


def arctic_yaml(**over: Any) -> dict[str, Any]:
    """`remote_backend/arctic.yaml` as shipped (PR #6422 and the plugin: the same values)."""
    cfg: dict[str, Any] = {
        "colocate": True,
        "training_gpus": 1,
        "sampling_gpus": 1,
        "log_prob_gpus": 1,
        "sampling_tp_size": 1,
        "weight_sync": {"cuda_ipc": False, "low_memory": False},
        "train": {
            "load_balancer": True,
            "zorro_train": {"enable": False, "max_rollouts": ROLLOUT_N},
            "logits": {
                "optimization": "none",
                "optimization_peak_mem_size_in_gib": 4,
                "compute_in_fp32": False,
                "compute_from_fp32_inputs": False,
            },
            "determinism": {"full": False, "seed": 42},
            "deepspeed": {
                "zero_optimization": {
                    "stage": 0,
                    "offload_optimizer": {"device": "none"},
                    "offload_param": {"device": "none"},
                },
                "log_level": "INFO",
            },
        },
        "rollout": {"zorro_inference": {"enable": False}, "speculative_decoding": {"model": ""}},
        "comms": {"protocol": "ray", "drop_position_ids": True},
    }
    for k, v in over.items():
        cfg[k] = v
    return cfg


def _ds_config(yaml: dict[str, Any], n_gpus: int) -> dict[str, Any]:
    """`_create_ds_config`: the `train.deepspeed` block plus the per-step batch sizing (verl's
    defaults: ppo_micro_batch_size_per_gpu 1, ppo_mini_batch_size 2, train_batch_size 2)."""
    ds = dict(yaml["train"]["deepspeed"])
    mini = 2 * ROLLOUT_N
    ds.update(
        train_micro_batch_size_per_gpu=1,
        train_batch_size=mini,
        gradient_accumulation_steps=max(1, mini // n_gpus),
        sequence_parallel_size=1,
    )
    return ds


def _worker_config(yaml: dict[str, Any]) -> dict[str, Any]:
    """`_create_ds_worker_config` with verl's model defaults (use_liger False, gradient
    checkpointing False, override_config without attn_implementation)."""
    w: dict[str, Any] = {
        "use_liger": False,
        "enable_gradient_checkpointing": False,
        "attn_implementation": "flash_attention_2",
    }
    if yaml["train"]["zorro_train"]["enable"]:
        logits = yaml["train"]["logits"]
        w.update(
            zorro_train_enable=True,
            response_len=MAX_RESP,
            max_token_len=MAX_PROMPT + ROLLOUT_N * MAX_RESP,
            rollout_n=ROLLOUT_N,
            temperature=1.0,
            use_unpad=True,
            logits_optimization=logits["optimization"],
            logits_optimization_peak_mem_size_in_gib=logits["optimization_peak_mem_size_in_gib"],
            logits_compute_from_fp32_inputs=logits["compute_from_fp32_inputs"],
            logits_compute_in_fp32=logits["compute_in_fp32"],
        )
    return w


def _vllm(yaml: dict[str, Any]) -> dict[str, Any]:
    return {
        "tensor_parallel_size": yaml["sampling_tp_size"],
        "gpu_memory_utilization": 0.5,
        "max_model_len": MAX_PROMPT + MAX_RESP,
        "max_num_seqs": 1024,
        "enforce_eager": True,
        "enable_chunked_prefill": True,
    }


def pr_client_config(server: Server, yaml: dict[str, Any], lr: float = 1e-6) -> dict[str, Any]:
    """PR #6422 `_initialize_client`: `ArcticRLClientConfig(...)` (`arctic_platform.rl`), every
    keyword; `host`/`port` as the Ray protocol sets them, then pointed at the test server."""
    host, port = server.host_port
    n_train, n_lp = yaml["training_gpus"], yaml["log_prob_gpus"]
    horizon = 10 * 1 * 1  # total_training_steps x ppo_epochs x num_minibatches
    return {
        "host": host,
        "port": port,
        "pat": TOKEN,
        "launch_local_server": False,
        "comm_protocol": yaml["comms"]["protocol"],
        "backend": "local",
        "training_gpus": n_train,
        "sampling_gpus": yaml["sampling_gpus"],
        "log_prob_gpus": n_lp,
        "colocate": yaml["colocate"],
        "log_prob_engine": "deepspeed",
        "model_name": "tiny",
        "ds_config": _ds_config(yaml, n_train),
        "log_prob_ds_config": None if n_lp == 0 else _ds_config(yaml, n_lp),
        "training_config": {
            "training_horizon": horizon,
            "optimizer": {
                "lr": lr,
                "weight_decay": 0.01,
                "betas": [0.9, 0.999],
                "gradient_clipping": 1.0,
            },
            "lr_scheduler": {"type": "constant", "warmup_ratio": 0.0, "min_lr_ratio": None},
            "max_length": MAX_PROMPT + MAX_RESP,
            "model_config": None,
            "attn_implementation": "eager",
        },
        "ds_worker_config": _worker_config(yaml),
        "vllm_config": _vllm(yaml),
        "arctic_inference_config": yaml["rollout"] or None,
        "checkpoint_path": server.ckpt_dir(),
        "full_determinism": yaml["train"]["determinism"]["full"],
        "seed": yaml["train"]["determinism"]["seed"],
        "job_ready_timeout": 600.0,
    }


def plugin_client_config(server: Server, yaml: dict[str, Any], lr: float = 1e-6) -> Any:
    """The plugin's `_initialize_client`: `arctic_platform.client` config classes, nested."""
    from arctic_platform.client import (  # the alias (compat-alias/), as the plugin imports it
        ArcticRLClientConfig,
        OnPremConfig,
        SamplingConfig,
        TrainingConfig,
    )

    host, port = server.host_port
    n_train, n_lp = yaml["training_gpus"], yaml["log_prob_gpus"]
    ds = _ds_config(yaml, n_train)
    ds["optimizer"] = {
        "type": "AdamW",
        "params": {"lr": lr, "weight_decay": 0.01, "betas": [0.9, 0.999], "eps": 1e-8},
    }
    ds["gradient_clipping"] = 1.0
    onprem: dict[str, Any] = {"protocol": yaml["comms"]["protocol"], "colocate": yaml["colocate"]}
    onprem.update(host=host, port=port)  # the test server (the plugin: localhost:7000, launched)
    worker = _worker_config(yaml)
    worker.setdefault("attn_implementation", "eager")
    return ArcticRLClientConfig(
        model_name="tiny",
        seed=yaml["train"]["determinism"].get("seed", 42),
        max_seq_len=MAX_PROMPT + MAX_RESP,
        training_gpus=n_train,
        sampling_gpus=yaml["sampling_gpus"],
        log_prob_gpus=n_lp,
        job_ready_timeout=600.0,
        backend=OnPremConfig(**onprem),
        training=TrainingConfig(
            full_determinism=yaml["train"]["determinism"].get("full", False),
            checkpoint_path=server.ckpt_dir(),
            ds_config=ds,
            ds_worker_config=worker,
            cuda_ipc=yaml["weight_sync"]["cuda_ipc"],
            low_memory=yaml["weight_sync"]["low_memory"],
        ),
        sampling=SamplingConfig(
            vllm=_vllm(yaml),
            arctic_inference_config=yaml["rollout"] or None,
            log_prob_engine="deepspeed",
            log_prob_ds_config=None if n_lp == 0 else _ds_config(yaml, n_lp),
        ),
    )


@dataclass
class VerlData:
    """A verl batch in the dense layout the adapter pads to."""

    prompts: torch.Tensor  # [B, P] left-padded
    responses: torch.Tensor  # [B, R] right-padded
    attention_mask: torch.Tensor  # [B, P+R]
    response_mask: torch.Tensor  # [B, R]
    position_ids: torch.Tensor
    advantages: torch.Tensor  # [B, R]

    @property
    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.prompts, self.responses], dim=1)


def verl_data(
    prompt_ids: list[list[int]], response_ids: list[list[int]], adv: list[float]
) -> VerlData:
    b = len(prompt_ids)
    p = max(len(x) for x in prompt_ids)
    r = max(len(x) for x in response_ids)
    prompts = torch.full((b, p), PAD, dtype=torch.long)
    responses = torch.full((b, r), PAD, dtype=torch.long)
    attn = torch.zeros((b, p + r), dtype=torch.long)
    rmask = torch.zeros((b, r), dtype=torch.long)
    advantages = torch.zeros((b, r), dtype=torch.float32)
    for i, (x, y) in enumerate(zip(prompt_ids, response_ids, strict=True)):
        prompts[i, p - len(x) :] = torch.tensor(x)
        responses[i, : len(y)] = torch.tensor(y, dtype=torch.long)
        attn[i, p - len(x) : p + len(y)] = 1
        rmask[i, : len(y)] = 1
        advantages[i, : len(y)] = adv[i]
    pos = (attn.cumsum(-1) - 1).clamp(min=0) * attn
    return VerlData(prompts, responses, attn, rmask, pos, advantages)


def _meta(yaml: dict[str, Any], d: VerlData, calculate_entropy: bool) -> dict[str, Any]:
    logits = yaml["train"]["logits"]
    return {
        "zorro_train_enable": yaml["train"]["zorro_train"]["enable"],
        "zorro_train_max_rollouts": yaml["train"]["zorro_train"]["max_rollouts"],
        "load_balancer": yaml["train"]["load_balancer"],
        "rollout_n": ROLLOUT_N,
        "max_prompt_len": d.prompts.shape[1],
        "max_response_len": d.responses.shape[1],
        "max_token_len_per_gpu": 16384,
        "temperature": 1.0,
        "calculate_entropy": calculate_entropy,
        "pad_token_id": PAD,
        "drop_position_ids": yaml["comms"]["drop_position_ids"],
        "logits_optimization": logits["optimization"],
        "logits_optimization_peak_mem_size_in_gib": logits["optimization_peak_mem_size_in_gib"],
        "logits_compute_in_fp32": logits["compute_in_fp32"],
    }


def _batch(yaml: dict[str, Any], d: VerlData) -> dict[str, Any]:
    """`_prepare_padded_arctic_batch_dict`: input_ids, attention_mask, prompts (+ position_ids
    when `drop_position_ids` is off)."""
    batch = {"input_ids": d.input_ids, "attention_mask": d.attention_mask, "prompts": d.prompts}
    if not yaml["comms"]["drop_position_ids"]:
        batch["position_ids"] = d.position_ids
    return batch


async def compute_log_prob(
    client: Any, yaml: dict[str, Any], d: VerlData, *, ref: bool, calculate_entropy: bool
) -> dict[str, Any]:
    """`compute_log_prob` → `_send_compute_(ref_)log_prob`: fwd_no_grad, `logprobs` renamed."""
    payload: dict[str, Any] = {"batch": _batch(yaml, d), "meta": _meta(yaml, d, calculate_entropy)}
    payload["processing"] = {"post": ["compute_entropy_and_logprobs"], "loss_fn": None}
    response = await client.fwd_no_grad(payload, reference_model=ref)
    response["batch"]["log_probs"] = response["batch"].pop("logprobs")
    out = {"log_probs": response["batch"]["log_probs"]}
    if calculate_entropy and "entropy" in response["batch"]:
        out["entropy"] = response["batch"]["entropy"]
    metrics = dict(response.get("metrics", {}))
    metrics.setdefault("mfu", 0.0)  # the worker's
    return {"model_output": out, "metrics": metrics}


def worker_response_log_probs(yaml: dict[str, Any], d: VerlData, dense: Any) -> torch.Tensor:
    """What verl keeps of `compute_log_prob`'s answer: the worker's `make_njt` (each row's real
    tokens), `shift_nested_response_aligned_to_predict_next` with ZoRRO, then the trainer's
    `no_padding_2_padding` (`values[end - r - 1 : end - 1]`): `[B, R]`, token-aligned."""
    t = torch.as_tensor(np.asarray(dense))
    starts = d.attention_mask.argmax(dim=1)
    lens = d.attention_mask.sum(dim=1)
    flat = torch.cat([t[b, int(starts[b]) : int(starts[b]) + int(lens[b])] for b in range(len(t))])
    if yaml["train"]["zorro_train"]["enable"]:
        flat = torch.cat([flat[1:], flat.new_zeros(1)])
    r_lens = d.response_mask.sum(dim=1)
    out = torch.zeros(d.responses.shape, dtype=torch.float32)
    end = 0
    for b in range(len(t)):
        end += int(lens[b])
        r = int(r_lens[b])
        out[b, :r] = flat[end - r - 1 : end - 1]
    return out


async def update_actor(
    client: Any,
    yaml: dict[str, Any],
    d: VerlData,
    old_log_probs: torch.Tensor,
    ref_log_prob: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> dict[str, Any]:
    """`update_actor` (one epoch, one mini-batch) → `_send_update_actor` (response tensors
    `_left_pad`ded, `loss_mask = response_mask`, fwd_bwd then step, metrics merged), and the
    adapter's reduction (loss popped, `last_lr[-1]` → lr, every other key np.mean'd)."""
    batch: dict[str, Any] = {
        "input_ids": d.input_ids,
        "attention_mask": d.attention_mask,
        "prompts": d.prompts,
        "responses": d.responses,
        "response_mask": d.response_mask,
        "old_log_probs": old_log_probs,
        "advantages": d.advantages,
    }
    if not yaml["comms"]["drop_position_ids"]:
        batch["position_ids"] = d.position_ids
    use_kl = ref_log_prob is not None
    if use_kl:
        batch["ref_log_prob"] = ref_log_prob
    meta = _meta(yaml, d, calculate_entropy=True)
    meta["actor_config"] = actor_config(use_kl_loss=use_kl, kl_loss_coef=kl_coef)
    meta["policy_loss_config"] = {"loss_mode": "vanilla", "clip_cov_ratio": 0.0002}
    meta["global_batch_size"] = 2 * ROLLOUT_N
    meta["batch_num_tokens"] = batch["response_mask"].sum()
    meta["rollout_is_weights"] = None
    payload = {"batch": batch, "meta": meta}
    payload["processing"] = {
        "post": ["apply_temperature", "compute_entropy_and_logprobs"],
        "loss_fn": "verl_grpo",
    }
    seq_len = payload["batch"]["input_ids"].shape[-1]
    for name in ("old_log_probs", "advantages", "response_mask", "ref_log_prob"):
        if name in payload["batch"]:
            t = payload["batch"][name]
            if seq_len - t.shape[-1] > 0:
                pad = torch.zeros(*t.shape[:-1], seq_len - t.shape[-1], dtype=t.dtype)
                payload["batch"][name] = torch.cat([pad, t], dim=-1)
    payload["batch"]["loss_mask"] = payload["batch"]["response_mask"]
    fwd_bwd_response = await client.fwd_bwd(payload)
    step_response = await client.step()
    step_response["metrics"].update(**fwd_bwd_response["metrics"])
    mb = dict(step_response["metrics"])
    loss = mb.pop("loss")
    last_lr = mb.pop("last_lr", None)
    metrics = {k: float(np.mean(v)) for k, v in mb.items()}
    if last_lr is not None:
        metrics["lr"] = last_lr[-1]
    return {
        "loss": float(np.mean([loss])),
        "metrics": metrics,
        "raw_step": step_response,
        "fwd_bwd": fwd_bwd_response,
    }


def actor_config(**over: Any) -> dict[str, Any]:
    """`json(vars(actor_config))`: verl's ActorConfig defaults (the loss knobs and the rest)."""
    cfg: dict[str, Any] = {
        "strategy": "fsdp",
        "ppo_mini_batch_size": 2,
        "ppo_micro_batch_size_per_gpu": 1,
        "use_dynamic_bsz": False,
        "ppo_max_token_len_per_gpu": 16384,
        "clip_ratio": 0.2,
        "clip_ratio_low": 0.2,
        "clip_ratio_high": 0.2,
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
        "rollout_n": ROLLOUT_N,
        "policy_loss": {"loss_mode": "vanilla", "clip_cov_ratio": 0.0002},
    }
    cfg.update(over)
    return cfg


async def generate(client: Any, prompt_text: str, **agent_loop: Any) -> list[dict[str, Any]]:
    """The adapter's `generate`: a decoded text prompt, its defaults under the agent loop's
    params (`temperature`, `top_p`, `top_k`, `repetition_penalty`, `logprobs`)."""
    params = {
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
        "repetition_penalty": 1.0,
        "logprobs": True,
        **agent_loop,
    }
    merged = {**{"temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_tokens": 1024}, **params}
    return list(await client.generate(prompts=[prompt_text], sampling_params=merged))
