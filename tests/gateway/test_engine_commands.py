"""Each engine's command table (`engines/worker/commands.py`) lists exactly its `op_*` methods
(and a multi-rank trainer's `rank_commands` its `rank_*` ones), each bound to the method it
names, so the explicit tables cannot drift from the engines; an unknown command is refused."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from arctic_servers.engines.worker.commands import lookup
from arctic_servers.engines.worker.engine_base import EngineBase

ENGINES = [
    "arctic_servers.engines.fake.engine:FakeEngine",
    "arctic_servers.engines.deepspeed.training:TrainingEngine",
    "arctic_servers.engines.deepspeed.scoring:ScoringEngine",
    "arctic_servers.engines.deepspeed.ds_scoring:DeepSpeedScoringEngine",
    "arctic_servers.engines.deepspeed.dp_training:DataParallelTrainer",
    "arctic_servers.engines.deepspeed.dp_training:RankTrainer",
    "arctic_servers.engines.vllm.sampling:SamplingEngine",
]


def _bare(path: str) -> Any:
    module, name = path.split(":")
    try:
        cls = getattr(importlib.import_module(module), name)
    except ImportError as exc:  # an engine library this install lacks
        pytest.skip(f"{module}: {exc}")
    return cls, object.__new__(cls)  # bound methods need no engine state


def _methods(cls: type, prefix: str) -> set[str]:
    return {n.removeprefix(prefix) for n in dir(cls) if n.startswith(prefix)} - {"commands"}


@pytest.mark.parametrize("path", ENGINES, ids=lambda p: p.split(":")[1])
def test_command_table_is_the_engines_op_methods(path: str) -> None:
    cls, engine = _bare(path)
    table = engine.commands()
    assert set(table) == _methods(cls, "op_")
    for name, fn in table.items():
        assert fn.__func__ is getattr(cls, f"op_{name}"), name  # the override, if any
    assert lookup(engine, "forward") == table.get("forward")
    assert lookup(engine, "no_such_command") is None
    assert lookup(engine, None) is None


def test_rank_command_table_is_the_rank_methods() -> None:
    cls, engine = _bare("arctic_servers.engines.deepspeed.dp_training:RankTrainer")
    table = engine.rank_commands()
    assert set(table) == _methods(cls, "rank_")
    for name, fn in table.items():
        assert fn.__func__ is getattr(cls, f"rank_{name}"), name


def test_an_engine_without_a_table_runs_nothing() -> None:
    class Bare(EngineBase):  # a method named like a command is not a command
        def op_forward(self) -> None: ...

    assert lookup(Bare(), "forward") is None
