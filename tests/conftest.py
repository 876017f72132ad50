"""Shared test fixtures: paths and the engine marker."""
from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
HAS_VLLM = importlib.util.find_spec("vllm") is not None


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
