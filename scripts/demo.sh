#!/usr/bin/env bash
# Install (if needed) and run the demo on the default model: no speculation vs each method.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-cpu.sh
exec "${VENV:-.venv}/bin/vllm-specext" demo "$@"
