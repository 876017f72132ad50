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
    seconds = {label: [] for label in (*bench.PARTS, "decide")}
    times, filler = bench.run_batch("ngram", 4, requests(3), 6, 130.0, 1.6, None, seconds)
    assert len(times) == 6 and all(t > 0 for t in times) and filler == 0
    assert all(len(v) == 6 for v in seconds.values())
    for step in range(6):  # a part's time is within the whole call's
        assert 0 < seconds["sync"][step] <= times[step]
        assert seconds["update"][step] <= seconds["sync"][step]
        assert seconds["draft"][step] + seconds["sync"][step] <= times[step]


def test_the_module_level_timer_is_restored_and_answers_that_run_out_are_counted(bench):
    decide = bench.adapter.shown_drafts
    short = [(prompt, answer[:3]) for prompt, answer in requests(2)]
    _, filler = bench.run_batch("naive", 4, short, 5, 130.0, 1.6, np.ones(16, np.float32),
                                {label: [] for label in (*bench.PARTS, "decide")})
    assert bench.adapter.shown_drafts is decide
    assert filler == 2 * (5 - 3)  # naive drafts nothing: one token a step per row


def test_bad_sizes_and_methods_are_refused_before_measuring(bench):
    with pytest.raises(SystemExit, match="must be >= 1"):
        bench.main(["--batch", "0"])
    with pytest.raises(ValueError, match="bogus"):
        bench.main(["--methods", "naive,bogus"])
