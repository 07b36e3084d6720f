#!/usr/bin/env bash
# Build, on a machine with PyPI, what gpu/run_kernel_checks.sh needs on an offline GPU machine:
#   .fi_bundle/   FlashInfer 0.7.4 repacked + decode modules prebuilt for sm_90a (~28 MiB),
#                 made by a FlashInfer bundle builder: a folder whose build.sh <dest> repacks
#                 flashinfer-python and prebuilds its decode modules (give it as FI_BUNDLE_TOOL)
#   .gpu_wheels/  the pure-Python wheels kvbench needs that the GPU image lacks (~0.4 MiB):
#                 hydra-core, omegaconf, antlr4-python3-runtime, at this machine's versions
# Both folders are git-ignored and travel with the checkout (together well under 64 MiB).
#
#   usage: gpu/prepare_carry.sh          (env: PYTHON, FI_BUNDLE_TOOL, SKIP_FLASHINFER=1)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ "${SKIP_FLASHINFER:-0}" != 1 ] && [ -z "${FI_BUNDLE_TOOL:-}" ]; then
  echo "gpu/prepare_carry.sh: set FI_BUNDLE_TOOL=<folder of the FlashInfer bundle builder> or SKIP_FLASHINFER=1" >&2
  exit 2
fi

if [ "${SKIP_FLASHINFER:-0}" != 1 ]; then
  echo "== FlashInfer bundle -> .fi_bundle/ (first build ~3 min, then ~8 s)"
  bash "$FI_BUNDLE_TOOL/build.sh" .fi_bundle
fi

echo "== pure-Python wheels -> .gpu_wheels/"
PINS=$("$PY" -c 'from importlib.metadata import version as v
print(" ".join(f"{n}=={v(n)}" for n in ("hydra-core", "omegaconf", "antlr4-python3-runtime")))')
rm -rf .gpu_wheels && mkdir -p .gpu_wheels
# shellcheck disable=SC2086
"$PY" -m pip wheel -q --disable-pip-version-check --no-deps -w .gpu_wheels $PINS
ls -la .gpu_wheels
du -sh .fi_bundle .gpu_wheels 2>/dev/null || true
