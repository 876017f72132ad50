"""Shared test fixtures: paths and the engine marker."""
from __future__ import annotations

import importlib.util
import sys
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
BENCH = REPO / "benchmarks"
HAS_VLLM = importlib.util.find_spec("vllm") is not None


def load_benchmark(name: str):
    """``benchmarks/<name>.py`` imported as a module (the benchmarks are scripts, not a
    package): the folder is on ``sys.path`` while it loads, for its sibling imports."""
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


def pytest_configure(config):
    """Register vLLM's CPU kernel overrides before test modules import numba: vLLM's
    dispatcher scans every loaded module and trips over llvmlite's lazy wrappers, so
    it must run first (in the engine, workers register them before our proposers load)."""
    if HAS_VLLM:
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            with warnings.catch_warnings():  # vLLM's scan touches deprecated torch names
                warnings.simplefilter("ignore")
                current_platform.register_triton_kernel_overrides()


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="vLLM is not installed")
    for item in items:
        if "engine" in item.keywords and not HAS_VLLM:
            item.add_marker(skip)
