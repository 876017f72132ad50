"""ngram proposer and NgramIndex against a brute-force prompt-lookup reference."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_specext.config import SpecExtConfigError
from vllm_specext.proposers import build_proposer
from vllm_specext.proposers.ngram import NgramProposer, ngram_kind
from vllm_specext.proposers.ngram_index import (NgramIndex, ngram_key, table_get, table_grow,
                                                table_put)


def reference(tokens, extra, min_n, max_n, cap, with_n=False):
    """Longest suffix n-gram of tokens+extra in [min_n, max_n] with an earlier occurrence
    ending at or before len(tokens)-2 (most recent one); periodic continuation.
    ``with_n``: return ``(draft, n)``, n = 0 for no draft."""
    v = list(tokens) + list(extra)
    length, total = len(tokens), len(v)
    for n in range(max_n, min_n - 1, -1):
        if n > total:
            continue
        suffix = v[total - n:]
        for end in range(length - 2, n - 2, -1):
            if v[end - n + 1:end + 1] == suffix:
                s = end + 1
                draft = [v[s + i % (total - s)] for i in range(cap)]
                return (draft, n) if with_n else draft
    return ([], 0) if with_n else []


# ---------------------------------------------------------------- token streams
def _random(alphabet):
    return st.lists(st.integers(0, alphabet - 1), min_size=0, max_size=120)


_repeated = st.builds(lambda t, n: [t] * n, st.integers(0, 2**31 - 1), st.integers(0, 60))
_period2 = st.builds(lambda a, b, n, tail: ([a, b] * n)[: 2 * n - tail],
                     st.integers(0, 5), st.integers(0, 2**31 - 1), st.integers(0, 40),
                     st.integers(0, 1))
_periodic_noise = st.builds(
    lambda period, n, noise: [period[i % len(period)] if i not in noise else 99
                              for i in range(n)],
    st.lists(st.integers(0, 4), min_size=1, max_size=7), st.integers(0, 100),
    st.sets(st.integers(0, 100), max_size=5))
# Thue-Morse words defeat polynomial hashes mod 2**64 (at lengths >= 2**11)
_thue_morse = st.builds(lambda n, a, b: [(a, b)[bin(i).count("1") % 2] for i in range(n)],
                        st.integers(0, 200), st.integers(0, 3), st.integers(0, 2**31 - 1))
STREAMS = st.one_of(_random(2), _random(4), _random(50), _repeated, _period2, _periodic_noise,
                    _thue_morse)
BOUNDS = st.tuples(st.integers(1, 6), st.integers(0, 4)).map(lambda t: (t[0], t[0] + t[1]))


@settings(max_examples=300, deadline=None)
@given(stream=STREAMS, bounds=BOUNDS, k=st.integers(1, 10), data=st.data())
def test_proposer_matches_reference_incrementally(stream, bounds, k, data):
    lo, hi = bounds
    plen = data.draw(st.integers(0, len(stream)))
    p = NgramProposer(k, lo, hi)
    p.start_request("r", stream[:plen])
    pos = plen
    while True:
        cap = data.draw(st.integers(1, k))
        got = p.propose(["r"], [cap])[0]
        want, n = reference(stream[:pos], [], lo, hi, cap, with_n=True)
        assert got == want
        assert p.last_kinds == [ngram_kind(n, lo, hi)]
        if pos == len(stream):
            break
        step = data.draw(st.integers(1, min(9, len(stream) - pos)))
        p.update("r", stream[pos:pos + step])
        pos += step


@settings(max_examples=200, deadline=None)
@given(stream=STREAMS, extra=st.lists(st.integers(0, 4), max_size=8), bounds=BOUNDS,
       cap=st.integers(1, 12))
def test_lookup_with_uncommitted_extra_tokens(stream, extra, bounds, cap):
    lo, hi = bounds
    idx = NgramIndex(lo, hi)
    toks = np.asarray(stream, dtype=np.int32)
    slot = idx.add(toks, len(toks))
    got = idx.lookup(slot, cap, extra).tolist()
    assert got == reference(stream, extra, lo, hi, cap)
    ext = np.asarray(extra, dtype=np.int32)
    matched = np.full(1, -1, dtype=np.int64)
    idx.propose([slot], [cap], ext, np.array([0, ext.size], np.int64), matched=matched)
    assert matched[0] == reference(stream, extra, lo, hi, cap, with_n=True)[1]
    # the extra tokens are not indexed: the plain lookup is unchanged
    assert idx.lookup(slot, cap).tolist() == reference(stream, [], lo, hi, cap)


def test_batched_propose_matches_single():
    rng = np.random.default_rng(0)
    p = NgramProposer(6, 2, 4)
    streams = {f"r{i}": rng.integers(0, 3 + i % 5, size=rng.integers(0, 400)).tolist()
               for i in range(30)}
    for rid, s in streams.items():
        p.start_request(rid, s)
    ids = list(streams)[::-1] + ["missing"]
    caps = [1 + i % 6 for i in range(len(ids))]
    batch = p.propose(ids, caps)
    assert batch[-1] == []
    for rid, cap, got in zip(ids[:-1], caps, batch):
        assert got == reference(streams[rid], [], 2, 4, cap)


def test_matched_ngram_length_and_draft_kinds():
    idx = NgramIndex(2, 4)
    toks = np.array([1, 2, 3, 4, 9, 2, 3, 4, 7, 3, 4], np.int32)
    a = idx.add(toks, len(toks))  # suffix "3 4" occurred, "7 3 4" did not: n = 2
    b = idx.add(toks, 8)  # suffix "2 3 4" occurred: n = 3
    c = idx.add(toks, 3)  # no earlier occurrence: no draft
    matched = np.full(4, -1, dtype=np.int64)
    drafts, lens = idx.propose([a, b, c, b], [2, 3, 2, 0], matched=matched)
    assert lens.tolist() == [2, 3, 0, 0] and matched.tolist() == [2, 3, 0, 0]
    assert drafts[0, :2].tolist() == [7, 3] and drafts[1, :3].tolist() == [9, 2, 3]
    with pytest.raises(ValueError):
        idx.propose([a], [2], matched=np.zeros(2, np.int64))
    with pytest.raises(ValueError):
        idx.propose([a], [2], matched=np.zeros(1, np.int32))
    # kinds: 1 shortest n-gram only, 2 in between, 3 longest; 0 no draft
    assert [ngram_kind(n, 2, 5) for n in (0, 2, 3, 4, 5)] == [0, 1, 2, 2, 3]
    assert [ngram_kind(n, 3, 3) for n in (0, 3)] == [0, 1]
    p = NgramProposer(4, 2, 3)
    p.start_request("a", toks.tolist())
    p.start_request("b", toks[:8].tolist())
    p.start_request("c", toks[:3].tolist())
    assert p.propose(["a", "b", "c", "missing", "b"], [4, 4, 4, 4, 0]) == \
        [[7, 3, 4, 7], [9, 2, 3, 4], [], [], []]
    assert p.last_kinds == [1, 3, 0, 0, 0]


def test_long_stream_and_buffer_growth():
    rng = np.random.default_rng(1)
    stream = rng.integers(0, 8, size=5000).tolist()
    p = NgramProposer(8, 3, 5)
    p.start_request("r", stream[:10])
    pos = 10
    while pos < len(stream):
        step = int(rng.integers(1, 9))
        p.update("r", stream[pos:pos + step])
        pos += step
        if pos % 7 == 0 or pos >= len(stream):
            assert p.propose(["r"])[0] == reference(stream[:pos], [], 3, 5, 8)


def test_periodic_extension():
    p = NgramProposer(7, 2, 3)
    p.start_request("r", [1, 2, 3, 1, 2, 3, 1, 2])
    # match "1 2" ending at 6 -> continuation 3, then the period-3 pattern repeats
    assert p.propose(["r"]) == [[3, 1, 2, 3, 1, 2, 3]]
    p.start_request("s", [5] * 4)
    assert p.propose(["s"]) == [[5] * 7]


def _key(toks, start, n):
    return np.uint64(ngram_key(toks, start, n))  # numba returns a Python int


def test_table_primitives():
    table = np.zeros(16, np.uint64)
    toks = np.arange(40, dtype=np.int32) % 13
    count = 0
    for i in range(30):
        if 2 * (count + 1) > table.size:
            table = table_grow(table, 0)
        count += table_put(table, _key(toks, i, 3), i)
    assert count == 13 and table.size == 32
    for i in range(13):
        assert table_get(table, _key(toks, i, 3)) == i + 13 * ((29 - i) // 13)
    assert table_get(table, _key(toks, 0, 2)) == -1  # n is part of the key
    big = table_grow(table, 1024)
    assert big.size == 1024 and table_get(big, _key(toks, 1, 3)) == 27
    assert table_put(big, _key(toks, 1, 3), 2**31 - 1) == 0
    assert table_get(big, _key(toks, 1, 3)) == 2**31 - 1


def test_removed_and_reused_slots():
    idx = NgramIndex(1, 2)
    a = idx.add(np.array([1, 2, 1, 2], np.int32), 4)
    b = idx.add(np.array([3, 3, 3], np.int32), 3)
    idx.remove(a)
    assert idx.lookup(a, 3, [1, 2]).size == 0  # a removed slot drafts nothing
    c = idx.add(np.array([4, 5, 4], np.int32), 3)
    assert c == a
    assert idx.lookup(c, 3).tolist() == [5, 4, 5]
    assert idx.lookup(b, 2).tolist() == [3, 3]
    with pytest.raises(ValueError):
        idx.set_tokens(b, np.array([3, 3, 3], np.int64), 3)


@pytest.mark.parametrize("lo,hi", [(0, 3), (3, 2), (1, 65)])
def test_index_rejects_bad_bounds(lo, hi):
    with pytest.raises(ValueError):
        NgramIndex(lo, hi)


@pytest.mark.parametrize("kwargs,key", [
    ({"prompt_lookup_min": 0}, "prompt_lookup_min"),
    ({"prompt_lookup_max": 65}, "prompt_lookup_max"),
    ({"prompt_lookup_min": 4, "prompt_lookup_max": 3}, "prompt_lookup_min"),
    ({"prompt_lookup_min": "two"}, "prompt_lookup_min"),
    ({"prompt_lookup_max": 2.5}, "prompt_lookup_max"),
    ({"num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"prompt_lookup_mid": 3}, "prompt_lookup_mid"),
])
def test_config_errors_name_the_key(kwargs, key):
    with pytest.raises(SpecExtConfigError, match=key):
        build_proposer("ngram", **kwargs)


def test_config_passes_bounds():
    p = build_proposer("ngram", num_speculative_tokens=3, prompt_lookup_min=1,
                       prompt_lookup_max=2)
    assert (p.lookup.index.min_n, p.lookup.index.max_n, p.num_speculative_tokens) == (1, 2, 3)
