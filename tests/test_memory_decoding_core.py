"""Unit tests of the memory_decoding core: the shared frequency trie against a
brute-force n-gram counter (counts, best children, longest-suffix lookup, pruning,
renumbering), the per-request context index, drafting, bounded memory and config
errors. No timing assertions."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_specext.config import SpecExtConfigError, validate_config
from vllm_specext.proposers import build_proposer
from vllm_specext.proposers.memory_decoding import (COPY, H_PTR, TRIE,
                                                     MemoryDecodingProposer, _local_match,
                                                     _stats_size, draft_kind)
from vllm_specext.proposers.rejected_tail import TAIL_KIND
from vllm_specext.proposers.memory_trie import (BEST, BYTES_PER_NODE, CNT, PARENT, ROOT,
                                                STAMP, FrequencyTrie, match)

seqs = st.lists(st.integers(0, 5), min_size=0, max_size=60)


def brute_counts(streams, depth):
    """n-gram -> occurrences over all streams (n = 1..depth)."""
    c = Counter()
    for s in streams:
        for i in range(len(s)):
            for n in range(1, depth + 1):
                if i + n <= len(s):
                    c[tuple(s[i:i + n])] += 1
    return c


def all_ngrams(trie):
    """n-gram -> (count, stamp) of every node, by walking parents."""
    nodes = trie.nodes
    out = {}
    for c in range(1, trie.num_nodes):
        path, v = [], c
        while v != ROOT:
            path.append(int(nodes[v, 0]))
            v = nodes[v, PARENT]
        out[tuple(reversed(path))] = (int(nodes[c, CNT]), int(nodes[c, STAMP]))
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(seqs, min_size=1, max_size=5), st.integers(2, 6), st.integers(0, 1))
def test_trie_counts_match_brute_force(streams, depth, big):
    trie = FrequencyTrie(branch_length=depth, max_nodes=1 << 16)
    if big:  # grow the arena (a renumbering) along the way
        streams = streams + [list(np.arange(800) % 97)]
    for s in streams:
        trie.insert(s)
    expect = brute_counts(streams, depth)
    got = all_ngrams(trie)
    assert {g: c for g, (c, _) in got.items()} == dict(expect)
    assert trie.count(()) == sum(len(s) for s in streams)
    nodes = trie.nodes
    for g in list(expect)[:20]:  # best child = a child of maximal count
        kids = trie.children(g)
        if kids:
            node = trie._node(g)
            assert kids[int(nodes[nodes[node, BEST], 0])] == max(kids.values())


@settings(max_examples=80, deadline=None)
@given(st.lists(seqs, min_size=1, max_size=5), st.integers(2, 6),
       st.lists(st.integers(0, 5), min_size=1, max_size=12), st.integers(1, 8))
def test_match_finds_the_longest_suffix_with_continuations(streams, depth, ctx, max_q):
    trie = FrequencyTrie(branch_length=depth, max_nodes=1 << 16)
    for s in streams:
        trie.insert(s)
    expect = brute_counts(streams, depth)
    arr = np.asarray(ctx, dtype=np.int32)
    for cut in range(len(ctx) + 1):  # the suffix split between ctx and ext
        node, q = match(trie.arena, arr, 0, cut, arr, cut, len(ctx) - cut, max_q)
        best = 0
        for m in range(1, min(max_q, len(ctx)) + 1):
            g = tuple(ctx[len(ctx) - m:])
            if expect.get(g) and any(g + (t,) in expect for t in range(6)):
                best = m
        assert q == best
        if q:
            assert trie.nodes[node, CNT] == expect[tuple(ctx[len(ctx) - q:])]
        else:
            assert node == -1


@settings(max_examples=60, deadline=None)
@given(st.lists(seqs, min_size=1, max_size=6), st.integers(2, 5), st.integers(1, 40),
       st.sampled_from(["frequency", "age"]))
def test_prune_keeps_best_prefix_closed_set(streams, depth, target, eviction):
    trie = FrequencyTrie(branch_length=depth, max_nodes=1 << 16, eviction=eviction)
    for s in streams:
        trie.insert(s)
    before = all_ngrams(trie)
    trie.prune(target)
    after = all_ngrams(trie)
    assert trie.num_nodes <= max(target, 1)
    for g, (c, stamp) in after.items():
        assert g[:-1] in after or len(g) == 1  # closed under prefixes
        c0, s0 = before[g]
        assert stamp == s0
        assert c == (c0 >> 1 if eviction == "frequency" else c0)

    def score(g):
        c, s = before[g]
        return (c >> 1, s) if eviction == "frequency" else (s, c)

    if after and len(after) < len(before):
        worst_kept = min(score(g) for g in after)
        assert all(score(g) <= worst_kept for g in before if g not in after)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=2, max_size=80), st.integers(1, 5),
       st.integers(0, 80))
def test_local_match_is_a_verified_latest_occurrence(tokens, orders, ptr):
    p = MemoryDecodingProposer(4, decoding_length=4, max_query_length=orders,
                               branch_length=orders + 1)
    p.start_request("r", tokens)
    p.propose(["r"])
    rs = p.state["r"]
    rs[H_PTR] = ptr
    L = len(tokens)
    n, j, jn = _local_match(rs, L)
    # brute force: longest suffix (<= orders, < L) that occurred earlier
    best = 0
    for m in range(1, min(orders, L - 1) + 1):
        suf = tokens[L - m:]
        if any(tokens[s - m:s] == suf for s in range(m, L)):
            best = m
    assert n <= best
    if n:
        suf = tokens[L - n:]
        occ = [s for s in range(n, L) if tokens[s - n:s] == suf]
        assert j == occ[-1]  # the most recent occurrence of that suffix
        assert jn in occ and jn <= j
        assert jn == j or jn >= ptr


def test_drafts_copy_context_and_learn_across_requests():
    p = MemoryDecodingProposer(8)
    p.start_request("a", [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3])
    assert p.propose(["a"]) == [[4, 5, 6, 7, 8, 9, 1, 2]]
    p.update("a", [4, 5, 40, 41, 42, 43, 44, 45, 46])
    p.stop_request("a")
    # a new request whose context ends like a's output continues it from the trie
    p.start_request("b", [70, 71, 40, 41])
    assert p.propose(["b"]) == [[42, 43, 44, 45, 46]]
    assert p.propose(["b"], max_tokens=[2]) == [[42, 43]]
    assert p.propose(["nope"]) == [[]]


def test_draft_kinds_name_the_candidate_and_its_match_length():
    assert [draft_kind(COPY, o) for o in (1, 2, 3, 4, 9)] == [1, 2, 3, 4, 4]
    assert [draft_kind(TRIE, o) for o in (0, 1, 2, 3, 4, 9)] == [4, 5, 6, 7, 7, 7]
    p = MemoryDecodingProposer(8)
    p.start_request("a", [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3])
    assert p.propose(["a", "nope"]) == [[4, 5, 6, 7, 8, 9, 1, 2], []]
    assert p.last_kinds == [draft_kind(COPY, 3), 0]  # copy after a 3-token match
    p.update("a", [4, 5, 40, 41, 42, 43, 44, 45, 46])
    p.stop_request("a")
    p.start_request("b", [70, 71, 40, 41])
    p.start_request("c", [70, 71, 72])
    assert p.propose(["c", "b", "b"], [8, 8, 0]) == [[], [42, 43, 44, 45, 46], []]
    assert p.last_kinds == [0, draft_kind(TRIE, 2), 0]  # trie path below "40 41"
    p.update("b", list(range(100, 300)) + [40, 41])  # the state array grows
    assert len(p.propose(["b"])[0]) == 8
    assert p.last_kinds == [draft_kind(COPY, 2)]  # now its own context has "40 41"


def test_tree_is_a_valid_tree_with_the_chain_first():
    p = MemoryDecodingProposer(8, max_nodes=4096)
    rng = np.random.default_rng(0)
    for i in range(30):
        out = rng.integers(0, 6, 40).tolist()
        p.start_request(f"r{i}", out[:5])
        p.update(f"r{i}", out)
        p.stop_request(f"r{i}")
    p.start_request("t", [1, 2, 3])
    chain = p.propose(["t"])[0]
    tok, par = p.propose_tree("t", budget=20, max_depth=6)
    assert 0 < len(tok) <= 20 and len(tok) == len(par)
    assert tok[: len(chain[:6])].tolist() == chain[:6]
    depth = []
    for i, q in enumerate(par):
        assert q < i
        depth.append(1 if q < 0 else depth[q] + 1)
        siblings = [tok[j] for j in range(i) if par[j] == q]
        assert tok[i] not in siblings  # merged prefixes
    assert max(depth) <= 6


def test_dynamic_algo_shortens_drafts_after_rejections():
    p = MemoryDecodingProposer(8, dynamic_algo=True)
    rng = np.random.default_rng(1)
    p.start_request("r", rng.integers(0, 4, 50).tolist())
    lengths = []
    for _ in range(200):
        d = p.propose(["r"])[0]
        lengths.append(len(d))
        p.update("r", rng.integers(0, 4, 1).tolist())  # random: drafts rarely match
    assert max(lengths) <= 8
    assert np.mean(lengths[-50:]) < np.mean(lengths[:5])


def test_memory_stays_bounded_after_10000_requests():
    p = MemoryDecodingProposer(8, max_nodes=4096, insert_prompt=True)
    extra = _stats_size(p._k, p.max_query_length) + 16  # statistics, alignment
    rng = np.random.default_rng(2)
    peak = 0
    for i in range(10_000):
        rid = f"r{i % 7}"
        p.start_request(rid, rng.integers(0, 500, 20).tolist())
        p.propose([rid])
        p.update(rid, rng.integers(0, 500, 12).tolist())
        p.propose([rid])
        p.stop_request(rid, finished=bool(i % 3))
        peak = max(peak, p.trie.num_nodes)
    assert peak <= 4096
    assert p.trie.num_prunes > 0
    assert p.trie.nbytes <= BYTES_PER_NODE * 4096 + 4 * extra + 64
    assert not p.state and not p.tokens


def test_long_prompt_and_long_update_are_counted_in_chunks():
    p = MemoryDecodingProposer(8, max_nodes=2048)
    rng = np.random.default_rng(3)
    prompt = rng.integers(0, 1000, 40_000).tolist()
    p.start_request("r", prompt)
    p.propose(["r"])
    out = rng.integers(0, 1000, 3000).tolist()
    p.update("r", out)  # past the state's capacity: the state array grows
    assert p.tokens["r"].view().tolist() == prompt + out
    assert len(p.propose(["r"])[0]) <= 8
    p.update("r", [7, 8])
    assert p.tokens["r"].view()[-3:].tolist() == [out[-1], 7, 8]
    p.stop_request("r")  # > max_nodes / 4 new nodes: counted in chunks, pruned
    assert 0 < p.trie.num_nodes <= 2048
    p.stop_request("r")  # unknown ids are ignored


def test_only_finished_requests_are_counted_and_statistics_survive_growth():
    p = MemoryDecodingProposer(8, max_nodes=1 << 16)
    p.start_request("a", [1, 2, 3])
    p.update("a", [4, 5, 6])
    p.stop_request("a", finished=False)  # aborted or preempted: not counted
    assert p.trie.num_nodes == 1
    p.start_request("a", [1, 2, 1, 2])
    assert p.propose(["a"]) == [[1, 2, 1, 2, 1, 2, 1, 2]]  # a copy of the context
    p.update("a", [1, 2, 3])
    p.stop_request("a")  # counted: the prompt's last branch_length - 1 tokens + output
    assert p.trie.count(()) == 7 and p.trie.count((2, 1, 2)) == 2
    stats = p.trie.extra.copy()
    assert stats.any()  # the copy candidate was scored
    p.trie.insert(np.arange(20_000) % 5003)  # grows and renumbers the arena
    assert (p.trie.extra == stats).all()


@pytest.mark.parametrize("rejected_tail", [0, 8])
def test_trie_draft_follows_an_accepted_draft(rejected_tail):
    p = MemoryDecodingProposer(8, rejected_tail=rejected_tail)
    p.start_request("a", [9])
    p.update("a", [40, 41, 42, 43, 44, 45, 46, 47, 48, 49])
    p.stop_request("a")
    p.start_request("b", [70, 71, 40, 41])
    assert p.propose(["b"]) == [[42, 43, 44, 45, 46, 47, 48, 49]]
    p.update("b", [42, 43, 44])  # two accepted, bonus = the trie's next token
    assert p.propose(["b"]) == [[45, 46, 47, 48, 49]]
    p.update("b", [45, 99])  # one accepted, bonus off the trie: 99 replaced 46
    if rejected_tail:
        assert p.propose(["b"]) == [[47, 48, 49]] and p.last_kinds == [TAIL_KIND]
        p.update("b", [47, 98])  # the tail's own tail
        assert p.propose(["b"]) == [[49]]
        p.update("b", [97, 96])  # diverged before the last token: no tail
    assert p.propose(["b"]) == [[]] and p.last_kinds == [0]


def test_request_id_reuse_resets_state():
    p = MemoryDecodingProposer(4)
    p.start_request("r", [1, 2, 1])
    p.propose(["r"])
    p.start_request("r", [9, 8, 7])
    assert p.propose(["r"]) == [[]]


def test_config_derives_and_rejects():
    cfg = validate_config({"method": "memory_decoding"})
    assert (cfg.num_speculative_tokens, cfg.decoding_length) == (16, 16)
    cfg = validate_config({"method": "memory_decoding", "decoding_length": 5})
    assert cfg.num_speculative_tokens == 5
    cfg = validate_config({"method": "memory_decoding", "num_speculative_tokens": 8})
    assert cfg.decoding_length == 8
    cfg = validate_config({"method": "memory_decoding", "num_speculative_tokens": 32,
                           "decoding_length": 16, "dynamic_algo": True})
    assert cfg.num_speculative_tokens == 32 and cfg.dynamic_algo
    p = build_proposer("memory_decoding", num_speculative_tokens=8, eviction="age")
    assert isinstance(p, MemoryDecodingProposer) and p.trie.eviction == "age"
    with pytest.raises(SpecExtConfigError, match="num_speculative_tokens.*decoding_length"):
        validate_config({"method": "memory_decoding", "num_speculative_tokens": 4,
                         "decoding_length": 8})
    with pytest.raises(SpecExtConfigError, match="branch_length.*max_query_length"):
        validate_config({"method": "memory_decoding", "branch_length": 3,
                         "max_query_length": 3})
    for key, bad in [("decoding_length", 17), ("decoding_length", 0), ("max_nodes", 10),
                     ("eviction", "lru"), ("max_query_length", 99)]:
        with pytest.raises(SpecExtConfigError, match=key):
            validate_config({"method": "memory_decoding", key: bad})
