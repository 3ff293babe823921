"""verl's Arctic remote backend (`ArcticRLClientWrapper`, adapters.md §1.3-§1.5): every client
call with its exact arguments, and every field it reads back, against the fake and on-prem."""

from __future__ import annotations

import asyncio
import pickle
from typing import Any

import numpy as np
import pytest

from arctic_sdk.compat import ArcticRLClientConfig, create_arctic_rl_client

from . import legacy_bodies as L
from .conftest import TOKEN, Server

#: `_ARCTIC_METRIC_REDUCTION_FN` keys: reduced with np.mean by the adapter.
REDUCED = (
    "actor/pg_clipfrac_lower",
    "actor/pg_clipfrac",
    "actor/pg_loss",
    "actor/ppo_kl",
    "grad_norm",
    "kl_coef",
    "kl_loss",
)


def verl_client_config(server: Server) -> ArcticRLClientConfig:
    """`_initialize_client`: ArcticRLClientConfig(...) with every keyword the adapter passes."""
    host, port = server.host_port
    return ArcticRLClientConfig(
        host=host,
        port=port,
        comm_protocol="http",
        backend="local",
        training_gpus=1,
        sampling_gpus=0 if server.kind == "onprem" else 1,
        log_prob_gpus=0,
        colocate=True,
        log_prob_engine="deepspeed",
        model_name="tiny",
        ds_config={
            "train_micro_batch_size_per_gpu": 1,
            "train_batch_size": 4,
            "gradient_accumulation_steps": 4,
            "sequence_parallel_size": 1,
            "zero_optimization": {
                "stage": 1,
                "offload_optimizer": {"device": "none"},
                "offload_param": {"device": "none"},
            },
        },
        log_prob_ds_config=None,
        training_config={
            "training_horizon": 10,
            "optimizer": {
                "lr": 1e-4,
                "weight_decay": 0.0,
                "betas": [0.9, 0.999],
                "gradient_clipping": 1.0,
            },
            "lr_scheduler": {"type": "constant", "warmup_ratio": 0.0, "min_lr_ratio": 0.0},
            "max_length": 256,
            "model_config": None,
            "attn_implementation": "eager",
        },
        ds_worker_config={
            "use_liger": False,
            "enable_gradient_checkpointing": False,
            "attn_implementation": "eager",
        },
        vllm_config={
            "tensor_parallel_size": 1,
            "gpu_memory_utilization": 0.5,
            "max_model_len": 256,
            "max_num_seqs": 8,
            "enforce_eager": True,
            "enable_chunked_prefill": False,
        },
        arctic_inference_config={},
        checkpoint_path="/tmp/arctic-verl-ckpt",
        full_determinism=False,
        seed=1,
        pat=TOKEN,
        launch_local_server=False,
    )


def test_construction_and_reconnect_handle(server: Server) -> None:
    client = create_arctic_rl_client(verl_client_config(server))
    try:
        handle = {
            "rl_client_reconnect_config": client.reconnect_config(),
            "rl_server_state": client.get_server_state(),
        }
        handle = pickle.loads(pickle.dumps(handle))  # wg_kwargs["backend_handle"] travels by Ray
        worker = create_arctic_rl_client(
            handle["rl_client_reconnect_config"], handle["rl_server_state"]
        )
        assert worker.job_id == client.job_id and worker.training_job_id == client.training_job_id
        # the forwarder and the rollout replica call update_weights / destroy on their copy
        asyncio.run(worker.sync_weights())
        asyncio.run(worker.shutdown())
        fwd = asyncio.run(client.fwd_no_grad(L.verl_compute_log_prob_payload()))
        assert fwd["batch"]["log_probs"].shape == (2, L.P + L.R)  # the job lives on
    finally:
        asyncio.run(client.shutdown())


async def compute_log_prob(client: Any, *, ref: bool, calculate_entropy: bool) -> dict[str, Any]:
    """The adapter's `compute_log_prob` + `_send_compute_(ref_)log_prob`, verbatim in shape."""
    payload = L.verl_compute_log_prob_payload()
    payload["meta"]["calculate_entropy"] = calculate_entropy
    payload["processing"] = {"post": ["compute_entropy_and_logprobs"], "loss_fn": None}
    response = await client.fwd_no_grad(payload, reference_model=ref)
    response["batch"]["log_probs"] = response["batch"].pop("logprobs")
    model_output = {"log_probs": response["batch"]["log_probs"]}
    if calculate_entropy and "entropy" in response["batch"]:
        model_output["entropy"] = response["batch"]["entropy"]
    metrics = dict(response.get("metrics", {}))
    metrics.setdefault(
        "mfu", 0.0
    )  # the worker's setdefault; verl then pops it (KeyError if absent)
    return {"model_output": model_output, "metrics": metrics}


@pytest.mark.parametrize("ref", [False, True])
async def test_compute_log_prob(client: Any, ref: bool) -> None:
    out = await compute_log_prob(client, ref=ref, calculate_entropy=True)
    lp = out["model_output"]["log_probs"]
    assert lp.shape == (2, L.P + L.R) and (lp[L.ATTENTION_MASK == 0] == 0).all()
    assert "entropy" in out["model_output"] or ref  # a torch-forward log-prob engine: entropy too
    assert out["metrics"]["mfu"] == 0.0


async def update_actor(client: Any) -> dict[str, Any]:
    """`update_actor` → `_send_update_actor`: fwd_bwd, then step, metrics merged and reduced."""
    payload = L.verl_update_actor_payload()
    fwd_bwd_response = await client.fwd_bwd(payload)
    step_response = await client.step()
    step_response["metrics"].update(**fwd_bwd_response["metrics"])
    metrics = dict(step_response["metrics"])
    loss = metrics.pop("loss")
    last_lr = metrics.pop("last_lr")
    metrics["lr"] = last_lr[-1]
    for k in REDUCED:
        if k in metrics:
            metrics[k] = float(np.mean(metrics[k]))
    return {"loss": loss, "metrics": metrics, "global_token_num": [6, 4]}


async def test_update_actor(client: Any, server: Server) -> None:
    out = await update_actor(client)
    m = out["metrics"]
    assert np.isfinite(out["loss"]) and m["lr"] > 0 and m["grad_norm"] > 0
    # what verl's trainer then reads: grad_norm, lr, pg_loss, pg_clipfrac, ppo_kl, and mfu
    for k in ("grad_norm", "lr", "actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "mfu"):
        assert k in m, k
    actor_output = {f"actor/{k}" if not k.startswith("actor/") else k: v for k, v in m.items()}
    actor_output["perf/mfu/actor"] = actor_output.pop("actor/mfu")


async def test_update_weights_checkpoint_rollout_lifecycle(client: Any) -> None:
    await client.sync_weights(cuda_ipc=False, low_memory=False)
    await client.sync_weights()  # the plugin copy: job defaults
    saved = await client.save_checkpoint()
    assert saved["path"]
    await client.wake_inference(tags=["kv_cache", "weights"])
    await client.reset_prefix_cache()
    await client.sleep_inference(level=1)
    await client.wake_inference(tags=None)


async def test_generate_text_prompt(client: Any) -> None:
    prompt_text = "Once upon"  # self.tokenizer.decode(prompt_ids)
    agent_loop = {
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
        "repetition_penalty": 1.0,
        "logprobs": True,
        "max_tokens": 12,
    }
    sampling_params = {
        **{"temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_tokens": 1024},
        **agent_loop,
    }
    results = await client.generate(prompts=[prompt_text], sampling_params=sampling_params)
    (res,) = results
    assert isinstance(res["text"], str) and res["finish_reason"] in ("stop", "length")
    assert 0 < len(res["token_ids"]) <= 12
    assert len(res["logprobs"]) == len(res["token_ids"])  # logprobs=True -> the sampled token's
    # ArcticLLMServer.generate: finish_reason "stop"|"length" -> "completed"
    assert {"stop": "completed", "length": "completed"}[res["finish_reason"]] == "completed"
