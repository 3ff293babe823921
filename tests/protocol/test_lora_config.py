"""The LoRA rules every server shares (rules/lora_config.py, PROTOCOL.md §3.6): defaults,
refusals naming the field, the job-level sampler limit, generate's `adapter`, the export format
and `weight_format`."""

from __future__ import annotations

from typing import Any

import pytest

from arctic_servers.rules import lora_config as lc
from arctic_servers.rules.errors import ProtocolError


def refused(fn: Any, *args: Any) -> ProtocolError:
    with pytest.raises(ProtocolError) as e:
        fn(*args)
    return e.value


def test_defaults() -> None:
    assert lc.check_lora({}, "lora") == {
        "rank": 8,
        "alpha": 16.0,
        "dropout": 0.0,
        "target_modules": list(lc.TARGET_MODULES),
        "train_embeddings": False,
        "train_lm_head": False,
    }
    assert lc.check_lora({"rank": 4.0, "target_modules": ["v_proj", "q_proj", "v_proj"]}, "l")[
        "target_modules"
    ] == ["v_proj", "q_proj"]


@pytest.mark.parametrize(
    ("lora", "code", "field"),
    [
        ({"rank": 0}, "invalid_argument", "l.rank"),
        ({"rank": -3}, "invalid_argument", "l.rank"),
        ({"rank": 513}, "invalid_argument", "l.rank"),
        ({"rank": True}, "invalid_argument", "l.rank"),
        ({"alpha": 0}, "invalid_argument", "l.alpha"),
        ({"alpha": "big"}, "invalid_argument", "l.alpha"),
        ({"dropout": 1}, "invalid_argument", "l.dropout"),
        ({"target_modules": []}, "invalid_argument", "l.target_modules"),
        ({"target_modules": "q_proj"}, "invalid_argument", "l.target_modules"),
        ({"target_modules": ["q_proj", "lm_head"]}, "invalid_argument", "l.target_modules[1]"),
        ({"train_lm_head": "yes"}, "invalid_argument", "l.train_lm_head"),
        ({"use_dora": True}, "unsupported_option", "l.use_dora"),
        (5, "invalid_argument", "l"),
    ],
)
def test_refusals_name_the_field(lora: Any, code: str, field: str) -> None:
    e = refused(lc.check_lora, lora, "l")
    assert (e.code, e.details.get("field")) == (code, field), e.message


def test_unknown_module_names_the_available_ones() -> None:
    e = refused(lc.check_lora, {"target_modules": ["qkv"]}, "l")
    assert "'qkv'" in e.message and e.details["available"] == list(lc.TARGET_MODULES)
    assert "train_lm_head" in refused(lc.check_lora, {"target_modules": ["lm_head"]}, "l").message


def test_no_support_refuses() -> None:
    none = lc.LoraSupport(training=False)
    assert refused(lc.check_lora, {}, "l", none).code == "unsupported_option"


def test_embeddings_with_a_sampler_merge_and_push_or_are_refused_by_name() -> None:
    lora = lc.check_lora({"train_embeddings": True}, "c0")
    job = [("training", "c0", {"lora": lora}), ("sampling", "c1", {})]
    lc.check_job_lora(job)  # the servers' default: accepted, its syncs push merged weights
    assert not lc.adapter_sync(lora) and lc.SUPPORT.json()["merged_sync"] is True
    no_merge = lc.LoraSupport(merged_sync=False)
    e = refused(lc.check_job_lora, job, no_merge)
    assert e.code == "unsupported_option" and e.details["options"] == ["c0.lora.train_embeddings"]
    lc.check_job_lora(job[:1], no_merge)  # no sampler: trained and checkpointed
    lc.check_job_lora(job, lc.LoraSupport(sampler_embeddings=True, merged_sync=False))
    assert lc.adapter_sync(lora, lc.LoraSupport(sampler_embeddings=True))
    assert lc.adapter_sync(lc.check_lora({}, "c0")) and not lc.adapter_sync(None)


def test_vllm_rank_and_adapter_and_formats() -> None:
    assert [lc.vllm_max_rank(r) for r in (1, 2, 8, 9, 33, 512)] == [1, 8, 8, 16, 64, 512]
    assert (
        lc.check_adapter({}, True) == "" and lc.check_adapter({"adapter": "base"}, True) == "base"
    )
    assert refused(lc.check_adapter, {"adapter": "base"}, False).details["field"] == "adapter"
    assert refused(lc.check_adapter, {"adapter": 3}, True).code == "invalid_argument"
    assert (
        lc.export_format({}, False) == "hf" and lc.export_format({"format": "peft"}, True) == "peft"
    )
    assert refused(lc.export_format, {"format": "peft"}, False).details["field"] == "format"
    lc.check_weight_format({"weight_format": "lora"}, True, "payload.")
    lc.check_weight_format({"weight_format": "vllm"}, False, "payload.")
    e = refused(lc.check_weight_format, {"weight_format": "hf"}, True, "payload.")
    assert e.code == "unsupported_option" and e.details["field"] == "payload.weight_format"
    assert (
        refused(lc.check_weight_format, {"weight_format": "lora"}, False, "").code
        == "invalid_argument"
    )


def test_job_lora() -> None:
    assert lc.job_lora([("training", {}), ("sampling", {})]) is None
    assert lc.job_lora([("training", {"lora": {"rank": 4}})]) == {"rank": 4}
