"""Shared test fixtures: paths and the engine marker."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
HAS_VLLM = importlib.util.find_spec("vllm") is not None


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="vLLM is not installed")
    for item in items:
        if "engine" in item.keywords and not HAS_VLLM:
            item.add_marker(skip)
