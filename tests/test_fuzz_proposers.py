"""Fuzzing every proposer core (hypothesis + adversarial streams): drafts are never longer
than k or the cap, contain only token ids the proposer has been given, and nothing raises."""
from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vllm_specext.config import METHODS
from vllm_specext.proposers import PROPOSER_CLASSES, build_proposer

#: every method whose core runs without the engine
METHOD_NAMES = [m for m in PROPOSER_CLASSES if METHODS[m].IMPLEMENTED and m != "mtp_ngram"]
K = 8


def _drive(method: str, requests: list[tuple[list[int], list[int]]], step: int = 3):
    """Feed (prompt, output) requests in order, committing ``step`` tokens at a time."""
    p = build_proposer(method, num_speculative_tokens=K)
    seen: set[int] = set()
    worst = 0.0
    for i, (prompt, output) in enumerate(requests):
        rid = f"r{i % 3}"  # ids are reused
        p.start_request(rid, prompt)
        seen.update(prompt)
        pos = 0
        while pos < len(output):
            cap = (pos % (K + 2))
            t0 = time.perf_counter()
            draft = p.propose([rid, "unknown"], [cap, K])
            worst = max(worst, time.perf_counter() - t0)
            assert draft[1] == []
            assert len(draft[0]) <= min(K, cap)
            assert set(draft[0]) <= seen, f"{method} drafted an id it was never given"
            new = output[pos:pos + step]
            if draft[0] and p.uses_target_tokens:
                p.observe_targets(rid, draft[0], new[:len(draft[0])])
            p.update(rid, new)
            seen.update(new)
            pos += step
        p.stop_request(rid, finished=bool(i % 2))
    return worst


tokens = st.integers(min_value=0, max_value=2**31 - 1)
small_vocab = st.integers(min_value=0, max_value=5)


@pytest.mark.parametrize("method", METHOD_NAMES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=st.lists(st.tuples(st.lists(st.one_of(tokens, small_vocab), max_size=60),
                                   st.lists(small_vocab, max_size=60)), min_size=1, max_size=6))
def test_random_streams(method, requests):
    _drive(method, requests)


@pytest.mark.parametrize("method", METHOD_NAMES)
@pytest.mark.parametrize("stream", ["one_token_100k", "alternating_pairs", "empty_prompt"])
def test_adversarial_streams(method, stream, record_property):
    if stream == "one_token_100k":
        requests = [([7] * 1000, [7] * 99_000)]
    elif stream == "alternating_pairs":
        requests = [([1, 2] * 500, [1, 2] * 5000), ([2, 1] * 10, [3, 4] * 100)]
    else:
        requests = [([], list(np.arange(200) % 11))]
    worst = _drive(method, requests, step=K + 1)
    record_property("worst_propose_seconds", worst)  # reported, not asserted
