"""The rejected-draft tail fallback (``vllm_specext.proposers.rejected_tail``): the rule,
and that ``suffix`` and ``memory_decoding`` (each inside its kernel) apply it exactly
where they would otherwise draft nothing."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import numpy as np

from vllm_specext.config import validate_config
from vllm_specext.proposers import build_proposer
from vllm_specext.proposers.rejected_tail import TAIL_KIND, move_tail


def tail_after(draft, committed):
    """Reference: the draft's tail after ``committed``, or []."""
    n = len(committed)
    if n and len(draft) > n and list(draft[:n - 1]) == list(committed[:n - 1]):
        return list(draft[n:])
    return []


@pytest.mark.parametrize("draft, committed, tail", [
    ([1, 2, 3, 4], [1, 9], [3, 4]),        # 9 replaced 2
    ([1, 2, 3, 4], [9], [2, 3, 4]),        # 9 replaced 1
    ([1, 2, 3, 4], [1, 2], [3, 4]),        # the draft so far was right (a shown prefix)
    ([1, 2, 3, 4], [1, 2, 3, 4], []),      # all of it used up
    ([1, 2, 3, 4], [1, 2, 3, 4, 5], []),   # accepted whole, bonus token after it
    ([1, 2, 3, 4], [8, 9], []),            # diverged before the last committed token
    ([1, 2, 3, 4], [], []),
])
def test_move_tail(draft, committed, tail):
    assert tail_after(draft, committed) == tail
    d = np.array([7, 7] + draft + [0, 0], dtype=np.int32)
    ctx = np.array([5, 5, 5] + committed, dtype=np.int32)
    n = move_tail(d, 2, len(draft), ctx, 3, len(ctx), 8)
    assert d[2:2 + n].tolist() == tail and d[:2].tolist() == [7, 7]
    assert move_tail(d, 2, n, ctx, 3, 3, 8) == 0  # nothing committed since
    d = np.array([7, 7] + draft + [0, 0], dtype=np.int32)
    assert move_tail(d, 2, len(draft), ctx, 3, len(ctx), 1) == min(len(tail), 1)
    assert move_tail(d, 2, len(draft), ctx, 3, len(ctx), 0) == 0


def test_config_key():
    for method in ("suffix", "memory_decoding"):
        assert validate_config({"method": method}).rejected_tail == 2
        assert validate_config({"method": method, "rejected_tail": 0}).rejected_tail == 0
        for bad in (-1, True, "sometimes"):
            with pytest.raises(ValueError, match="rejected_tail"):
                validate_config({"method": method, "rejected_tail": bad})


@st.composite
def sessions(draw):
    """A prompt and a list of steps; each step commits the next draft's first
    ``accept`` tokens then one more token (a small vocabulary, so that matches, misses
    and tails all occur)."""
    prompt = draw(st.lists(st.integers(0, 5), min_size=1, max_size=12))
    steps = draw(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5), st.integers(1, 8)),
                          min_size=1, max_size=40))
    return prompt, steps


@settings(max_examples=60, deadline=None)
@given(method=st.sampled_from(["suffix", "memory_decoding"]), most=st.sampled_from([1, 2, 6]),
       session=sessions())
def test_fallback_is_the_tail_where_the_proposer_drafts_nothing(method, most, session):
    prompt, steps = session
    on = build_proposer(method, num_speculative_tokens=6, rejected_tail=most)
    off = build_proposer(method, num_speculative_tokens=6, rejected_tail=0)
    for p in (on, off):  # a finished request first, so the cross-request caches hold data
        p.start_request("old", prompt)
        p.update("old", prompt[::-1] + prompt)
        p.stop_request("old")
        p.start_request("r", prompt)
    last, since = [], []
    for accept, token, cap in steps:
        d_on, d_off = on.propose(["r"], [cap])[0], off.propose(["r"], [cap])[0]
        if d_off:
            assert d_on == d_off and on.last_kinds == off.last_kinds
        else:
            expected = tail_after(last, since)[:min(cap, most)] if last else []
            assert d_on == expected
            assert on.last_kinds == [TAIL_KIND if expected else 0]
        last, since = d_on, d_on[:accept] + [token]
        for p in (on, off):
            p.update("r", since)


@pytest.mark.parametrize("method", ["suffix", "memory_decoding"])
def test_tail_follows_every_token_committed_since_the_draft(method):
    p = build_proposer(method, num_speculative_tokens=8, rejected_tail=8)
    p.start_request("a", [9])
    p.update("a", [40, 41, 42, 43, 44, 45, 46, 47, 48, 49])
    p.stop_request("a")
    p.start_request("b", [70, 71, 40, 41])
    draft = p.propose(["b"])[0]
    assert draft[:3] == [42, 43, 44]
    p.update("b", [42])  # two commits before the next draft: the rule sees both
    p.update("b", [43, 999])
    assert p.propose(["b"]) == [draft[3:]] and p.last_kinds == [TAIL_KIND]
    p.propose_tree("b", budget=8)  # a tree draft leaves no tail
    p.update("b", [998])
    assert p.propose(["b"]) == [[]]
