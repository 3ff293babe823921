"""The training options (`engines/deepspeed/train_options.py`) at CreateJob: pure, no engines."""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest

from arctic_servers.engines.config import config_keys, sub_job_specs
from arctic_servers.engines.deepspeed.train_options import lr_factor
from arctic_servers.rules.errors import ProtocolError


def _train(**conf: Any) -> dict[str, Any]:
    return {"sub_job_configs": [{"job_type": "training", "training_config": conf}]}


def test_lr_factor_warms_up_then_decays() -> None:
    cos = {"type": "cosine", "warmup_steps": 4, "total_steps": 12, "min_lr_ratio": 0.1}
    got = [lr_factor(t, cos) for t in range(14)]
    assert got[:4] == [0.25, 0.5, 0.75, 1.0]  # (t + 1) / warmup: no step at lr 0
    assert got[4] == 1.0 and got[12] == pytest.approx(0.1) and got[13] == pytest.approx(0.1)
    mid = 0.1 + 0.9 * (1 + math.cos(math.pi * 4 / 8)) / 2  # t = 8: half-way through the decay
    assert got[8] == pytest.approx(mid)
    assert all(a >= b for a, b in itertools.pairwise(got[4:]))
    lin = {"type": "linear", "warmup_steps": 0, "total_steps": 10, "min_lr_ratio": 0.0}
    assert [lr_factor(t, lin) for t in (0, 5, 10, 20)] == [1.0, 0.5, 0.0, 0.0]
    const = {"type": "constant", "warmup_steps": 2, "total_steps": 0, "min_lr_ratio": 0.0}
    assert [lr_factor(t, const) for t in range(4)] == [0.5, 1.0, 1.0, 1.0]


@pytest.mark.parametrize(
    ("conf", "field", "code"),
    [
        ({"lr_scheduler": {"type": "step"}}, "lr_scheduler.type", "invalid_argument"),
        ({"lr_scheduler": {"type": "cosine"}}, "lr_scheduler.total_steps", "missing_field"),
        ({"lr_scheduler": {"warmup_steps": -1}}, "lr_scheduler.warmup_steps", "invalid_argument"),
        (
            {"lr_scheduler": {"type": "linear", "total_steps": 5, "min_lr_ratio": 2}},
            "lr_scheduler.min_lr_ratio",
            "invalid_argument",
        ),
        ({"lr_scheduler": {"gamma": 0.5}}, "lr_scheduler.gamma", "unsupported_option"),
        (
            {
                "lr_scheduler": {"type": "constant"},
                "deepspeed": {"scheduler": {"type": "WarmupLR"}},
            },
            "lr_scheduler",
            "invalid_argument",
        ),
        ({"activation_checkpointing": "yes"}, "activation_checkpointing", "invalid_argument"),
        ({"full_determinism": 1}, "full_determinism", "invalid_argument"),
        ({"attn_implementation": "flash"}, "attn_implementation", "invalid_argument"),
        ({"checkpoint_path": "relative/dir"}, "checkpoint_path", "invalid_argument"),
        ({"checkpoint_path": "/tmp/../etc"}, "checkpoint_path", "invalid_argument"),
        ({"use_liger": True}, "use_liger", "unsupported_option"),
    ],
)
def test_bad_training_options_are_refused_by_name(
    conf: dict[str, Any], field: str, code: str
) -> None:
    with pytest.raises(ProtocolError) as err:
        sub_job_specs(_train(**conf), cuda=False)
    assert err.value.code == code
    assert err.value.details["field"] == f"sub_job_configs[0].training_config.{field}"


def test_training_options_are_accepted() -> None:
    (spec,) = sub_job_specs(
        _train(
            lr_scheduler={"type": "cosine", "warmup_steps": 2, "total_steps": 10},
            activation_checkpointing=True,
            full_determinism=True,
            attn_implementation="flash_attention_2",
            checkpoint_path="/tmp/arctic-ckpts",
        ),
        cuda=False,
    )
    assert spec.config["lr_scheduler"] == {
        "type": "cosine",
        "warmup_steps": 2,
        "total_steps": 10,
        "min_lr_ratio": 0.0,
    }


def test_log_prob_deepspeed_engine_config() -> None:
    body = {
        "sub_job_configs": [
            {
                "job_type": "log_prob",
                "inference_config": {
                    "engine": "deepspeed",
                    "deepspeed": {"zero_optimization": {"stage": 3}},
                    "full_determinism": True,
                },
            }
        ]
    }
    (spec,) = sub_job_specs(body, cuda=False)
    assert spec.config["deepspeed"] == {"zero_optimization": {"stage": 3}}
    for bad, field in (
        ({"engine": "hf", "deepspeed": {}}, "deepspeed"),
        (
            {"engine": "deepspeed", "deepspeed": {"optimizer": {"type": "AdamW"}}},
            "deepspeed.optimizer",
        ),
    ):
        body["sub_job_configs"][0]["inference_config"] = bad
        with pytest.raises(ProtocolError) as err:
            sub_job_specs(body, cuda=False)
        assert err.value.details["field"] == f"sub_job_configs[0].inference_config.{field}"


def test_advertised_keys_are_the_accepted_ones() -> None:
    keys = config_keys()
    assert {"lr_scheduler", "activation_checkpointing", "checkpoint_path"} <= keys["training"]
    assert {"engine", "deepspeed"} <= keys["log_prob"] and "engine" not in keys["sampling"]


def test_capabilities_advertise_the_config_keys(tmp_path: Any) -> None:
    """Each server lists the sub-job config keys it accepts: the fake the standard ones and
    `lora`, the on-prem server its extensions too, the gateway's on-prem engines all but
    checkpoint_path (which its checkpoint store replaces, refused by name); both servers offer
    `lora` (the gateway trains LoRA jobs on its data plane, PROTOCOL.md §3.6)."""
    from arctic_servers.gateway.profiles import OnpremProfile
    from arctic_servers.gateway.settings import GatewaySettings
    from arctic_servers.onprem.servicer import OnpremServicer
    from arctic_servers.rules.jobs import config_keys_json
    from conformance.fake.servicer import FakeServicer

    std = config_keys_json()
    assert FakeServicer.config_keys == {**std, "training": sorted([*std["training"], "lora"])}
    assert "lr_scheduler" not in std["training"]
    onprem = OnpremServicer.config_keys
    assert set(std["training"]) < set(onprem["training"])
    assert "checkpoint_path" in onprem["training"]
    assert "deepspeed" in onprem["log_prob"]
    gateway = OnpremProfile(GatewaySettings(db=tmp_path / "g.db", engine="onprem"))
    keys = gateway.config_keys
    assert "lr_scheduler" in keys["training"] and "checkpoint_path" not in keys["training"]
    assert "lora" in onprem["training"] and "lora" in keys["training"]
    with pytest.raises(ProtocolError) as err:
        gateway.sub_jobs(_train(checkpoint_path="/tmp/x"))
    assert err.value.code == "unsupported_option"
    assert err.value.details["field"] == "sub_job_configs[0].training_config.checkpoint_path"
