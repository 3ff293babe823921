"""SkyRL's Arctic integration (`integrations/arctic_rl`, adapters.md §2): every client call with
its exact arguments, and every field it reads back, against the fake gateway and on-prem.

`_run` is SkyRL's sync-to-async bridge: a fresh `asyncio.run` per call.
"""

from __future__ import annotations

import asyncio
import math
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from arctic_sdk import AsyncClient
from arctic_sdk.compat import LegacyConfigWarning, create_arctic_rl_client

from . import legacy_bodies as L
from .conftest import TOKEN, Server, free_port


def _run(coro: Any) -> Any:
    try:
        return asyncio.run(coro)
    except RuntimeError:
        with ThreadPoolExecutor(1) as ex:
            return ex.submit(asyncio.run, coro).result()


def skyrl_rl_config(server: Server, **over: Any) -> dict[str, Any]:
    """`entrypoint.build_rl_config`: comm_protocol "ray", backend "local", every field set."""
    host, port = server.host_port
    cfg: dict[str, Any] = {
        "comm_protocol": "ray",
        "backend": "local",
        "host": host,
        "port": port,
        "pat": TOKEN,
        "model_name": "tiny",
        "training_gpus": 1,
        "sampling_gpus": 1,
        "log_prob_gpus": 0,
        "log_prob_engine": "vllm",  # "deepspeed" if arl.log_prob_gpus > 0 else "vllm"
        "colocate": False,
        "ds_config": {
            "train_micro_batch_size_per_gpu": 1,
            "train_batch_size": 4,
            "gradient_accumulation_steps": 4,
            "sequence_parallel_size": 1,
            "bf16": {"enabled": False},
            "gradient_clipping": 1.0,
            "optimizer": {
                "type": "AdamW",
                "params": {"lr": 1e-4, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0},
            },
            "zero_optimization": {
                "stage": 1,
                "offload_optimizer": {"device": "none"},
                "offload_param": {"device": "none"},
            },
        },
        "ds_worker_config": {"use_liger": False, "enable_gradient_checkpointing": False},
        "training_config": {"max_length": 256},
        "vllm_config": {"max_model_len": 256, "enforce_eager": True},
        "arctic_inference_config": {},
        "full_determinism": False,
        "seed": 7,
        "startup_timeout": 300,
        "server_logs": True,
        "job_ready_timeout": 300.0,
    }
    cfg.update(over)
    return cfg


def test_entrypoint_creates_then_reattaches(server: Server) -> None:
    over: dict[str, Any] = {"sampling_gpus": 0}
    if server.kind == "onprem":  # nothing answers here: "ray" launches the server, as deployed
        over["port"] = free_port()
    with pytest.warns(LegacyConfigWarning, match="server_logs"):
        pre_client = create_arctic_rl_client(skyrl_rl_config(server, **over))
    try:
        launched = pre_client.launched_server
        assert (launched is not None) == (server.kind == "onprem")
        reconnect_cfg = pre_client.reconnect_config()
        server_state = pre_client.get_server_state()  # comm_protocol == "ray"
        # ArcticRLExp.__init__ inside the Ray task: re-attach, never create
        exp_client = create_arctic_rl_client(reconnect_cfg, server_state)
        assert exp_client.job_id == pre_client.job_id
        job = pre_client.job_id
        assert exp_client.training_job_id == f"{job}:training:0"
        assert exp_client.sampling_job_id is None and exp_client.log_prob_job_id is None
        _run(exp_client.shutdown())  # a re-attached copy only closes its connections
        out = _run(pre_client.fwd_no_grad(L.skyrl_fwd_no_grad_payload(), reference_model=False))
        assert out["batch"]["logprobs"].shape == (2, L.P + L.R)  # the job lives on
    finally:
        _run(pre_client.shutdown())
        _run(pre_client.shutdown())  # idempotent
    if launched is not None:
        assert launched.proc.poll() is not None  # the creating client stopped its server


def test_compute_old_log_probs(client: Any, server: Server) -> None:
    payload = L.skyrl_fwd_no_grad_payload()
    result = _run(client.fwd_no_grad(payload, reference_model=False))
    lp = result["batch"].get("logprobs")
    if lp is None:
        lp = result["batch"]["log_probs"]
    assert lp.shape == (2, L.P + L.R) and lp.dtype == np.float32
    # the same tokens sent as-is (prompt left-padded, response right-padded) score the same
    raw = _run(_plain_forward(client, server))
    np.testing.assert_allclose(lp, raw, atol=1e-5)
    assert (lp[L.ATTENTION_MASK == 0] == 0).all()
    assert (lp[0, 1:5] < 0).all() and (lp[1, 0:3] < 0).all()


async def _plain_forward(client: Any, server: Server) -> np.ndarray:
    async with AsyncClient(
        server.base_url, token=TOKEN, job_id=client.job_id, progress=False
    ) as plain:
        out = await plain.forward(
            kwargs={"input_ids": L.INPUT_IDS, "attention_mask": L.ATTENTION_MASK}
        )
    return np.asarray(out["outputs"]["logprobs_shifted"])


def test_forward_backward_then_optim_step(client: Any, server: Server) -> None:
    old = _run(client.fwd_no_grad(L.skyrl_fwd_no_grad_payload(), reference_model=False))
    payload = L.skyrl_fwd_bwd_payload()
    result = _run(client.fwd_bwd(payload))
    result.pop("job_id", None)
    metrics = result.get("metrics", result)
    assert {"loss", "num_tokens", "mfu"} <= set(metrics)
    assert metrics["num_tokens"] == 4 and math.isfinite(metrics["loss"])
    assert result["avg_loss"] == result["loss"] == metrics["loss"]
    if server.kind == "fake":
        assert metrics["loss"] == pytest.approx(_expected_grpo_loss(old["batch"]["logprobs"]))
    step = _run(client.step())
    grad_norm = step["metrics"]["grad_norm"]
    assert isinstance(grad_norm, list) and len(grad_norm) == 1  # a per-DP-rank list
    assert grad_norm[0] > 0
    assert step["metrics"]["last_lr"] == [step["metrics"]["lr"]]


def _expected_grpo_loss(lp: np.ndarray) -> float:
    """SkyRL's body by hand: token i of the response uses lp[:, i-1] (roll -1), clip 0.2/0.28."""
    mask, adv, old = L.left_pad(L.RESP_MASK_R), L.left_pad(L.ADV_R), L.left_pad(L.OLD_LP_R)
    total = 0.0
    for b, i in zip(*np.nonzero(mask), strict=True):
        r = math.exp(float(lp[b, i - 1]) - float(old[b, i]))
        a = float(adv[b, i])
        total += max(-r * a, -min(max(r, 0.8), 1.28) * a)
    return total / float(mask.sum())


def test_save_checkpoint_and_weights_for_sampler(client: Any) -> None:
    saved = _run(client.save_checkpoint())  # ckpt_dir ignored
    assert saved["path"] and "global_step" in saved
    # colocated branch of save_weights_for_sampler
    _run(client.empty_training_cache())
    _run(client.wake_training())
    _run(client.wake_inference())
    synced = _run(client.sync_weights(cuda_ipc=True, low_memory=False))
    assert synced["weight_version"] >= 1
    # non-colocated branch, and the fully-async variant (job defaults)
    again = _run(client.sync_weights(cuda_ipc=False, low_memory=False))
    assert again["weight_version"] == synced["weight_version"] + 1
    _run(client.sync_weights())


def test_inference_engine_stub_sleep_and_wake(client: Any) -> None:
    kwargs: dict[str, Any] = {}
    slept = _run(client.sleep_inference(level=kwargs.get("level", 2)))
    woke = _run(client.wake_inference(tags=kwargs.get("tags")))
    assert "applied" in slept["sampling"] and "applied" in woke["sampling"]
    _run(client.wake_inference(tags=["weights"]))


def test_generator_generate(client: Any) -> None:
    sampling_params = {"temperature": 1.0, "max_tokens": 16, "top_p": 1.0}
    prompt_texts = ["<|im_start|>user\nhi<|im_end|>\n", "2 + 2 ="]
    raw_outputs = _run(client.generate(prompts=prompt_texts, sampling_params=sampling_params))
    assert len(raw_outputs) == 2
    for output in raw_outputs:
        ids, text, reason = output.get("token_ids"), output.get("text"), output.get("finish_reason")
        assert isinstance(ids, list) and 0 < len(ids) <= 16
        assert all(isinstance(t, int) for t in ids)
        assert isinstance(text, str) and reason in ("stop", "length")
