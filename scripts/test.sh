#!/usr/bin/env bash
# Install (if needed) and run the whole test suite (unit + real-engine tests on CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-cpu.sh
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-2}
exec "${VENV:-.venv}/bin/python" -m pytest -q -p no:cacheprovider "$@"
