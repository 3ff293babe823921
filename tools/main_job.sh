#!/usr/bin/env bash
# The README's main job, on a fresh machine (Python 3.11): install what is needed into .venv,
# start the on-prem server, and teach a model integer addition through arctic_sdk.AsyncClient:
# SFT until its held-out accuracy is partial, then RL (GRPO) from that checkpoint next to an
# lr = 0 control, each measured on held-out problems (examples/sft_rl.py). Writes
# out/main_job.png and out/main_job.json; the last three lines are the held-out accuracies.
#
#   bash tools/main_job.sh                       # the README's run (seed 0)
#   bash tools/main_job.sh --seed 1 --out out/s1 # any examples/sft_rl.py arguments
#   bash tools/main_job.sh --smoke               # reduced sizes (CI: the plumbing, no claims)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
PY=.venv/bin/python
"$PY" -m pip install -q --upgrade pip
"$PY" -m pip install -q -e ".[grpc,examples]"
bash tools/install_engines.sh "$PY"
exec "$PY" examples/sft_rl.py "$@"
