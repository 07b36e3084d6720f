#!/usr/bin/env bash
# Every GPU measurement kvbench needs, most important first, inside 5 minutes on one H200 (no network):
#   0. install what was carried (kvbench, .gpu_wheels/, FlashInfer from .fi_bundle/) and stop at
#      once if kvbench, torch or triton (or a carried FlashInfer) do not import;
#   1. the kernel tests on the GPU (compiled Triton, FlashInfer, torch reference);
#   2. the headline point: Triton vs FlashInfer vs torch at block 16, batch 64, 4K context;
#   3. the block-size curve (8..256) at batch 64, 4K context;
#   4. mode=real on a Llama-2-7B-shaped model (random bf16 weights) at batch 1, 64, 256, each
#      step's measured time against the roofline (weight bytes + KV bytes) / HBM bandwidth
#      (skipped, with one line, while mode=real is unavailable);
#   5. the calibration: bench-kernels' files, plus `kvbench calibrate` over step 4's runs.
# Everything lands under $OUT (default results/gpu-checks/all-<timestamp>/): run_all.log, one
# folder per step. Build .fi_bundle/ and .gpu_wheels/ first: gpu/prepare_carry.sh (docs/gpu.md).
#
#   usage: gpu/run_all.sh [--dry-run]     (env: OUT, PYTHON, DEADLINE_S, HARDWARE)
#   --dry-run: on a CPU, without installing: checks imports and each step's command, runs the
#              CPU-capable parts at tiny sizes (Triton under its interpreter), with no time limits
#              (about 25 s on an idle 2-core CPU; DEADLINE_S bounds the GPU run only).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
OUT=${OUT:-$ROOT/results/gpu-checks/all-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d /tmp/kvbench-gpu-all-XXXX)
PY=${PYTHON:-$( [ -x /opt/torch/.venv/bin/python3 ] && [ $DRY = 0 ] && echo /opt/torch/.venv/bin/python3 || command -v python3 )}
HARDWARE=${HARDWARE:-h200}
DEADLINE_S=${DEADLINE_S:-285}  # 4 min 45 s: every step is cut to end by then
T0=$(date +%s)
exec > >(tee -a "$OUT/run_all.log") 2>&1
step() { echo; echo "== [$(( $(date +%s) - T0 ))s] $*"; }
left_s() { echo $(( T0 + DEADLINE_S - $(date +%s) )); }
min() { echo $(( $1 < $2 ? $1 : $2 )); }
# a step's time limit: the smaller of its own cap and what the deadline leaves; none in a dry run
# (timeout 0 runs without one), whose time depends on the CPU and its load, never on the GPU's minutes
limit() { if [ $DRY = 1 ]; then echo 0; else min "$1" "$2"; fi; }
export PYTHONUNBUFFERED=1
if [ $DRY = 1 ]; then export TRITON_INTERPRET=1; RUN=("$PY"); else unset TRITON_INTERPRET; RUN=("$PY" -P); fi

step "0. machine, install, imports (dry run: $DRY)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
if [ $DRY = 0 ]; then
  SITE=$WORK/site && mkdir -p "$SITE" "$WORK/src"
  compgen -G ".gpu_wheels/*.whl" >/dev/null && "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .gpu_wheels/*.whl
  tar --exclude=./.git --exclude=./.fi_bundle --exclude=./.gpu_wheels --exclude=./results --exclude=./build \
    --exclude='*.egg-info' -cf - . | tar -xf - -C "$WORK/src"
  "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target "$SITE" "$WORK/src" \
    || { echo "FATAL: could not install kvbench"; exit 1; }
  export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
  if [ -f .fi_bundle/install_on_device.sh ]; then
    PYTHON=$PY timeout 90 bash .fi_bundle/install_on_device.sh .fi_bundle "$WORK/fi-site" \
      || { echo "FATAL: the carried FlashInfer bundle did not install"; exit 1; }
    # shellcheck disable=SC1091
    source "$WORK/fi-site/fi-env.sh"
    export FLASHINFER_WORKSPACE_BASE=$WORK/fi-jit
    NEED_FI=1
  fi
fi
"${RUN[@]}" - "${NEED_FI:-0}" "$DRY" <<'EOF' || { echo "FATAL: imports failed: nothing measured"; exit 1; }
import sys
import torch, triton, kvbench, kvbench.commands.calibrate, kvbench.commands.bench_kernels  # noqa: F401
need_fi, dry = sys.argv[1] == "1", sys.argv[2] == "1"
print("torch", torch.__version__, "| triton", triton.__version__, "| cuda", torch.cuda.is_available())
if not dry and not torch.cuda.is_available():
    sys.exit("no CUDA device: use --dry-run on a CPU")
try:
    import flashinfer; print("flashinfer", flashinfer.__version__)
except Exception as exc:
    print(f"flashinfer: not importable ({type(exc).__name__}): its rows are skipped")
    if need_fi:
        sys.exit("the FlashInfer bundle was carried but does not import")
EOF

step "1. kernel tests on the GPU"
if [ $DRY = 1 ]; then
  "$PY" -m pytest -q --collect-only -p no:cacheprovider tests/plugins/kernels | tail -1   # the tests exist and import
else
  timeout "$(limit 100 $(( $(left_s) - 180 )))" "${RUN[@]}" -m pytest -q -rs -x -p no:cacheprovider \
    --junitxml="$OUT/kernel_tests.xml" tests/plugins/kernels
  echo "pytest exit status: $?"
fi

BENCH=("${RUN[@]}" -m kvbench.commands.bench_kernels hardware="$HARDWARE")
[ $DRY = 1 ] && BENCH+=(dry_run=true kernels=[triton,torch] warmup_iters=1 timed_iters=1)
step "2. headline: triton vs flashinfer vs torch, block 16, batch 64, 4K context"
HEADLINE=(block_sizes=[16] batch_sizes=[64] context_tokens=[4096] time_budget_s=50)
[ $DRY = 1 ] && HEADLINE=(block_sizes=[16] batch_sizes=[2] context_tokens=[16] contiguous=false sdpa_baseline=false)
timeout "$(limit 70 $(( $(left_s) - 120 )))" "${BENCH[@]}" hydra.run.dir="$OUT/headline" "${HEADLINE[@]}"
echo "headline exit status: $?"

step "3. block-size curve at batch 64, 4K context"
if [ $DRY = 1 ]; then echo "dry run: the curve is step 2's command with block_sizes=[8,...,256] (checked by step 2)"; else
  timeout "$(limit 80 $(( $(left_s) - 70 )))" "${BENCH[@]}" hydra.run.dir="$OUT/curve" batch_sizes=[64] \
    context_tokens=[4096] sdpa_baseline=false time_budget_s=60
  echo "curve exit status: $?"
fi

step "4. mode=real, Llama-2-7B shape, random bf16 weights, batch 1/64/256, against the roofline"
REAL=("${RUN[@]}" -c "import sys; from kvbench.commands.main import main; sys.argv[0] = 'kvbench'; main()")
if ! "${RUN[@]}" -c "import kvbench.exec.real" 2>/dev/null; then
  echo "SKIP: mode=real is not available in this kvbench (no kvbench.exec.real): no real-mode runs, no fitted calibration"
else
  MODEL=(model=llama2-7b)
  [ $DRY = 1 ] && MODEL=(model=llama2-7b model.hf_config.num_hidden_layers=2 model.hf_config.hidden_size=64
    model.hf_config.intermediate_size=128 model.hf_config.num_attention_heads=4 model.hf_config.num_key_value_heads=4 kernel=torch)
  for B in 1 64 256; do
    [ $DRY = 1 ] && [ $B != 1 ] && continue
    [ $DRY = 0 ] && [ "$(left_s)" -lt 40 ] && { echo "SKIP batch $B: out of time"; continue; }
    timeout "$(limit 60 $(( $(left_s) - 30 )))" "${REAL[@]}" mode=real "${MODEL[@]}" hardware="$HARDWARE" workload=synthetic \
      workload.num_requests=$B workload.prompt_tokens=$([ $DRY = 1 ] && echo 8 || echo 1024) \
      workload.output_tokens=$([ $DRY = 1 ] && echo 4 || echo 32) output.steps=true wandb.mode=disabled progress=false \
      hydra.run.dir="$OUT/real/b$B" > "$OUT/real-b$B.txt" 2>&1
    echo "batch $B exit status: $? ($(tail -1 "$OUT/real-b$B.txt"))"
  done
  "$PY" gpu/roofline.py "$OUT"/real/b* | tee "$OUT/roofline.txt"
fi

step "5. calibration files"
mkdir -p "$OUT/calibrations/kernel-bench"
for d in "$OUT/headline" "$OUT/curve"; do [ -d "$d/calibrations" ] && cp -r "$d/calibrations/." "$OUT/calibrations/kernel-bench/"; done
if compgen -G "$OUT/real/b*/steps.parquet" >/dev/null; then
  "${RUN[@]}" -m kvbench.commands.calibrate "$OUT"/real/b* --out "$OUT/calibrations/real-fit"  # = kvbench calibrate: <out>/<hardware>/<kernel>.json
else
  echo "no real-mode steps table: only bench-kernels' calibration (copy it to kvbench/calibrations/$HARDWARE/)"
fi
find "$OUT/calibrations" -name '*.json' | sort

step "done in $(( $(date +%s) - T0 ))s: $(ls "$OUT" | tr '\n' ' ')"
rm -rf "$WORK"
