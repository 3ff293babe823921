#!/usr/bin/env bash
# The GPU checks, on a machine with CUDA: NCCL and CUDA-IPC weight sync, log-prob agreement after
# a sync, sleep / wake freeing GPU memory, and the concurrency and weight-sync benchmarks' smoke
# runs — one result line per check (PASS / FAIL / SKIP), meant to finish within 10 minutes once
# the environment is installed. The checks themselves: tools/gpu_check.py (its docstring).
#
#   bash tools/gpu_check.sh                  # install into .venv-gpu (CUDA torch, vllm, DeepSpeed,
#                                            # this package), then every check
#   bash tools/gpu_check.sh --python PY      # an environment that already has them: no install
#   bash tools/gpu_check.sh --only sync_cuda_ipc,sleep_wake
#   bash tools/gpu_check.sh --dry-run        # no GPU needed: check this script and the driver,
#                                            # and run the checks' CPU forms (gloo for NCCL)
#
# Env: ARCTIC_GPU_CHECK_FULL=1  the weight-sync benchmark on the real-size model (3 reps);
#      ARCTIC_GPU_CHECK_TIMEOUT  seconds for the checks (default 600).
# Status: written and dry-run on CPU only; it has not run on a GPU yet (servers/GATEWAY.md "Scale-out").
set -uo pipefail
cd "$(dirname "$0")/.."

PY=""
DRY=0
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --python) PY=$2; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    --only) ARGS+=(--only "$2"); shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

TORCH=2.13.0
VLLM=0.32.0
DEEPSPEED=0.19.8
PEFT=0.21.2
PROTOBUF=6.33.6
LIMIT=${ARCTIC_GPU_CHECK_TIMEOUT:-600}

if [ "$DRY" = 1 ]; then
  PY=${PY:-.venv/bin/python}
  echo "dry run: no GPU used; the driver's CPU forms with $PY"
  bash -n "$0" && echo "PASS syntax tools/gpu_check.sh"
  "$PY" -m py_compile tools/gpu_check.py && echo "PASS syntax tools/gpu_check.py"
  "$PY" tools/gpu_check.py --list >/dev/null && echo "PASS arguments (--list)"
  exec timeout "$LIMIT" "$PY" tools/gpu_check.py --cpu "${ARGS[@]}" --json out/gpu_check_dry.json
fi

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "SKIP gpu_check: no CUDA device on this machine (nvidia-smi); --dry-run runs the CPU forms"
  exit 0
fi
nvidia-smi -L

if [ -z "$PY" ]; then
  PY=.venv-gpu/bin/python
  if ! "$PY" - "$TORCH" "$VLLM" "$DEEPSPEED" <<'PYEOF' 2>/dev/null
import importlib.metadata as md, sys
torch, vllm, ds = sys.argv[1:4]
ok = md.version("torch").split("+")[0] == torch and md.version("vllm") == vllm
sys.exit(0 if ok and md.version("deepspeed") == ds else 1)
PYEOF
  then
    echo "installing the CUDA engines into .venv-gpu (torch $TORCH, vllm $VLLM, deepspeed $DEEPSPEED)"
    python3.11 -m venv .venv-gpu || { echo "FAIL install: python3.11 -m venv" >&2; exit 1; }
    CONSTRAINTS=$(mktemp)
    printf 'torch==%s\nprotobuf==%s\n' "$TORCH" "$PROTOBUF" > "$CONSTRAINTS"
    PIP=("$PY" -m pip install -q --disable-pip-version-check -c "$CONSTRAINTS")
    "${PIP[@]}" --upgrade pip >/dev/null
    # PyPI's torch and vllm wheels are the CUDA builds (vllm pins its torch)
    "${PIP[@]}" "torch==$TORCH" "vllm==$VLLM" "deepspeed==$DEEPSPEED" "peft==$PEFT" \
      || { echo "FAIL install: the CUDA engines (no index reachable? use --python PY)" >&2; exit 1; }
    "${PIP[@]}" -e ".[dev]" || { echo "FAIL install: this package" >&2; exit 1; }
    rm -f "$CONSTRAINTS"
  fi
fi
"$PY" -c "import torch; assert torch.cuda.is_available(), 'torch sees no CUDA device'" \
  || { echo "FAIL cuda: $PY's torch sees no CUDA device" >&2; exit 1; }
mkdir -p out
timeout "$LIMIT" "$PY" tools/gpu_check.py "${ARGS[@]}" --json out/gpu_check.json
rc=$?
[ "$rc" = 124 ] && echo "FAIL gpu_check: the checks ran past ${LIMIT} s"
exit "$rc"
