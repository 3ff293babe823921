"""The agentic example (`examples/agent_rl.py`) on CI sizes (`--smoke`), against the session's
on-prem server: SFT steps on the rendered demonstrations, the SFT checkpoint, then tool-call
episodes through the agent proxy, GRPO steps, weight syncs and held-out evaluations for the RL arm
and the lr = 0 control.

The learning curve is the full run's (`examples/README.md`); this test fails when SFT does not
update the served weights, when an arm does not start from the SFT checkpoint, when no RL update
happens (no step with a gradient, or the served weights unchanged after the RL arm's steps) or
when the control moves (its served weights, probed by the log-probs of its greedy held-out
episodes, and its held-out success change)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT, ServerInfo

pytestmark = pytest.mark.slow


def test_agent_rl_smoke(onprem: ServerInfo, tmp_path: Path) -> None:
    env = dict(os.environ)
    env.pop("PYTHONWARNINGS", None)
    cmd = [sys.executable, "examples/agent_rl.py", "--smoke", "--url", onprem.base_url]
    proc = subprocess.run(
        [*cmd, "--out", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((tmp_path / "agent_rl.json").read_text())
    sft, (rl, ctl) = data["sft"], data["arms"]
    # SFT: two cross-entropy steps on the demonstrations, and the served weights moved
    assert sft["eval_steps"] == [0, 2] and len(sft["loss"]) == 2, sft
    assert all(0.0 < x < 20.0 for x in sft["loss"]), sft["loss"]
    assert abs(sft["probe"][-1] - sft["probe"][0]) > 1e-3, sft["probe"]
    assert rl["label"] == "rl" and ctl["lr"] == 0.0
    for arm in (rl, ctl):
        assert arm["eval_steps"] == [0, 2] and len(arm["reward"]) == 2
        assert all(0.0 <= s <= 1.0 for s in arm["success"])
        # both arms start from the SFT checkpoint: the greedy episodes SFT ended with
        assert arm["probe"][0] == pytest.approx(sft["probe"][-1], abs=1e-3), arm["probe"]
    for arm in (rl, ctl):
        # on-policy: every step samples from weights synced after the step before it
        v = arm["sampled_version"]
        assert len(v) == 2 and v[1] > v[0], v
    # an update happened: a step with a gradient, and the served weights moved
    assert any(g > 0 for g in rl["grad_norm"]), rl["grad_norm"]
    assert abs(rl["probe"][-1] - rl["probe"][0]) > 1e-3, rl["probe"]
    # the control (every step at learning rate 0) serves its initial weights throughout
    assert ctl["probe"][-1] == pytest.approx(ctl["probe"][0], abs=1e-3), ctl["probe"]
    assert ctl["success"][-1] == ctl["success"][0]
