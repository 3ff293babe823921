"""Every field of the legacy configs (Arctic-Platform `arctic_platform.rl.config` and
`arctic_platform.client.config`, as SkyRL and verl set them) is honoured, refused or warned about
by name (`compat/job_config.py`): one test per field, against a server that offers the on-prem
keys and one that offers the standard keys only. Pure: no server."""

from __future__ import annotations

from typing import Any

import pytest

from arctic_sdk.compat import ArcticRLClientConfig
from arctic_sdk.compat.job_config import JobPlan, plan_job
from arctic_sdk.compat.unified import (
    CortexConfig,
    OnPremConfig,
    SamplingConfig,
    TrainingConfig,
    UnifiedClientConfig,
)
from arctic_sdk.spec.model import STANDARD_CONFIG_KEYS
from arctic_servers.engines.config import config_keys

ONPREM = config_keys()
STD = STANDARD_CONFIG_KEYS

#: every field of arctic_platform.rl.config.ArcticRLClientConfig (the SkyRL / verl PR config)
UPSTREAM_FIELDS = [
    "backend",
    "comm_protocol",
    "checkpoint_path",
    "host",
    "port",
    "model_name",
    "ds_config",
    "training_config",
    "vllm_config",
    "log_prob_ds_config",
    "ds_worker_config",
    "arctic_inference_config",
    "full_determinism",
    "seed",
    "training_gpus",
    "sampling_gpus",
    "log_prob_gpus",
    "log_prob_engine",
    "colocate",
    "cuda_ipc",
    "low_memory",
    "server_logs",
    "ray_auto_attach",
    "startup_timeout",
    "health_check_interval",
    "job_ready_timeout",
    "training_job_id",
    "sampling_job_id",
    "log_prob_job_id",
]


def plan(keys: Any = ONPREM, **fields: Any) -> JobPlan:
    cfg = ArcticRLClientConfig.model_validate(
        {"model_name": "tiny", "training_gpus": 1, "sampling_gpus": 1, **fields}
    )
    return plan_job(cfg, keys)


def sub(p: JobPlan, role: str) -> dict[str, Any]:
    (s,) = [s for s in p.body["sub_job_configs"] if s["job_type"] == role]
    return dict(s.get("training_config") or s.get("inference_config") or {})


def warned(p: JobPlan, *names: str) -> None:
    text = " | ".join(p.warnings)
    for n in names:
        assert n in text, (n, p.warnings)


def refused(p: JobPlan, *names: str) -> None:
    text = " | ".join(p.problems)
    for n in names:
        assert n in text, (n, p.problems)


def test_every_upstream_field_is_a_field_here() -> None:
    fields = set(ArcticRLClientConfig.model_fields)
    dropped = {"ray_auto_attach", "health_check_interval"}  # warned at validation
    reconnect = {"training_job_id", "sampling_job_id", "log_prob_job_id"}  # -> job_id
    assert set(UPSTREAM_FIELDS) - fields - dropped - reconnect == set()


def test_lr_scheduler_and_training_horizon() -> None:
    tc = {"training_horizon": 100, "optimizer": {"lr": 1e-4}}
    cosine = {"type": "cosine", "warmup_ratio": 0.05, "min_lr_ratio": 0.1}
    p = plan(training_config={**tc, "lr_scheduler": cosine})
    assert sub(p, "training")["lr_scheduler"] == {
        "type": "cosine",
        "warmup_steps": 5,
        "total_steps": 100,
        "min_lr_ratio": 0.1,
    }
    warm = plan(training_config={**tc, "lr_scheduler": {"type": "constant", "warmup_ratio": 0.1}})
    assert sub(warm, "training")["lr_scheduler"]["warmup_steps"] == 10
    flat = plan(training_config={**tc, "lr_scheduler": {"type": "constant", "warmup_ratio": 0.0}})
    assert "lr_scheduler" not in sub(flat, "training")  # constant: the optimizer's lr
    warned(flat, "training_config.training_horizon")
    refused(plan(training_config={"lr_scheduler": {"type": "cosine"}}), "training_horizon")
    refused(plan(training_config={**tc, "lr_scheduler": {"type": "step"}}), "lr_scheduler.type")
    refused(plan(training_config={**tc, "lr_scheduler": {"gamma": 1}}), "lr_scheduler.gamma")
    std = plan(STD, training_config={**tc, "lr_scheduler": {"type": "cosine"}})
    warned(std, "training_config.lr_scheduler", "'lr_scheduler'")
    assert "lr_scheduler" not in sub(std, "training")


def test_training_config_optimizer_and_other_keys() -> None:
    p = plan(
        training_config={
            "optimizer": {"lr": 2e-5, "beta1": 0.9, "beta2": 0.95, "max_grad_norm": 0.5},
            "max_length": 64,
            "model_config": None,
            "dtype": "bf16",
            "gradient_checkpointing": True,
            "gradient_accumulation_steps": 4,
        }
    )
    tc = sub(p, "training")
    assert tc["optimizer"] == {"name": "adamw", "lr": 2e-5, "betas": [0.9, 0.95]}
    assert tc["gradient_clipping"] == 0.5 and tc["max_seq_len"] == 64
    assert tc["activation_checkpointing"] is True
    assert {s["dtype"] for s in p.body["sub_job_configs"]} == {"bfloat16"}
    warned(p, "training_config.gradient_accumulation_steps")
    refused(plan(training_config={"model_config": {"n_layer": 2}}), "training_config.model_config")
    refused(plan(training_config={"optimizer": {"momentum": 0.9}}), "optimizer.momentum")
    refused(plan(training_config={"mb_spec": {}}), "training_config.mb_spec")


def test_attn_implementation() -> None:
    p = plan(training_config={"attn_implementation": "flash_attention_2"})
    assert sub(p, "training")["attn_implementation"] == "flash_attention_2"
    warned(p, "flash_attention_2", "sdpa")
    w = plan(ds_worker_config={"attn_implementation": "sdpa"})
    assert sub(w, "training")["attn_implementation"] == "sdpa" and not w.warnings
    warned(plan(STD, ds_worker_config={"attn_implementation": "eager"}), "attn_implementation")


def test_ds_worker_config() -> None:
    p = plan(
        ds_worker_config={
            "use_liger": True,
            "enable_gradient_checkpointing": True,
            "zorro_train_enable": True,
            "response_len": 12,
            "use_unpad": True,
        }
    )
    assert sub(p, "training")["activation_checkpointing"] is True
    for name in ("use_liger", "zorro_train_enable", "response_len", "use_unpad"):
        warned(p, f"ds_worker_config.{name}")
    refused(plan(ds_worker_config={"model_provider": "x"}), "ds_worker_config.model_provider")
    warned(plan(STD, ds_worker_config={"enable_gradient_checkpointing": True}), "gradient_checkp")
    assert not plan(ds_worker_config={"use_liger": False}).warnings


def test_ds_config() -> None:
    p = plan(
        ds_config={
            "train_micro_batch_size_per_gpu": 2,
            "train_batch_size": 8,
            "gradient_accumulation_steps": 4,
            "sequence_parallel_size": 1,
            "fp16": {"enabled": True},
            "gradient_clipping": 0.7,
            "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "eps": 1e-6}},
            "zero_optimization": {"stage": 3, "offload_param": {"device": "none"}},
            "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 5}},
            "torch_autocast": {"enabled": False},
            "log_level": "INFO",
        }
    )
    tc = sub(p, "training")
    assert tc["optimizer"] == {"name": "adam", "lr": 1e-3, "eps": 1e-6}
    assert tc["micro_batch_size"] == 2 and tc["zero_stage"] == 3 and tc["gradient_clipping"] == 0.7
    assert tc["deepspeed"] == {  # passed to DeepSpeed, which honours them
        "zero_optimization": {"offload_param": {"device": "none"}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 5}},
        "torch_autocast": {"enabled": False},
        "log_level": "INFO",
    }
    assert {s["dtype"] for s in p.body["sub_job_configs"]} == {"float16"}
    warned(p, "ds_config.train_batch_size", "ds_config.gradient_accumulation_steps")
    refused(plan(ds_config={"sequence_parallel_size": 2}), "ds_config.sequence_parallel_size")
    refused(
        plan(ds_config={"bf16": {"enabled": True}, "fp16": {"enabled": True}}), "ds_config.bf16"
    )
    refused(plan(ds_config={"optimizer": {"params": {"foo": 1}}}), "optimizer.params.foo")


def test_checkpoint_path() -> None:
    p = plan(checkpoint_path="/data/ckpts")
    assert sub(p, "training")["checkpoint_path"] == "/data/ckpts"
    warned(plan(STD, checkpoint_path="/data/ckpts"), "checkpoint_path")


def test_full_determinism_and_seed() -> None:
    p = plan(full_determinism=True, seed=7, log_prob_gpus=1, log_prob_engine="hf")
    assert sub(p, "training")["full_determinism"] is True
    assert sub(p, "log_prob")["full_determinism"] is True
    assert {s["seed"] for s in p.body["sub_job_configs"]} == {7}
    warned(plan(STD, full_determinism=True), "full_determinism")


def test_colocate_is_warned() -> None:
    warned(plan(colocate=True), "colocate=True")
    assert not plan(colocate=False).warnings


def test_log_prob_engine_and_ds_config() -> None:
    p = plan(
        log_prob_gpus=1,
        log_prob_engine="deepspeed",
        log_prob_ds_config={
            "train_micro_batch_size_per_gpu": 1,
            "train_batch_size": 4,
            "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "none"}},
            "optimizer": {"type": "AdamW"},
            "log_level": "INFO",
        },
    )
    lp = sub(p, "log_prob")
    assert lp["engine"] == "deepspeed"
    assert lp["deepspeed"] == {
        "zero_optimization": {"stage": 3},
        "train_micro_batch_size_per_gpu": 1,
        "log_level": "INFO",
    }
    for name in ("optimizer", "train_batch_size", "zero_optimization.offload_optimizer"):
        warned(p, f"log_prob_ds_config.{name}")
    assert sub(plan(log_prob_gpus=1, log_prob_engine="vllm"), "log_prob")["engine"] == "vllm"
    refused(
        plan(log_prob_gpus=1, log_prob_ds_config={"sequence_parallel_size": 2}),
        "log_prob_ds_config.sequence_parallel_size",
    )
    std = plan(STD, log_prob_gpus=1, log_prob_engine="deepspeed", log_prob_ds_config={"x": 1})
    warned(std, "log_prob_engine='deepspeed'", "log_prob_ds_config")
    assert "engine" not in sub(std, "log_prob")


def test_vllm_and_arctic_inference_config() -> None:
    p = plan(vllm_config={"max_model_len": 64, "forest_cascade_attn_configs": "{}"})
    assert sub(p, "sampling")["vllm_config"] == {"max_model_len": 64}
    warned(p, "vllm_config.forest_cascade_attn_configs")
    spec = {"speculative_config": {"method": "arctic", "model": "draft"}}
    refused(plan(vllm_config=spec), "vllm_config.speculative_config")
    off = {"zorro_inference": {"enable": False}, "speculative_decoding": {"model": ""}}
    assert not plan(arctic_inference_config=off).problems  # verl's stock block: off
    fca = plan(arctic_inference_config={"zorro_inference": {"enable": True}})
    refused(fca, "arctic_inference_config")


def test_gpus_dtype_max_seq_len() -> None:
    p = plan(training_gpus=2, sampling_gpus=0, log_prob_gpus=0, dtype="bf16", max_seq_len=300)
    assert [s["job_type"] for s in p.body["sub_job_configs"]] == ["training"]
    tc = sub(p, "training")
    assert tc["n_gpus"] == 2 and tc["max_seq_len"] == 300
    assert p.body["sub_job_configs"][0]["dtype"] == "bfloat16"
    assert not plan(training_gpus=0, sampling_gpus=1).problems  # a sampling-only job
    refused(plan(training_gpus=0, sampling_gpus=0), "training_gpus")


def test_connection_fields() -> None:
    cfg = ArcticRLClientConfig(
        model_name="m",
        host="h",
        port=9,
        comm_protocol="ray",
        startup_timeout=5,
        job_ready_timeout=6,
        request_timeout=7,
        max_retries=2,
        server_logs=True,
        server_cuda_visible_devices="0,1",
    )
    kw = cfg.sdk_kwargs()
    assert kw["base_url"] == "http://h:9" and kw["job_ready_timeout"] == 6
    assert kw["timeout"] == 7 and kw["max_retries"] == 2
    assert cfg.should_launch(reachable=False)  # "ray": launch the local server when unreachable
    from arctic_sdk.compat.client import _server_env

    assert _server_env(cfg)["CUDA_VISIBLE_DEVICES"] == "0,1"  # type: ignore[index]


def test_server_logs_echo_the_launched_servers_output(capsys: pytest.CaptureFixture[str]) -> None:
    import subprocess
    import sys
    from collections import deque

    from arctic_sdk.compat.launch import _drain

    proc = subprocess.Popen(
        [sys.executable, "-c", "print('serving on 7000')"], stdout=subprocess.PIPE
    )
    out: deque[str] = deque()
    _drain(proc, out, echo=True)
    proc.wait()
    assert list(out) == ["serving on 7000"]
    assert "[arctic server] serving on 7000" in capsys.readouterr().out


def test_unified_config_maps_to_the_same_job() -> None:
    """`arctic_platform.client.ArcticRLClientConfig` (the plugin's): every field."""
    u = UnifiedClientConfig(
        model_name="tiny",
        seed=3,
        dtype="float32",
        max_seq_len=128,
        training_gpus=2,
        sampling_gpus=1,
        log_prob_gpus=1,
        job_ready_timeout=10,
        request_timeout=20,
        backend=OnPremConfig(
            protocol="ray",
            host="h",
            port=1,
            colocate=True,
            launch_local_server=True,
            server_cuda_visible_devices="1",
            startup_timeout=9,
        ),
        training=TrainingConfig(
            full_determinism=True,
            checkpoint_path="/c",
            ds_config={"optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}},
            ds_worker_config={"enable_gradient_checkpointing": True},
            cuda_ipc=True,
            low_memory=True,
        ),
        sampling=SamplingConfig(
            vllm={"enforce_eager": True},
            arctic_inference_config={"zorro_inference": {"enable": False}},
            log_prob_engine="deepspeed",
            log_prob_ds_config={"zero_optimization": {"stage": 0}},
        ),
    )
    flat = u.to_flat()
    assert (flat.host, flat.port, flat.comm_protocol, flat.colocate) == ("h", 1, "ray", True)
    assert flat.launch_local_server and flat.server_cuda_visible_devices == "1"
    assert (flat.startup_timeout, flat.job_ready_timeout, flat.request_timeout) == (9, 10, 20)
    assert flat.cuda_ipc and flat.low_memory and flat.seed == 3
    p = plan_job(flat, ONPREM)
    tc, lp = sub(p, "training"), sub(p, "log_prob")
    assert tc["n_gpus"] == 2 and tc["max_seq_len"] == 128 and tc["checkpoint_path"] == "/c"
    assert tc["full_determinism"] and tc["activation_checkpointing"]
    assert lp["engine"] == "deepspeed" and lp["deepspeed"] == {"zero_optimization": {"stage": 0}}
    assert sub(p, "sampling")["vllm_config"] == {"enforce_eager": True}
    cortex = UnifiedClientConfig(
        model_name="m",
        training_gpus=1,
        backend=CortexConfig(
            base_url="https://c", database="d", schema="s", pat="p", max_retries=3
        ),
    ).to_flat()
    assert cortex.backend == "cortex" and cortex.cortex_base_url == "https://c"
    assert cortex.cortex_schema == "s" and cortex.sdk_kwargs()["max_retries"] == 3
    again = UnifiedClientConfig(model_name="m", training_job_id="job-7:training:0").to_flat()
    assert again.job_id == "job-7"  # reconnect ids re-attach
    with pytest.raises(ValueError, match="extra"):
        UnifiedClientConfig(model_name="m", training=TrainingConfig(ds_configg={}))  # type: ignore[call-arg]
