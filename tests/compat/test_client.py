"""The compatibility client itself: legacy config names, environment, refusals before anything
is sent, pickling into another process, and the legacy-only methods."""

from __future__ import annotations

import asyncio
import multiprocessing
import pickle
from typing import Any

import pytest

from arctic_sdk import InvalidArgumentError, UnimplementedError
from arctic_sdk.compat import (
    ArcticRLClientConfig,
    LegacyConfigWarning,
    UnsupportedKnobsError,
    create_arctic_rl_client,
)
from arctic_sdk.compat.aliases import LEGACY_ASYNC_METHODS, legacy_method

from . import legacy_bodies as L
from .conftest import Server


def test_backend_aliases_and_defaults() -> None:
    cfg = ArcticRLClientConfig(backend="local")
    assert cfg.backend == "onprem" and cfg.server_url() == "http://localhost:7000"
    for old, new in (
        ("dss-platform", "onprem"),
        ("dss_platform", "onprem"),
        ("neutrino", "cortex"),
    ):
        with pytest.warns(LegacyConfigWarning, match=f"backend '{old}' is deprecated"):
            assert ArcticRLClientConfig(backend=old).backend == new
    with pytest.raises(ValueError, match="backend 'ray'"):
        ArcticRLClientConfig(backend="ray")


def test_field_aliases_dropped_fields_and_unknown_fields() -> None:
    with pytest.warns(LegacyConfigWarning) as rec:
        cfg = ArcticRLClientConfig.model_validate(
            {
                "sample_gpus": 2,
                "sampling_engine": {"max_num_seqs": 4},
                "reference_model": "x",
                "job_name": "j",
                "ray_auto_attach": True,
                "health_check_interval": 2.0,
            }
        )
    assert cfg.sampling_gpus == 2 and cfg.vllm_config == {"max_num_seqs": 4}
    text = " ".join(str(w.message) for w in rec)
    for name in (
        "sample_gpus",
        "sampling_engine",
        "reference_model",
        "job_name",
        "ray_auto_attach",
        "health_check_interval",
    ):
        assert name in text
    with pytest.raises(ValueError) as info:
        ArcticRLClientConfig.model_validate({"training_gpu": 1, "colocated": True})
    assert "training_gpu" in str(info.value) and "colocated" in str(info.value)


def test_arctic_backend_env_turns_local_into_cortex(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARCTIC_BACKEND", "cortex")
    monkeypatch.setenv("CORTEX_BASE_URL", "https://cortex.example")
    monkeypatch.setenv("CORTEX_DATABASE", "db1")
    cfg = ArcticRLClientConfig(backend="local", model_name="m")
    assert cfg.backend == "cortex" and cfg.cortex_base_url == "https://cortex.example"
    kw = cfg.sdk_kwargs()
    assert kw["base_url"] == "https://cortex.example" and kw["database"] == "db1"
    assert not cfg.should_launch(reachable=False)  # never launches a Cortex backend
    monkeypatch.setenv("ARCTIC_BACKEND", "local")
    assert ArcticRLClientConfig(backend="local").backend == "onprem"


def test_create_job_body_from_legacy_fields() -> None:
    cfg = ArcticRLClientConfig(
        model_name="tiny",
        training_gpus=1,
        sampling_gpus=1,
        log_prob_gpus=1,
        ds_config={
            "train_micro_batch_size_per_gpu": 2,
            "bf16": {"enabled": True},
            "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95]}},
            "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
        },
        training_config={"max_length": 128, "optimizer": {"gradient_clipping": 0.5}},
        vllm_config={"max_model_len": 128},
    )
    body = cfg.create_job_body()  # a server with the standard keys only
    training, sampling, log_prob = body["sub_job_configs"]
    tc = training["training_config"]
    assert tc["optimizer"] == {"name": "adamw", "lr": 3e-4, "betas": [0.9, 0.95]}
    assert tc["zero_stage"] == 2 and tc["gradient_clipping"] == 0.5 and tc["max_seq_len"] == 128
    assert tc["micro_batch_size"] == 2  # the rows of one pass
    # bf16 is every sub-job's dtype; the rest of the DeepSpeed config passes through
    assert {s["dtype"] for s in body["sub_job_configs"]} == {"bfloat16"}
    assert tc["deepspeed"] == {"zero_optimization": {"offload_optimizer": {"device": "cpu"}}}
    assert sampling["inference_config"] == {
        "n_gpus": 1,
        "vllm_config": {"max_model_len": 128},
        "max_seq_len": 128,
    }
    assert log_prob["inference_config"] == {"n_gpus": 1, "max_seq_len": 128}


def test_legacy_method_table() -> None:
    assert legacy_method("fwd_bwd").name == "forward-backward"
    assert legacy_method("empty_training_cache").name == "sleep-training"
    with pytest.raises(KeyError, match="no legacy method"):
        legacy_method("nope")


def test_client_has_every_legacy_method(fake_server: Server) -> None:
    client = create_arctic_rl_client(fake_server.config())
    try:
        for name in (
            *LEGACY_ASYNC_METHODS,
            "load_checkpoint",
            "reconnect_config",
            "get_server_state",
        ):
            assert callable(getattr(client, name)), name
        for prop in ("training_job_id", "sampling_job_id", "log_prob_job_id"):
            assert hasattr(client, prop)
    finally:
        asyncio.run(client.shutdown())


async def test_refused_knobs_send_nothing(fake_server: Server) -> None:
    client = create_arctic_rl_client(fake_server.config())
    try:
        before = len(fake_server.execution_log(client.job_id))
        bad = L.skyrl_fwd_bwd_payload(policy_loss_config={"loss_mode": "gpg"}, new_knob=1)
        with pytest.raises(UnsupportedKnobsError) as info:
            await client.fwd_bwd(bad)
        assert len(info.value.options) == 2
        with pytest.raises(InvalidArgumentError, match="best_of"):
            await client.generate(["x"], {"best_of": 2, "use_beam_search": True})
        with pytest.raises(InvalidArgumentError, match="router_replay"):
            await client.fwd_bwd(L.skyrl_fwd_bwd_payload(), router_replay={"x": 1})
        assert len(fake_server.execution_log(client.job_id)) == before
    finally:
        await client.shutdown()


async def test_reference_model_runs_on_the_log_prob_sub_job(fake_server: Server) -> None:
    client = create_arctic_rl_client(fake_server.config(log_prob_gpus=1))  # the execution log
    try:
        await client.fwd_no_grad(L.skyrl_fwd_no_grad_payload(), reference_model=True)
        await client.fwd_no_grad(L.skyrl_fwd_no_grad_payload())
        log = [e for e in fake_server.execution_log(client.job_id) if e["op"] == "forward"]
        assert [e["target"] for e in log[-2:]] == [client.log_prob_job_id, client.training_job_id]
    finally:
        await client.shutdown()


async def test_skyrl_forward_sends_a_forward_only_what_it_reads(fake_server: Server) -> None:
    """SkyRL's `forward` sends its whole batch (`advantages`, `loss_mask`) and train meta to
    `fwd_no_grad`; a loss-free forward refuses a context it does not read (issue 37), so compat
    leaves it out and the call answers log-probs and entropy."""
    client = create_arctic_rl_client(fake_server.config())
    try:
        out = await client.fwd_no_grad(L.skyrl_forward_payload())
        assert {"logprobs", "entropy"} <= set(out["batch"]), out["batch"].keys()
        assert out["batch"]["logprobs"].shape == L.INPUT_IDS.shape
    finally:
        await client.shutdown()


def _child_step(blob: bytes) -> dict[str, Any]:
    """In a fresh interpreter: unpickle the client (re-attach by job id) and train one step."""
    client = pickle.loads(blob)
    try:
        out = asyncio.run(client.fwd_bwd(L.skyrl_fwd_bwd_payload()))
        step = asyncio.run(client.step())
        return {
            "job_id": client.job_id,
            "num_tokens": out["metrics"]["num_tokens"],
            "grad_norm": step["metrics"]["grad_norm"],
        }
    finally:
        asyncio.run(client.shutdown())


def test_client_survives_pickling_into_another_process(fake_server: Server) -> None:
    client = create_arctic_rl_client(fake_server.config())
    try:
        jobs_before = len(fake_server.fake.servicer.jobs.jobs)  # type: ignore[union-attr]
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(1) as pool:
            got = pool.apply(_child_step, (pickle.dumps(client),))
        assert got["job_id"] == client.job_id and got["num_tokens"] == 4
        assert len(got["grad_norm"]) == 1
        assert len(fake_server.fake.servicer.jobs.jobs) == jobs_before  # no job was created
        state = fake_server.fake.call(fake_server.fake.servicer.job_state, client.job_id)
        assert state["state"] == "running" and state["applied_steps"] == 1
    finally:
        asyncio.run(client.shutdown())
    state = fake_server.fake.call(fake_server.fake.servicer.job_state, client.job_id)
    assert state["state"] == "cancelled"  # the creating client cancels on shutdown


async def test_checkpoints_and_legacy_only_methods(fake_server: Server) -> None:
    client = create_arctic_rl_client(fake_server.config(log_prob_gpus=1))
    try:
        await client.fwd_bwd(L.skyrl_fwd_bwd_payload())
        await client.step()
        saved = await client.save_checkpoint()
        assert saved["path"] == "step-1" and saved["global_step"] == 1
        weights = await client.save_weights("/tmp/out/final-weights")
        assert weights["checkpoint"]["checkpoint_type"] == "weights-only"
        loaded = await client.load_checkpoint(step=1)
        assert loaded["path"] == "step-1" and loaded["global_step"] == 1
        latest = await client.load_checkpoint()
        assert latest["global_step"] == 1
        assert (await client.sleep_log_prob())["log_prob"]["applied"] is False
        assert "log_prob" in await client.wake_log_prob()
        scored = await client.log_probs([[5, 6, 7]], [[8, 9]])
        assert scored["batch"]["logprobs"].shape == (1, 5)
        with pytest.raises(UnimplementedError, match="weight_norm"):
            await client.weight_norm()
    finally:
        await client.shutdown()


async def test_generate_clamps_max_tokens_to_the_room_by_default(fake_server: Server) -> None:
    """Issue 37: SkyRL and verl ask for a fixed response length that a long prompt may not
    leave room for; compat asks the server to clamp (`clamp_max_tokens`), and each sample says
    so. `clamp_max_tokens=False` gets the server's refusal, naming the room."""
    client = create_arctic_rl_client(fake_server.config(max_seq_len=32))
    try:
        long, short = [7] * 28, [7] * 4  # rooms 4 and 28
        out = await client.generate([long, short], {"max_new_tokens": 10, "seed": 1})
        assert [s["generation_len"] for s in out] == [4, 10]
        assert out[0]["clamped_max_tokens"] == 4 and out[0]["finish_reason"] == "length"
        assert "clamped_max_tokens" not in out[1]
        with pytest.raises(InvalidArgumentError) as info:
            await client.generate([long], {"max_tokens": 10}, clamp_max_tokens=False)
        assert info.value.details["room"] == 4
        assert info.value.details["field"] == "sampling_params.max_tokens"
    finally:
        await client.shutdown()
