"""Legacy config fields the on-prem trainer implements, end to end through the compatibility
client (`job_config.py` → CreateJob → the engines): a learning-rate schedule with warm-up and
decay over `training_horizon`, gradient checkpointing, the attention implementation (flash
attention falls back to sdpa on CPU, named), full determinism, resume from `checkpoint_path`,
and the log-prob sub-job's own DeepSpeed config (a forward-only DeepSpeed engine)."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

from arctic_sdk.compat import LegacyConfigWarning, create_arctic_rl_client

from . import legacy_bodies as L
from .conftest import TOKEN, Server

pytestmark = pytest.mark.slow

LR = 1e-3
HORIZON = 6
WARMUP_RATIO = 1 / 3  # round(1/3 * 6) = 2 warm-up steps
MIN_RATIO = 0.1


def expected_lr(t: int) -> float:
    """The schedule of train_options.py, written out: warm-up (t + 1) / W, then cosine."""
    w = round(WARMUP_RATIO * HORIZON)
    if t < w:
        return LR * (t + 1) / w
    p = min(1.0, (t - w) / (HORIZON - w))
    return LR * (MIN_RATIO + (1 - MIN_RATIO) * (1 + math.cos(math.pi * p)) / 2)


def _config(server: Server, ckpt: str, *, checkpointing: bool, log_prob: bool) -> dict[str, Any]:
    cfg = server.config(
        training_gpus=1,
        sampling_gpus=0,
        log_prob_gpus=1 if log_prob else 0,
        log_prob_engine="deepspeed",
        log_prob_ds_config={"zero_optimization": {"stage": 0}, "train_batch_size": 4},
        full_determinism=True,
        seed=11,
        checkpoint_path=ckpt,
        ds_config={"optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.0}}},
        ds_worker_config={
            "use_liger": False,
            "enable_gradient_checkpointing": checkpointing,
            "attn_implementation": "flash_attention_2",
        },
        training_config={
            "training_horizon": HORIZON,
            "lr_scheduler": {
                "type": "cosine",
                "warmup_ratio": WARMUP_RATIO,
                "min_lr_ratio": MIN_RATIO,
            },
            "max_length": 64,
        },
    )
    return cfg


def _info(server: Server, job: str, role: str) -> dict[str, Any]:
    admin = server.base_url + "/_admin/jobs/" + job
    auth = {"Authorization": f"Bearer {TOKEN}"}
    resp = requests.get(admin, headers=auth, timeout=30)
    assert resp.status_code == 200, resp.text
    workers = resp.json()["workers"]
    return next(w["info"] for w in workers if w["role"] == role)


async def _step(client: Any) -> tuple[float, dict[str, Any]]:
    out = await client.fwd_bwd(L.skyrl_fwd_bwd_payload())
    step = await client.step()
    return float(out["metrics"]["loss"]), step["metrics"]


def test_schedule_checkpointing_attention_determinism_resume(
    onprem_server: Server, tmp_path: Path
) -> None:
    ckpt = str(tmp_path / "ckpts")
    with pytest.warns(LegacyConfigWarning) as rec:
        a = create_arctic_rl_client(_config(onprem_server, ckpt, checkpointing=True, log_prob=True))
    text = " | ".join(str(w.message) for w in rec)
    assert "flash_attention_2" in text and "log_prob_ds_config.train_batch_size" in text
    try:
        info = _info(onprem_server, a.job_id, "training")
        assert (
            info["attn_requested"] == "flash_attention_2" and info["attn_implementation"] == "sdpa"
        )
        assert info["activation_checkpointing"] is True and info["full_determinism"] is True
        lp_info = _info(onprem_server, a.job_id, "log_prob")
        assert lp_info["engine"] == "deepspeed" and lp_info["zero_stage"] == 0
        fwd = L.skyrl_fwd_no_grad_payload()
        ref0 = asyncio.run(a.fwd_no_grad(fwd, reference_model=True))["batch"]["logprobs"]
        pol0 = asyncio.run(a.fwd_no_grad(fwd))["batch"]["logprobs"]
        np.testing.assert_allclose(ref0, pol0, atol=1e-5)  # the same initial weights
        lrs, losses = [], []
        for t in range(HORIZON + 1):
            loss, m = asyncio.run(_step(a))
            lrs.append(m["lr"])
            losses.append(loss)
            assert m["last_lr"] == [m["lr"]]
            if t == 2:
                asyncio.run(a.save_checkpoint("mid"))  # also copied to checkpoint_path
                mid_lp = asyncio.run(a.fwd_no_grad(fwd))["batch"]["logprobs"]
        np.testing.assert_allclose(lrs, [expected_lr(t) for t in range(HORIZON + 1)], rtol=1e-6)
        assert (Path(ckpt) / "mid" / "meta.json").is_file()
        # the reference model moves only when a sync names it
        asyncio.run(a.sync_weights(target_sub_job_ids=[a.log_prob_job_id]))
        ref1 = asyncio.run(a.fwd_no_grad(fwd, reference_model=True))["batch"]["logprobs"]
        pol1 = asyncio.run(a.fwd_no_grad(fwd))["batch"]["logprobs"]
        np.testing.assert_allclose(ref1, pol1, atol=1e-5)
        assert np.abs(ref1 - ref0).max() > 1e-4
    finally:
        asyncio.run(a.shutdown())
    # a new job with the same checkpoint_path resumes from "mid" (global step 3); without
    # gradient checkpointing, the same maths: the next steps match job A's
    with pytest.warns(LegacyConfigWarning):
        b = create_arctic_rl_client(
            _config(onprem_server, ckpt, checkpointing=False, log_prob=False)
        )
    try:
        info = _info(onprem_server, b.job_id, "training")
        assert info["activation_checkpointing"] is False
        got = asyncio.run(b.fwd_no_grad(fwd))["batch"]["logprobs"]
        np.testing.assert_array_equal(got, mid_lp)  # resumed: job A's weights after step 3
        loss, m = asyncio.run(_step(b))
        assert m["global_step"] == 4 and m["lr"] == pytest.approx(expected_lr(3), rel=1e-6)
        print(f"\nresumed step 4: loss {loss!r} vs job A {losses[3]!r}; lrs {lrs}")
        assert abs(loss - losses[3]) <= 1e-6 * max(1.0, abs(losses[3]))
    finally:
        asyncio.run(b.shutdown())
