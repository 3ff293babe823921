"""The per-op forwarding the on-prem server and the gateway share (`serving/forwarding.py`)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from arctic_sdk.spec.tables import methods as M
from arctic_servers.rules.errors import ProtocolError
from arctic_servers.serving import checkpoint_files as cf
from arctic_servers.serving import forwarding


@dataclass
class Sub:
    role: str
    weight_version: int = 0
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


@dataclass
class Job:
    global_step: int = 3
    weight_version: int = 5


async def call(sub: Sub, cmd: str, **args: Any) -> dict[str, Any]:
    sub.calls.append((cmd, args))
    if cmd == "sleep" and sub.role == "sampling":
        return {"applied": True, "reason": "vllm slept"}
    return {"reset": sub.role != "log_prob", "global_steps": 7, "applied": False}


def test_lifecycle_reaches_the_ops_roles_with_its_arguments() -> None:
    subs = [Sub("training"), Sub("sampling"), Sub("log_prob")]
    res = asyncio.run(
        forwarding.lifecycle(M.SLEEP_INFERENCE, {}, subs, subs[0], False, call, "idle")
    )
    assert res == {"applied": True, "reason": "vllm slept"}
    assert subs[0].calls == [] and subs[1].calls == [("sleep", {"level": 1})] == subs[2].calls
    res = asyncio.run(
        forwarding.lifecycle(
            M.SLEEP_TRAINING, {"mode": "optimizer"}, subs, subs[0], False, call, "idle"
        )
    )
    assert res == {"applied": False, "reason": "idle"}
    assert subs[0].calls == [("sleep", {"mode": "optimizer"})]
    named = Sub("sampling")
    asyncio.run(
        forwarding.lifecycle(M.WAKE_INFERENCE, {"tags": ["weights"]}, subs, named, True, call, "")
    )
    assert named.calls == [("wake", {"tags": ["weights"]})]
    assert set(forwarding.LIFECYCLE) == {
        M.SLEEP_INFERENCE.name,
        M.WAKE_INFERENCE.name,
        M.SLEEP_TRAINING.name,
        M.WAKE_TRAINING.name,
    }


def test_reset_prefix_cache_needs_every_sampler() -> None:
    subs = [Sub("training"), Sub("sampling"), Sub("log_prob")]
    assert asyncio.run(forwarding.reset_prefix_cache(subs, subs[0], False, call)) == {
        "reset": False
    }
    assert subs[0].calls == []
    only = [Sub("training")]  # no sampler: the target itself
    assert asyncio.run(forwarding.reset_prefix_cache(only, only[0], False, call)) == {"reset": True}


def test_load_checkpoint_trainer_sampler_and_adapter(tmp_path: Path) -> None:
    meta: dict[str, Any] = {"checkpoint_id": "c", "engine_tag": cf.ENGINE_TAG}
    job, trainer = Job(), Sub("training")

    async def no_export() -> Path:
        raise AssertionError("a trainer never exports")

    asyncio.run(
        forwarding.load_checkpoint(
            job, trainer, tmp_path, meta, call, ckpt="c", adapter_job=True, export=no_export
        )
    )
    assert trainer.calls[0][0] == "load" and job.global_step == 7 and job.weight_version == 5

    async def export() -> Path:
        return tmp_path / "export"

    sampler = Sub("sampling")
    asyncio.run(
        forwarding.load_checkpoint(
            job, sampler, tmp_path, meta, call, ckpt="c", adapter_job=False, export=export
        )
    )
    assert sampler.calls == [
        (
            "load_weights",
            {"path": str(tmp_path / "export" / cf.EXPORT_WEIGHTS), "weight_version": 6},
        )
    ]
    assert job.weight_version == sampler.weight_version == 6
    # an adapter job's sampler: a full-weight checkpoint is refused by name, never exported
    adapter = Sub("sampling")
    with pytest.raises(ProtocolError) as refused:
        asyncio.run(
            forwarding.load_checkpoint(
                job, adapter, tmp_path, meta, call, ckpt="c", adapter_job=True, export=no_export
            )
        )
    assert refused.value.code == "invalid_argument"
    assert refused.value.details["field"] == "checkpoint_id" and adapter.calls == []
    peft = tmp_path / cf.ENGINE_TAG / "adapter"
    peft.mkdir(parents=True)
    (peft / "adapter_config.json").write_text(json.dumps({"r": 8}))
    asyncio.run(
        forwarding.load_checkpoint(
            job, adapter, tmp_path, meta, call, ckpt="c", adapter_job=True, export=no_export
        )
    )
    assert adapter.calls == [
        (
            "load_weights",
            {
                "path": str(peft / "adapter_model.safetensors"),
                "adapter_config": {"r": 8},
                "weight_version": 7,
            },
        )
    ]
    fake = Sub("sampling")  # fake engine workers load any role, as a new weight version
    asyncio.run(
        forwarding.load_checkpoint(
            job,
            fake,
            tmp_path,
            meta,
            call,
            ckpt="c",
            adapter_job=False,
            export=no_export,
            any_role=True,
        )
    )
    assert fake.calls[0][0] == "load" and job.weight_version == fake.weight_version == 8
