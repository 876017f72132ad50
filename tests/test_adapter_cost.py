"""Units of the offline drafter-cost benchmark (``benchmarks/adapter_cost.py``)."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("adapter_cost")


def requests(count, period=5):
    """Prompts that repeat a short cycle and outputs that continue it."""
    cycle = list(range(100 + period))
    return [([7 + i] + cycle * 4, cycle * 6) for i in range(count)]


def test_each_step_is_timed_with_its_parts(bench):
    seconds = {label: [] for label in (*bench.PARTS, "decide", "total")}
    times = bench.run_batch("ngram", 4, requests(3), 6, 130.0, 1.6, None, seconds)
    assert len(times) == 6 and all(t > 0 for t in times)
    assert all(len(v) == 6 for v in seconds.values())
    assert seconds["total"] == times
    for step in range(6):  # a part's time is within the whole call's
        assert 0 < seconds["sync"][step] <= times[step]
        assert seconds["update"][step] <= seconds["sync"][step]
        assert seconds["draft"][step] + seconds["sync"][step] <= times[step]


def test_the_timers_are_removed_after_a_batch(bench):
    decide = bench.adapter.shown_drafts
    bench.run_batch("naive", 4, requests(2), 2, 130.0, 1.6, np.ones(16, np.float32),
                    {label: [] for label in (*bench.PARTS, "decide", "total")})
    assert bench.adapter.shown_drafts is decide


def test_bad_sizes_are_refused(bench):
    with pytest.raises(SystemExit, match="must be >= 1"):
        bench.main(["--batch", "0"])
