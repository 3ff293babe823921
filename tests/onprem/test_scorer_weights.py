"""Log-prob engines take synced weights by file or bytes only: a GPU method is refused by name
(one check on the HF scorer, inherited by the DeepSpeed one). No engine is started."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from arctic_servers.engines.deepspeed.ds_scoring import DeepSpeedScoringEngine
from arctic_servers.engines.deepspeed.scoring import ScoringEngine
from arctic_servers.engines.errors import WorkerError


@pytest.mark.parametrize(
    ("cls", "name"), [(ScoringEngine, "HF"), (DeepSpeedScoringEngine, "DeepSpeed")]
)
@pytest.mark.parametrize("method", ["cuda_ipc", "nccl"])
def test_gpu_sync_methods_are_refused_by_name(cls: type, name: str, method: str) -> None:
    engine = object.__new__(cls)  # the refusal comes before any model is touched
    with pytest.raises(WorkerError, match=f"the {name} log-prob engine .* not {method}"):
        engine.op_load_weights(method=method)
