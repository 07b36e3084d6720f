#!/usr/bin/env bash
# The one prepared kernel check for a CUDA machine (sized for < 8 minutes on an H200):
#   1. installs what the GPU image lacks, offline: kvbench itself, the pure-Python wheels in
#      .gpu_wheels/ (hydra-core, omegaconf, antlr4), and FlashInfer from .fi_bundle/ if present;
#   2. runs the kernel tests on the GPU (compiled Triton, FlashInfer, the torch reference);
#   3. runs `kvbench bench-kernels` (time-boxed), then, time permitting, a GQA shape and a short
#      Triton tile/warps sweep;
#   4. leaves everything under $OUT (default results/gpu-checks/<timestamp>/): the log, the JUnit
#      report, results.csv, and one tarball per benchmark run (plots and calibration files inside;
#      six files in all, so a remote runner that returns at most 8 can return all of it).
# Build .fi_bundle/ and .gpu_wheels/ first, on a machine with PyPI: gpu/prepare_carry.sh (docs/gpu.md).
#
#   usage: gpu/run_kernel_checks.sh     (env: OUT, PYTHON, BENCH_BUDGET_S, SKIP_GQA=1, SKIP_TUNING=1)
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT=${OUT:-$ROOT/results/gpu-checks/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d /tmp/kvbench-gpu-XXXX)
SITE=$WORK/site
PY=${PYTHON:-$( [ -x /opt/torch/.venv/bin/python3 ] && echo /opt/torch/.venv/bin/python3 || command -v python3 )}
BENCH_BUDGET_S=${BENCH_BUDGET_S:-170}
DEADLINE_S=${DEADLINE_S:-450}  # every step is cut to end by then: 7.5 min, inside the 8-minute box
T0=$(date +%s)
exec > >(tee -a "$OUT/run_kernel_checks.log") 2>&1
step() { echo; echo "== [$(( $(date +%s) - T0 ))s] $*"; }
left_s() { echo $(( T0 + DEADLINE_S - $(date +%s) )); }
min() { echo $(( $1 < $2 ? $1 : $2 )); }
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET  # compiled Triton on the GPU (the interpreter tests run in CPU CI)

step "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader || echo "nvidia-smi failed"
"$PY" -c 'import sys, torch, triton; cuda = torch.cuda.is_available()
print("python", sys.version.split()[0], "| torch", torch.__version__, "| triton", triton.__version__,
      "| cuda", cuda, torch.cuda.get_device_name() if cuda else "")'

step "install kvbench and its missing pure-Python dependencies (offline) into $SITE"
mkdir -p "$SITE"
if compgen -G ".gpu_wheels/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .gpu_wheels/*.whl \
    || echo "WARNING: wheel install failed"
else
  echo "no .gpu_wheels/: relying on hydra-core/omegaconf being installed already"
fi
# A regular (non-editable) install carries the entry points that register the built-in plugins.
# It builds from a clean copy: a stale build/ folder in the checkout would leak old modules in.
mkdir -p "$WORK/src"
tar --exclude=./.git --exclude=./.fi_bundle --exclude=./.gpu_wheels --exclude=./results --exclude=./build \
  --exclude='*.egg-info' -cf - . | tar -xf - -C "$WORK/src"
"$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target "$SITE" "$WORK/src" \
  || { echo "FATAL: could not install kvbench"; exit 1; }
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}

step "FlashInfer from the offline bundle"
if [ -x .fi_bundle/install_on_device.sh ] || [ -f .fi_bundle/install_on_device.sh ]; then
  if PYTHON=$PY timeout 90 bash .fi_bundle/install_on_device.sh .fi_bundle "$WORK/fi-site"; then
    # shellcheck disable=SC1091
    source "$WORK/fi-site/fi-env.sh"
    export FLASHINFER_WORKSPACE_BASE=$WORK/fi-jit  # a variant that is not prebuilt JIT-compiles here
  else
    echo "WARNING: the FlashInfer bundle did not install; FlashInfer tests and rows will be skipped"
  fi
else
  echo "no .fi_bundle/: FlashInfer tests and benchmark rows will be skipped (see docs/gpu.md)"
fi

step "kernel tests on the GPU"
# -P: do not put the checkout on sys.path, so the installed kvbench (with kvbench.conf) is imported
timeout "$(min 240 $(( $(left_s) - 150 )))" "$PY" -P -m pytest -q -rs -p no:cacheprovider --junitxml="$OUT/kernel_tests.xml" \
  tests/plugins/kernels tests/kvbench/test_bench_kernels.py
echo "pytest exit status: $?"

# time_budget_s stops *starting* measurements; the one in flight and the writing need the slack
BUDGET_S=$(min "$BENCH_BUDGET_S" $(( $(left_s) - 70 )))
step "kvbench bench-kernels (budget ${BUDGET_S}s)"
timeout $(( BUDGET_S + 60 )) "$PY" -P -m kvbench.commands.bench_kernels hydra.run.dir="$WORK/bench" time_budget_s="$BUDGET_S"
echo "bench-kernels exit status: $?"
if [ -f "$WORK/bench/results.csv" ]; then
  cp "$WORK/bench/results.csv" "$OUT/results.csv"
  tar -czf "$OUT/bench.tar.gz" -C "$WORK" bench  # plots and calibrations/<hardware>/<kernel>.json inside
fi

if [ "${SKIP_GQA:-0}" != 1 ] && [ "$(left_s)" -gt 100 ]; then
  step "the same kernels on a GQA shape (Llama-3-8B: 32 query / 8 KV heads, bf16), fewer points"
  timeout $(( $(left_s) - 20 )) "$PY" -P -m kvbench.commands.bench_kernels hydra.run.dir="$WORK/gqa" num_kv_heads=8 \
    dtype=bfloat16 batch_sizes=[16,64] context_tokens=[4096] time_budget_s="$(min 60 $(( $(left_s) - 70 )))"
  echo "gqa exit status: $?"
  [ -d "$WORK/gqa" ] && tar -czf "$OUT/gqa.tar.gz" -C "$WORK" gqa
fi

if [ "${SKIP_TUNING:-0}" != 1 ] && [ "$(left_s)" -gt 60 ]; then
  step "Triton tile/warps sweep at one point (B=64, ctx=4096, block 16)"
  timeout $(( $(left_s) - 10 )) "$PY" -P -m kvbench.commands.bench_kernels -m hydra.sweep.dir="$WORK/tuning" \
    kernels=[triton] block_sizes=[16] batch_sizes=[64] context_tokens=[4096] sdpa_baseline=false \
    check_outputs=false +kernel_options.triton.tile_tokens=16,32,64 +kernel_options.triton.num_warps=4,8
  echo "tuning exit status: $?"
  [ -d "$WORK/tuning" ] && tar -czf "$OUT/tuning.tar.gz" -C "$WORK" tuning
fi

step "done: $(ls "$OUT" | tr '\n' ' ')"
rm -rf "$WORK"
