#!/usr/bin/env bash
# Installs vLLM 0.33.0's V1 scheduler into its own venv, for the differential check
# (kvbench/validation/peers/vllm_v1.py) on a CPU-only machine: no GPU, no weights.
#
# vLLM's wheel metadata pins a CUDA torch and a long list of serving dependencies. The scheduler
# path (Scheduler, KVCacheManager, BlockPool) imports no compiled op, so the CPU torch==2.13.0
# is enough: the import chain's pure-Python dependencies are installed first, normally, and then
# vLLM itself with --no-deps, so pip never resolves vLLM's own pins.
#
# Usage: tools/install_vllm_scheduler.sh [VENV]   (default: .venv-vllm in the repo root)
# VLLM_WHEEL=/path/to/vllm-0.33.0-...whl uses a wheel already on disk instead of the registry's.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

venv="${1:-.venv-vllm}"
python="${PYTHON:-python3}"

if [[ ! -x "$venv/bin/python" ]]; then
    "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install --quiet)

# pinned: an unpinned torch would pull a multi-GB CUDA build
"${pip[@]}" "torch==2.13.0"
# kvbench itself (editable) with its test tools, so this venv runs the peer tests too
"${pip[@]}" -e ".[test]"

# the pure-Python packages vLLM 0.33.0's import chain (vllm.config, vllm.v1.core.sched) needs
"${pip[@]}" \
    numpy msgspec "pydantic>=2,<3" cachetools cloudpickle psutil PyYAML regex pyzmq blake3 packaging \
    cbor2 transformers aiohttp requests openai-harmony openai pillow pybase64 uvloop py-cpuinfo \
    prometheus_client xgrammar fastapi partial-json-parser llguidance einops

# vLLM last, without its pins
"${pip[@]}" --no-deps "${VLLM_WHEEL:-vllm==0.33.0}"

"$venv/bin/python" -c "import vllm.v1.core.sched.scheduler, vllm; assert vllm.__version__ == '0.33.0', vllm.__version__"
echo "vLLM 0.33.0 scheduler ready: $venv/bin/kvbench diff-engine --peer vllm_v1 engine=vllm_v1 (tests: $venv/bin/python -m pytest tests/kvbench/validation)"
