"""The per-step selection oracle of ``benchmarks/selection_bound.py``: the union's steps
by hand, and a short run on a real trace (our two methods, 6 requests)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import SHARED, load_benchmark


@pytest.fixture(scope="module")
def bound():
    return load_benchmark("selection_bound")


def test_union_takes_the_longer_draft_each_step(bound):
    # one request of 8 tokens, k = 4; a accepts 3 at position 0, b accepts 4 at 4
    a = np.array([3, 0, 0, 0, 0, 0, 0, 0], dtype=np.int32)
    b = np.array([0, 0, 0, 0, 4, 0, 0, 0], dtype=np.int32)
    assert bound.union_steps([[a]], 4) == 5  # 4 tokens, then 4 bonus-only steps
    assert bound.union_steps([[b]], 4) == 5  # 4 bonus-only steps, then 4 accepted
    assert bound.union_steps([[a], [b]], 4) == 2  # 3 + bonus, then 4 (end: no bonus)


def test_short_run_on_a_trace(bound, tmp_path):
    trace = "openhands_agent_snapshot.jsonl"
    if not (SHARED / "traces" / trace).exists():
        pytest.skip("shared traces not present")
    out = tmp_path / "sb.json"
    bound.main(["--files", trace, "--limit", "6", "--out", str(out)])
    tau = json.loads(out.read_text())["files"][trace]["tau"]
    assert set(tau) == {"memory_decoding", "suffix", "memory_decoding+suffix"}
    assert tau["memory_decoding+suffix"] >= max(tau["memory_decoding"], tau["suffix"]) >= 1.0
    assert out.with_suffix(".png").stat().st_size > 0
