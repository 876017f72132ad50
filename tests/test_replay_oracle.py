"""The retrieval-oracle bound: exact LZ77-style previous-factor lengths and oracle steps."""
from __future__ import annotations

import numpy as np
import pytest

from vllm_specext.replay.oracle import (
    build_stream,
    oracle_request_steps,
    oracle_steps,
    previous_factor_lengths,
)


def _brute(stream, k_max):
    out = []
    for g in range(len(stream)):
        best = 0
        for n in range(1, k_max + 1):
            window = list(stream[g:g + n])
            if len(window) < n or not any(list(stream[s:s + n]) == window for s in range(g)):
                break
            best = n
        out.append(best)
    return out


@pytest.mark.parametrize("seed", range(40))
def test_lengths_match_brute_force(seed):
    rng = np.random.default_rng(seed)
    stream = rng.integers(0, 3, size=int(rng.integers(0, 50)))
    sentinel = rng.random(len(stream)) < 0.08
    stream = np.where(sentinel, -1 - np.arange(len(stream)), stream)
    k_max = int(rng.integers(1, 9))
    assert list(previous_factor_lengths(stream, k_max)) == _brute(stream, k_max)


def test_hand_example_prompt_copy():
    # prompt 1 2 3 4, output 1 2 3 9 1 2.
    # k=8: copy "1 2 3" from the prompt + bonus 9; then "1 2" (end, no bonus): 2 steps.
    # k=2: "1 2" + bonus 3; 9 unseen: bonus only; "1 2": 3 steps.
    steps = oracle_request_steps([([1, 2, 3, 4], [1, 2, 3, 9, 1, 2])], ks=[8, 2])
    assert steps == {8: [2], 2: [3]}


def test_copy_may_run_into_its_own_draft():
    # prompt "5", output "5 5 5 5": copying from the prompt's 5 repeats the period: 1 step.
    assert oracle_request_steps([([5], [5, 5, 5, 5])], ks=[8]) == {8: [1]}
    assert oracle_request_steps([([5], [5, 5, 5, 5])], ks=[2]) == {2: [2]}


def test_cross_request_context_and_cold():
    reqs = [([1], [7, 8, 9, 6]), ([2], [7, 8, 9, 6])]
    # warm: the second output is copied from the first (4 tokens, no bonus): 1 step
    assert oracle_request_steps(reqs, ks=[8]) == {8: [4, 1]}
    # cold: nothing to copy, every step is a bonus token
    assert oracle_request_steps(reqs, ks=[8], cold=True) == {8: [4, 4]}


def test_no_match_across_request_boundary():
    stream, starts = build_stream([([1, 2], [3]), ([], [2, 3])])
    # the second output "2 3" must not match "2 | 3" across the first request's sentinel...
    # ...but "2 3" does occur inside request 0 (prompt 2 + output 3), which is contiguous.
    lengths = previous_factor_lengths(stream, 4)
    assert starts == [2, 4]
    assert lengths[4] == 2
    stream, starts = build_stream([([2], []), ([3], []), ([], [2, 3])])
    assert previous_factor_lengths(stream, 4)[starts[2]] == 1


def test_oracle_steps_caps_at_k_and_end():
    lengths = np.array([5, 4, 3, 2, 1, 0])
    assert oracle_steps(lengths, 0, 6, k=8) == 1  # 5 copied + bonus = all 6
    assert oracle_steps(lengths, 0, 6, k=2) == 2  # 2+1, then 2+1
    assert oracle_steps(lengths, 0, 0, k=2) == 0
