"""lookahead: the n-gram pool (insert, G-cap eviction, lookup), the proposer's Jacobi
feedback path (observe_targets) and its config."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_specext.config import SpecExtConfigError, validate_config
from vllm_specext.proposers import build_proposer
from vllm_specext.proposers.lookahead import LookaheadProposer
from vllm_specext.proposers.lookahead_pool import NgramPool, draft_chain


def grams(*rows):
    return np.array(rows, dtype=np.int32)


# ---------------------------------------------------------------- pool
def test_insert_and_lookup_most_recent_first():
    pool = NgramPool(width=3, max_key=3, guess_set_size=4)
    pool.add_grams(grams([7, 1, 2, 3], [7, 4, 5, 6], [8, 1, 1, 1]))
    assert pool.candidates([7]) == [[4, 5, 6], [1, 2, 3]]
    assert pool.candidates([8]) == [[1, 1, 1]]
    assert pool.candidates([9]) == []
    assert pool.candidates([7, 8]) == []  # a 2-token key is another key


def test_g_cap_evicts_oldest_and_reinsert_refreshes():
    pool = NgramPool(width=2, max_key=1, guess_set_size=3)
    pool.add_grams(grams([5, 1, 1], [5, 2, 2], [5, 3, 3]))
    pool.add_grams(grams([5, 1, 1]))  # already held: moves to the front, nothing dropped
    assert pool.candidates([5]) == [[1, 1], [3, 3], [2, 2]]
    pool.add_grams(grams([5, 4, 4]))  # a fourth: the oldest ([2, 2]) goes
    assert pool.candidates([5]) == [[4, 4], [1, 1], [3, 3]]
    pool.add_grams(grams([5, 2, 2], [5, 6, 6]))
    assert pool.candidates([5]) == [[6, 6], [2, 2], [4, 4]]
    slots_before = int(pool.meta[1])
    pool.add_grams(grams([5, 7, 7], [5, 8, 8]))  # evicted slots are reused
    assert int(pool.meta[1]) == slots_before
    assert pool.candidates([5]) == [[8, 8], [7, 7], [6, 6]]


def reference_pool(tokens, width, max_key, g):
    """Brute force: key tuple -> continuations, most recent first (LRU, capped at g)."""
    table: dict[tuple, list[tuple]] = {}
    for p in range(1, len(tokens) - width + 1):
        cont = tuple(tokens[p:p + width])
        for m in range(1, min(max_key, p) + 1):
            lst = table.setdefault(tuple(tokens[p - m:p]), [])
            if cont in lst:
                lst.remove(cont)
            lst.insert(0, cont)
            del lst[g:]
    return table


@settings(max_examples=150, deadline=None)
@given(tokens=st.lists(st.integers(0, 5), max_size=80), width=st.integers(1, 4),
       max_key=st.integers(1, 4), g=st.integers(1, 4), cut=st.integers(0, 80))
def test_add_context_matches_reference_incrementally(tokens, width, max_key, g, cut):
    arr = np.array(tokens, dtype=np.int32)
    pool = NgramPool(width, max_key, g)
    nxt = pool.add_context(arr, 0, min(cut, len(arr)))  # in two pieces, as tokens arrive
    pool.add_context(arr, nxt, len(arr))
    ref = reference_pool(tokens, width, max_key, g)
    for key, conts in ref.items():
        assert pool.candidates(list(key)) == [list(c) for c in conts]
    assert pool.candidates([99]) == []


def test_draft_chain_longest_key_then_chains():
    own = NgramPool(width=2, max_key=2, guess_set_size=2)
    shared = NgramPool(width=2, max_key=2, guess_set_size=2)
    own.add_context(np.array([1, 2, 3, 4, 9, 2, 8, 8], dtype=np.int32), 0, 8)
    shared.add_grams(grams([8, 5, 6], [6, 7, 7]))
    buf = np.zeros(16, dtype=np.int32)
    info = np.zeros(2, dtype=np.int64)
    buf[:2] = [1, 2]  # key [1, 2] (own) beats key [2] (more recent: [8, 8])
    n = draft_chain((own.arrays, shared.arrays), buf, 2, 2, 7, info)
    # [1,2] -> 3 4 ; [3,4] -> 9 2 ; [9,2] -> 8 8 ; then only the shared pool has [8] -> 5 6
    assert buf[2:2 + n].tolist() == [3, 4, 9, 2, 8, 8, 5] and info.tolist() == [2, 0]
    buf[:2] = [0, 6]  # only the shared pool knows 6
    n = draft_chain((own.arrays, shared.arrays), buf, 2, 2, 3, info)
    assert buf[2:2 + n].tolist() == [7, 7] and info.tolist() == [1, 1]  # nothing knows 7
    buf[:2] = [0, 42]
    assert draft_chain((own.arrays, shared.arrays), buf, 2, 2, 3, info) == 0
    assert info.tolist() == [0, -1]


# ---------------------------------------------------------------- proposer
def test_drafts_from_prompt_ngrams():
    p = LookaheadProposer(8, level=4, window=5, guess_set_size=5, prompt_lookup_max=0)
    p.start_request("r", [10, 11, 12, 13, 14, 15, 16, 17, 10, 11])
    # [10, 11] -> 12 13 14 ; [12, 13, 14] -> 15 16 17 ; the last N-2 positions have no
    # complete continuation yet
    assert p.propose(["r"]) == [[12, 13, 14, 15, 16, 17]]
    assert p.last_kinds == [1 + 2]  # an n-gram pool draft from a 2-token key
    assert p.propose(["r"], [2]) == [[12, 13]]
    assert p.counts["pool"] == 2 and p.counts["window"] == 0


def test_prompt_lookup_goes_first():
    p = LookaheadProposer(8, level=4, window=5, guess_set_size=5)  # prompt_lookup_max 5
    p.start_request("r", [10, 11, 12, 13, 14, 15, 16, 17, 10, 11])
    # [10, 11] occurred before: its continuation, extended by the period, as ngram drafts
    assert p.propose(["r"]) == [[12, 13, 14, 15, 16, 17, 10, 11]]
    assert p.last_kinds == [7] and p.counts["lookup"] == 1 and p.counts["pool"] == 0
    assert p.propose(["r", "x"], [3, 3]) == [[12, 13, 14], []]
    p.observe_targets("r", [12, 13, 14], [12, 13, 99])  # Jacobi feedback still harvested
    assert p.counts["grams"] == 3
    p.update("r", [12, 13, 14, 20])  # "14 20" never occurred: the pool / window again
    assert p.propose(["r"])[0] and p.last_kinds != [7]
    p.stop_request("r")
    assert not p.lookup.slots and p.state_nbytes() == p.__class__(8).state_nbytes()


def test_window_when_pool_misses():
    p = LookaheadProposer(8, level=4, window=5, prompt_lookup_max=0)
    prompt = [1, 2, 3, 4, 5, 6, 7]  # no token repeats: no key ends the context
    p.start_request("r", prompt)
    d = p.propose(["r"])[0]
    assert len(d) == 5 and set(d) <= set(prompt) and p.counts["window"] == 1
    assert p.last_kinds == [0]  # Jacobi-window guesses
    assert len(p.propose(["r"], [3])[0]) == 3
    assert p.propose(["r", "unknown"], [3, 3])[1] == [] and p.last_kinds == [0, 0]


def test_observe_harvests_jacobi_ngrams_and_updates_window():
    p = LookaheadProposer(8, level=4, window=5, prompt_lookup_max=0)
    ctx = [1, 2, 3, 4, 5, 6, 7]
    p.start_request("r", ctx)
    w = p.propose(["r"])[0]                # nothing continues 7: the window
    assert p.counts["window"] == 1
    t = [100, 101, 102, 103, 104]          # the target's tokens at the 5 draft positions
    p.observe_targets("r", w, t)
    pool = p._req["r"].pool.grams
    # N-gram j = trajectory (N-1 tokens) of the token before position j, then targets[j];
    # its first token is the key. Window fills are not predictions: their trajectories
    # are the tokens before them.
    seq = ctx[-3:] + w
    for j in range(5):
        gram = seq[j:j + 3] + [t[j]]
        assert gram[1:] in pool.candidates(gram[:1])
    p.update("r", [100])                   # w[0] rejected: the target's token is committed
    d2 = p.propose(["r"])[0]               # 100 is new: the pool misses, the window moves
    assert d2[:4] == [101, 102, 103, 104] and p.counts["window"] == 2
    u = [200, 201, 202, 203, 204]
    p.observe_targets("r", d2, u)
    # d2[0] = 101 was predicted after w[0], which came after 7: a diagonal (7, w0, 101);
    # d2[1] = 102 after w[1] after w[0]: (w0, w1, 102), and so on
    assert [7, 100, 200] in pool.candidates([6])  # j = 0: the context's trajectory
    for j, traj in enumerate([[7, w[0], 101], [w[0], w[1], 102], [w[1], w[2], 103],
                              [w[2], w[3], 104]], start=1):
        assert traj[1:] + [u[j]] in pool.candidates(traj[:1])
    assert p.counts["grams"] == 10


def test_jacobi_ngram_is_drafted_later():
    p = LookaheadProposer(4, level=3, window=4, prompt_lookup_max=0)
    p.start_request("r", [1, 2, 3, 4, 5, 6])
    p.propose(["r"])
    p.observe_targets("r", [40, 41, 42], [70, 71, 72])  # (40, 41) -> 72 among the n-grams
    p.update("r", [70, 40])                # no context n-gram continues 40 yet
    assert p.propose(["r"]) == [[41, 72]]


def test_next_token_table_when_no_ngram_continues():
    p = LookaheadProposer(4, level=3, window=4, prompt_lookup_max=0)
    p.start_request("r", [1, 2, 3, 4, 5, 6])
    p.propose(["r"])
    p.observe_targets("r", [40, 41, 42], [70, 71, 72])  # the target said 72 after 41
    assert p._req["r"].pool.nxt.candidates([41]) == [[72]]
    assert p._req["r"].pool.nxt.candidates([6]) == [[70]]
    p.update("r", [70, 41])                # no n-gram key ends with 41 (or 70, 41)
    assert p.propose(["r"]) == [[72]] and p.counts["window"] == 1
    assert p.last_kinds == [1]  # the next-token table


def test_observe_ignores_stale_and_unknown():
    p = LookaheadProposer(8, prompt_lookup_max=0)
    p.start_request("r", [1, 2, 3, 4, 5, 6])
    d = p.propose(["r"])[0]
    p.update("r", [9])
    p.observe_targets("r", d, [0] * len(d))     # the context grew since: stale
    p.observe_targets("zzz", [1], [2])          # unknown request
    p.observe_targets("r", [], [])
    assert p.counts["grams"] == 0


def test_observe_foreign_draft_uses_context_trajectories():
    p = LookaheadProposer(8, level=3, window=5, prompt_lookup_max=0)
    p.start_request("r", [1, 2, 3, 4, 5, 6])
    p.propose(["r"])
    p.observe_targets("r", [40, 41], [70, 71])  # not the proposed draft
    assert p._req["r"].pool.grams.candidates([5]) == [[6, 70]]
    assert p._req["r"].pool.grams.candidates([6]) == [[40, 71]]


def test_shared_pool_crosses_requests_and_is_bounded():
    p = LookaheadProposer(8, level=3, window=5, shared_pool_size=40, prompt_lookup_max=0)
    p.start_request("a", [1, 2, 3, 4, 5, 6])
    w = p.propose(["a"])[0]
    p.observe_targets("a", w, [70, 71, 72, 73, 74])
    p.stop_request("a")
    p.start_request("b", [30, 31, 5])           # b's own pool does not know 5
    assert p.propose(["b"])[0][:2] == [6, 70]
    rng = np.random.default_rng(0)
    for i in range(30):
        rid = f"x{i}"
        p.start_request(rid, rng.integers(0, 1000, 20).tolist())
        for _ in range(5):
            d = p.propose([rid])[0]
            p.observe_targets(rid, d, rng.integers(0, 1000, len(d)).tolist())
            p.update(rid, rng.integers(0, 1000, 3).tolist())
        p.stop_request(rid)
    assert sum(pool.num_entries for pool in p.shared) <= 40 + 20 + 8
    assert p.state_nbytes() > 0


def test_cap_and_unknown_requests():
    p = LookaheadProposer(8, prompt_lookup_max=0)
    p.start_request("r", list(range(20)) * 2)
    assert [len(d) for d in p.propose(["r", "nope", "r"], [3, 5, 0])] == [3, 0, 0]
    p.start_request("e", [])
    assert p.propose(["e"]) == [[]]


def test_sampled_targets_are_harvested_alike():
    """The proposer never assumes targets[j] == draft[j] for accepted positions."""
    p = LookaheadProposer(5, level=3, window=5, prompt_lookup_max=0)
    p.start_request("r", [1, 2, 3, 4, 5])
    d = p.propose(["r"])[0]
    p.observe_targets("r", d, d)            # every draft token was sampled by the target
    assert p.counts["grams"] == len(d)


# ---------------------------------------------------------------- config
def test_config_defaults_and_derivation():
    cfg = validate_config({"method": "lookahead"})
    assert (cfg.level, cfg.window, cfg.guess_set_size, cfg.num_speculative_tokens) == (4, 5, 5, 5)
    cfg = validate_config({"method": "lookahead", "level": 8, "window": 3})
    assert cfg.num_speculative_tokens == 7
    cfg = validate_config({"method": "lookahead", "num_speculative_tokens": 4})
    assert (cfg.window, cfg.level) == (4, 4)
    cfg = validate_config({"method": "lookahead", "num_speculative_tokens": 2})
    assert (cfg.window, cfg.level) == (2, 3)
    cfg = validate_config({"plugin_type": "la", "level": 5, "window": 7, "guess_set_size": 7})
    assert cfg.method == "lookahead" and cfg.num_speculative_tokens == 7
    p = build_proposer("lookahead", num_speculative_tokens=8, guess_set_size=3)
    assert isinstance(p, LookaheadProposer) and p.uses_target_tokens and p.g == 3


@pytest.mark.parametrize("spec,keys", [
    ({"level": 2}, ["level", "[3, 16]"]),
    ({"level": 17}, ["level", "[3, 16]"]),
    ({"window": 0}, ["window", "[1, 16]"]),
    ({"window": 17}, ["window", "[1, 16]"]),
    ({"guess_set_size": 0}, ["guess_set_size", "[1, 16]"]),
    ({"guess_set_size": 17}, ["guess_set_size", "[1, 16]"]),
    ({"guess_set_size": "five"}, ["guess_set_size"]),
    ({"shared_pool_size": -1}, ["shared_pool_size"]),
    ({"num_speculative_tokens": 4, "window": 5}, ["num_speculative_tokens", "window", "level"]),
    ({"num_speculative_tokens": 6, "level": 8}, ["num_speculative_tokens", "level - 1"]),
    ({"num_speculative_tokens": 1}, ["num_speculative_tokens", "speculationGamma"]),
    ({"num_speculative_tokens": 0}, ["num_speculative_tokens"]),
    ({"gamma": 30}, ["gamma"]),
])
def test_config_errors_name_the_keys(spec, keys):
    with pytest.raises(SpecExtConfigError) as err:
        validate_config({"method": "lookahead", **spec})
    for key in keys:
        assert key in str(err.value)
