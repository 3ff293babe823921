"""The README's main job (`examples/sft_rl.py`) end to end on reduced sizes (`--smoke`).

The command a user runs, against the session's on-prem server (`--url`): SFT steps, the SFT
checkpoint, both RL arms from it (generate -> reward -> grpo forward-backward -> step ->
sync-weights), held-out evaluations, the plot and the curves file, and the three final lines.
The smoke sizes (4 SFT steps, 2 RL steps, 16 held-out problems) prove the plumbing only: no
accuracy is asserted here; the README's table comes from the full run (`bash tools/main_job.sh`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT, ServerInfo

pytestmark = pytest.mark.slow

LINE = r"held-out accuracy (\d\.\d{3}) -> (\d\.\d{3})"


def test_main_job_smoke(onprem: ServerInfo, tmp_path: Path) -> None:
    env = dict(os.environ)
    env.pop("PYTHONWARNINGS", None)
    cmd = [sys.executable, "examples/sft_rl.py", "--smoke", "--url", onprem.base_url]
    proc = subprocess.run(
        [*cmd, "--out", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-3:]
    sft = re.fullmatch(f"sft: {LINE}", last[0])
    rl = re.fullmatch(f"rl: {LINE}", last[1])
    ctl = re.fullmatch(f"control lr=0: {LINE}", last[2])
    assert sft and rl and ctl, last
    # both arms start from the SFT checkpoint's accuracy
    assert rl.group(1) == ctl.group(1) == sft.group(2)

    data = json.loads((tmp_path / "main_job.json").read_text())
    r, curves = data["recipe"], data["curves"]
    assert r["model"] == "tiny-4l" and r["held_out"] == 16
    assert curves["sft"]["steps"][0] == 0 and curves["sft"]["steps"][-1] <= r["sft_max_steps"]
    for arm in ("rl", "control"):
        c = curves[arm]
        assert c["steps"] == list(range(r["rl_steps"] + 1))  # evaluated every step in smoke
        assert len(c["reward"]) == r["rl_steps"]
        assert all(0.0 <= a <= 1.0 for a in c["accuracy"])
    assert f"{curves['rl']['accuracy'][-1]:.3f}" == rl.group(2)
    assert f"{curves['control']['accuracy'][-1]:.3f}" == ctl.group(2)
    assert (tmp_path / "main_job.png").stat().st_size > 10_000
