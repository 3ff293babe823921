"""Harbor 0.26's own agents against our endpoint (issue 36): `terminus-2` runs a task of ours
(`examples/harbor/tasks/hello-file`) through `arctic_sdk.proxy` on our host environment
(`examples/harbor/arctic_host_env.py`), and its trajectory is a token-exact training row equal
to the server's record of the session and to Harbor's own `rollout_details`.

Harbor is not a dependency of this project: the `harbor` fixture (conftest) installs it
(`examples/harbor/install_harbor.py`: a Python 3.12 venv of its own, cached in
`~/.cache/arctic/harbor-0.26-py3.12`, about two minutes the first time). Where it cannot be
installed the tests skip with the reason, except under CI (`CI` set), where they fail. The same
trial against the on-prem server's vLLM sampler is in `test_onprem.py`."""

from __future__ import annotations

import glob
import os
import subprocess
import tempfile
from pathlib import Path

from .conftest import HARBOR_DIR, run_terminus

PROBE = Path(__file__).with_name("harbor_env_probe.py")

MAX_TURNS = 3


def test_terminus_2_through_the_proxy_is_a_training_row(harbor: str, tmp_path: Path) -> None:
    with run_terminus.fake_endpoint() as (url, token, model):
        trial = run_terminus.run_trial(harbor, url, token, model, tmp_path, max_turns=MAX_TURNS)
    summary = run_terminus.check_trial(trial, MAX_TURNS)  # the row's claims, asserted there
    assert summary["turns"] >= MAX_TURNS and summary["trained_tokens"] > 0
    # the turns are terminus-2's: its prompt holds the task's instruction and the terminal
    first = trial.recorded[0].messages[-1]["content"]
    assert "hello.txt" in first and "Current terminal state" in first
    # its tmux shell ran in the trial's working directory (the prompt shows it)
    assert ":/app" in (trial.trial_dir / "agent" / "terminus_2.pane").read_text()
    # later turns carry Harbor's parser feedback (a random model writes no JSON)
    assert "JSON" in trial.recorded[1].messages[-1]["content"]
    assert summary["reward"] == {"reward": 0.0}  # verified by the task's tests/test.sh
    assert (trial.trial_dir / "agent" / "trajectory.json").is_file()


def test_host_environment_runs_a_trial_privately(harbor: str, tmp_path: Path) -> None:
    """Harbor's `oracle` agent runs the task's solution in our environment: the commands run,
    the verifier reads the file they wrote (reward 1), and the trial's /app, /tmp and /logs
    were its own (nothing reached the host's), its processes and root gone after."""
    host_app = Path("/app/hello.txt")
    existed = host_app.exists()
    cmd = run_terminus.harbor_command(
        harbor,
        api_base="",
        model="",
        session_id="",
        jobs_dir=tmp_path,
        job_name="oracle",
        max_turns=1,
        context=0,
        agent="oracle",
    )
    trial_dir = run_terminus.run_harbor(cmd, tmp_path, "oracle", timeout=300)
    result = (trial_dir / "result.json").read_text()
    assert '"reward": 1.0' in result, result[-2000:]
    assert host_app.exists() == existed
    root = f"arctic-host-{trial_dir.name}"
    assert not glob.glob(f"{tempfile.gettempdir()}/{root}*")  # the trial's root removed
    assert not _processes_mounting(root)  # its namespace's processes ended


def _processes_mounting(root: str) -> list[int]:
    """Processes whose mount table names the trial's root (its namespace's processes)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if root in Path(f"/proc/{pid}/mountinfo").read_text():
                out.append(int(pid))
        except OSError:
            continue
    return out


def test_host_environment_contract(harbor: str, tmp_path: Path) -> None:
    """`harbor_env_probe.py` in Harbor's venv: the environment built by Harbor's own classes;
    exec's working directory, environment, exit codes, stderr, timeout and users; private paths
    both ways; `..` refused; a process left in the background neither hangs the call nor
    outlives `stop`; exec before start and after stop refused."""
    python = str(Path(harbor).with_name("python"))
    p = subprocess.run(
        [python, str(PROBE), str(run_terminus.TASK), str(tmp_path)],
        env={**run_terminus.harbor_env(), "PYTHONPATH": str(HARBOR_DIR)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (p.returncode, p.stdout) == (0, "ok\n"), p.stdout[-3000:] + p.stderr[-3000:]
