"""The GRPO toy (examples/grpo_tiny.py), short: GRPO through the SDK, two seeds + control.

`examples/grpo_tiny.py` runs generate → reward → forward-backward → step → sync-weights with
`arctic_sdk.AsyncClient`. Stated margin: over 20 steps, the mean reward of the last 5 steps beats
the first 5 by at least MARGIN for both seeds; with lr = 0 (the control, the weights never move)
the two windows differ by at most NOISE (sampling noise only).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from .conftest import ServerInfo

pytestmark = pytest.mark.slow

STEPS = 20
SEEDS = (0, 1)
MARGIN = 0.08
NOISE = 0.04


def grpo_module() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "examples" / "grpo_tiny.py"
    spec = importlib.util.spec_from_file_location("grpo_tiny", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["grpo_tiny"] = mod
    spec.loader.exec_module(mod)
    return mod


async def test_grpo_reward_rises_for_two_seeds_and_not_with_lr_zero(
    onprem: ServerInfo, tmp_path: Path
) -> None:
    from arctic_sdk import AsyncClient

    g = grpo_module()
    runs = {}
    # one job for the three runs (engine start-ups are the cost): each run starts from the same
    # resumable checkpoint (weights and optimizer state) and syncs it into the sampler first
    async with AsyncClient(onprem.base_url) as client:
        await client.create_job(g.training_job(0, g.LR))
        await client.wait_until_running(timeout=600)
        await client.save_checkpoint(checkpoint_id="init")
        for name, seed, lr in [(f"seed {s}", s, g.LR) for s in SEEDS] + [
            ("control lr=0", SEEDS[0], 0.0)
        ]:
            await client.load_checkpoint(checkpoint_id="init")
            await client.sync_weights()
            runs[name] = await g.run_grpo(
                client, steps=STEPS, seed=seed, lr=lr, step_lr=lr, progress=False
            )
        await client.cancel_job()
    g.plot(runs, tmp_path / "reward.png")
    assert (tmp_path / "reward.png").stat().st_size > 10_000
    lines = []
    for name, r in runs.items():
        first, last = r.window(5)
        lines.append(f"{name}: first 5 {first:.3f} -> last 5 {last:.3f} ({r.seconds:.1f} s)")
    print("\nGRPO demo: " + "; ".join(lines))
    for seed in SEEDS:
        first, last = runs[f"seed {seed}"].window(5)
        assert last - first >= MARGIN, (seed, runs[f"seed {seed}"].rewards)
    first, last = runs["control lr=0"].window(5)
    assert abs(last - first) <= NOISE, runs["control lr=0"].rewards
