"""verl's and SkyRL's LoRA fields onto `training_config.lora` (compat/lora.py): each field sent,
refused or reported without effect, by name; the resulting body passes the servers' own LoRA
rules (rules/lora_config.py). Pure: no server."""

from __future__ import annotations

from typing import Any

import pytest

from arctic_sdk.compat import ArcticRLClientConfig
from arctic_sdk.compat.job_config import JobPlan, UnsupportedConfigError, plan_job
from arctic_sdk.spec.model import STANDARD_CONFIG_KEYS
from arctic_servers.engines.config import config_keys, sub_job_specs

ONPREM = config_keys()


@pytest.fixture(autouse=True)
def _lora_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server's rules as with peft installed (this module needs no engine)."""
    from arctic_servers.engines import config as settings
    from arctic_servers.rules.lora_config import LoraSupport

    monkeypatch.setattr(settings, "LORA", LoraSupport())


def plan(tc: dict[str, Any], keys: Any = ONPREM) -> JobPlan:
    cfg = ArcticRLClientConfig.model_validate(
        {"model_name": "tiny", "training_gpus": 1, "sampling_gpus": 1, "training_config": tc}
    )
    return plan_job(cfg, keys)


def lora_of(p: JobPlan) -> Any:
    (t,) = [s for s in p.body["sub_job_configs"] if s["job_type"] == "training"]
    return t["training_config"].get("lora")


def test_verl_flat_fields_map_and_pass_the_server_rules() -> None:
    p = plan({"lora_rank": 16, "lora_alpha": 32, "target_modules": "all-linear", "use_shm": True})
    assert lora_of(p) == {"rank": 16, "alpha": 32, "target_modules": "all-linear"}
    assert any("training_config.use_shm" in w for w in p.warnings)
    (t, _s) = sub_job_specs(p.body, cuda=False)  # the on-prem server accepts the body
    assert t.config["lora"]["rank"] == 16 and "down_proj" in t.config["lora"]["target_modules"]


def test_skyrl_block_maps() -> None:
    mapped = {"rank": 8, "alpha": 16, "dropout": 0.05, "target_modules": ["q_proj", "v_proj"]}
    block = {**mapped, "init_method": "kaiming", "lora_sync_path": "/tmp/s", "max_loras": 1}
    p = plan({"lora": block})
    assert lora_of(p) == mapped
    assert any("training_config.lora.lora_sync_path" in w for w in p.warnings)
    sub_job_specs(p.body, cuda=False)


@pytest.mark.parametrize("tc", [{"lora_rank": 0}, {"lora": {"rank": 0}}, {}])
def test_rank_zero_is_no_lora(tc: dict[str, Any]) -> None:
    assert lora_of(plan(tc)) is None


@pytest.mark.parametrize(
    ("tc", "named"),
    [
        (
            {"lora": {"rank": 8, "exclude_modules": ["o_proj"]}},
            "training_config.lora.exclude_modules",
        ),
        ({"lora_rank": 8, "lora_adapter_path": "/ckpt/a"}, "training_config.lora_adapter_path"),
        ({"lora": {"rank": 8, "init_method": "xavier"}}, "training_config.lora.init_method"),
        ({"lora": {"rank": 8, "use_dora": True}}, "training_config.lora.use_dora"),
        ({"lora": {"rank": 8}, "lora_rank": 8}, "training_config.lora"),
        ({"lora_rank": 0, "lora_alpha": 16}, "training_config.lora_alpha"),
    ],
)
def test_refused_by_name(tc: dict[str, Any], named: str) -> None:
    err = UnsupportedConfigError(plan(tc).problems)
    assert named in err.options, err.options


def test_refused_when_the_server_offers_no_lora() -> None:
    p = plan({"lora_rank": 8}, STANDARD_CONFIG_KEYS)  # would silently train every weight
    assert "training_config.lora" in UnsupportedConfigError(p.problems).options
