#!/usr/bin/env bash
# The README's main job, on a fresh machine (Python 3.11): install what is needed into .venv,
# start the on-prem server on the embedded tiny model, and run GRPO through arctic_sdk.AsyncClient
# (generate -> reward -> forward-backward -> step -> sync-weights), printing the reward of every
# step and writing the reward curve to out/reward.png.
#
#   bash tools/main_job.sh                      # 40 steps, seeds 0 and 1, plus an lr=0 control
#   bash tools/main_job.sh --steps 20 --seed 3  # any examples/grpo_tiny.py arguments
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
PY=.venv/bin/python
"$PY" -m pip install -q --upgrade pip
"$PY" -m pip install -q -e ".[grpc,examples]"
bash tools/install_engines.sh "$PY"
if [ "$#" -eq 0 ]; then
  set -- --steps 40 --seeds 0 1 --control --out out/reward.png
fi
exec "$PY" examples/grpo_tiny.py "$@"
