"""The ``suffix`` proposer core: suffix trees against brute-force counts, drafts against a
brute-force reference matcher, the global cache's cap, abort/preempt and id reuse."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vllm_specext.config import SpecExtConfigError
from vllm_specext.proposers import build_proposer
from vllm_specext.proposers import suffix_tree as T
from vllm_specext.proposers import suffix as SX
from vllm_specext.proposers.suffix import SuffixProposer, draft_kind

SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(autouse=True)
def tiny_arena(monkeypatch):
    """Tiny arena regions, so relocation and compaction run in every test."""
    monkeypatch.setattr(T.GlobalCache, "_FIRST_ROOM", 2)


# ------------------------------------------------------------------ brute force
def substring_counts(seqs, depth):
    """Occurrences of every substring of at most ``depth`` tokens."""
    c = Counter()
    for s in seqs:
        for i in range(len(s)):
            for n in range(1, min(depth, len(s) - i) + 1):
                c[tuple(s[i:i + n])] += 1
    return c


def tree_contents(tree, tok, seqs):
    """Path string -> count for every position of every node, checking the structure."""
    nodes, out, stack = tree.nodes, {}, [(0, ())]
    while stack:
        u, path = stack.pop()
        kids, c = [], nodes[u, T.FCH]
        while c >= 0:
            assert nodes[c, T.PAR] == u
            kids.append(c)
            c = nodes[c, T.NXT]
        for c in kids:
            start = seqs[nodes[c, T.SEQ], 0] + nodes[c, T.POS]
            run = tuple(int(x) for x in tok[start:start + nodes[c, T.LEN]])
            assert len(run) >= 1 and run[0] == nodes[c, T.TOK]
            assert T._hfind(tree.hkeys, tree.hvals, T._key(u, run[0])) == c
            p = path
            for t in run:
                p += (t,)
                out[p] = int(nodes[c, T.CNT])
            stack.append((c, p))
        if kids:
            best = nodes[u, T.BEST]
            assert best in kids
            assert nodes[best, T.CNT] == max(nodes[k, T.CNT] for k in kids)
    assert tree.meta[T.M_HCNT] == tree.num_nodes - 1
    return out


class Voters:
    """Brute-force voters of a context (see :mod:`vllm_specext.proposers.suffix`): the
    suffixes ``s`` of the context with their support, per tree."""

    def __init__(self, ctx, output_len, glob, depth):
        self.counts = [substring_counts([ctx], depth), substring_counts(glob, depth)]
        self.voters = []  # (tree, string, support)
        width = min(len(ctx), depth)
        for m in range(1, width):
            s = tuple(ctx[len(ctx) - m:])
            if self.counts[0][s] > 1:
                self.voters.append((0, s, self.counts[0][s] - 1))
        own = min(output_len, depth - 1)
        for m in range(1, width):
            s = tuple(ctx[len(ctx) - m:])
            sup = self.counts[1][s] - (1 if m <= own else 0)
            if m > own and self.counts[1][s] == 0:
                break
            if sup > 0:
                self.voters.append((1, s, sup))
        self.longest = max((len(s) for _, s, _ in self.voters), default=0)

    def tally(self, lw=1.0):
        """Votes per next token, request-tree voters weighted ``lw``."""
        votes = {}
        for tree, s, sup in self.voters:
            for p, c in self.counts[tree].items():
                if len(p) == len(s) + 1 and p[:-1] == s:
                    w = (lw if tree == 0 else 1.0) / (sup + SX.ALPHA)
                    votes[p[-1]] = votes.get(p[-1], 0.0) + c * w
        return votes

    def advance(self, t):
        self.voters = [(tree, s + (t,), self.counts[tree][s + (t,)])
                       for tree, s, _ in self.voters if self.counts[tree][s + (t,)] > 0]


def check_chain(draft, ctx, output_len, glob, depth, k, factor, min_prob, lw):
    """``draft`` follows the top vote (local weight ``lw``) at every step (any of tied
    tokens) and stops exactly where the reference stops."""
    v = Voters(ctx, output_len, glob, depth)
    budget = max(0, min(k, int(np.float32(v.longest) * np.float32(factor) + 1e-6)))
    prob = 1.0
    for step in range(budget + 1):
        votes = v.tally(lw) if v.voters else {}
        if step == budget or not votes:
            assert len(draft) == step
            return
        top = max(votes.values())
        p_next = prob * top / sum(votes.values())
        if abs(p_next - min_prob) < 1e-9:
            return  # on the threshold: rounding decides
        if p_next < min_prob:
            assert len(draft) == step
            return
        assert len(draft) > step and votes.get(draft[step], -1) > top - 1e-9
        prob = p_next
        v.advance(draft[step])


# ------------------------------------------------------------------ strategies
tokens = st.lists(st.integers(0, 3), max_size=40)


@st.composite
def repetitive(draw):
    """A motif repeated with a few point mutations (code/agent-like repetition)."""
    motif = draw(st.lists(st.integers(0, 15), min_size=1, max_size=8))
    seq = motif * draw(st.integers(1, 6))
    for _ in range(draw(st.integers(0, 3))):
        if seq:
            seq[draw(st.integers(0, len(seq) - 1))] = draw(st.integers(0, 15))
    return seq


# at most 16 distinct tokens: every voter enumerates all its children (MAX_CHILDREN)
assert SX.MAX_CHILDREN >= 15


sequences = st.one_of(tokens, repetitive())


# ------------------------------------------------------------------ tree contents
@SETTINGS
@given(seq=sequences, depth=st.integers(1, 12), chunk=st.integers(1, 5))
def test_request_tree_counts_every_substring(seq, depth, chunk):
    cache = T.GlobalCache(depth, 0)
    req = T.ActiveRequest(depth, cache, 0)
    tok = np.asarray(seq, dtype=np.int32)
    for end in range(chunk, len(seq) + chunk, chunk):
        req.extend(tok, min(end, len(seq)))
    assert tree_contents(req.tree, tok, req.seqs) == dict(substring_counts([seq], depth))
    for m in range(1, min(len(seq), depth - 1) + 1):  # suffix states end at node ends
        path, x = [], req.act[m]
        while x:
            start = req.tree.nodes[x, T.POS]
            path[:0] = tok[start:start + req.tree.nodes[x, T.LEN]].tolist()
            x = req.tree.nodes[x, T.PAR]
        assert path == seq[-m:]


@st.composite
def schedules(draw):
    """Interleaved life cycles: (op, request, tokens) with op in start/update/finish/abort."""
    ops, active, n = [], [], 0
    for _ in range(draw(st.integers(1, 40))):
        choice = draw(st.integers(0, 9))
        if choice < 2 or not active:
            rid = f"r{n}"
            n += 1
            active.append(rid)
            ops.append(("start", rid, draw(sequences)))
        elif choice < 4:
            rid = active.pop(draw(st.integers(0, len(active) - 1)))
            ops.append(("finish" if draw(st.booleans()) else "abort", rid, []))
        else:
            rid = active[draw(st.integers(0, len(active) - 1))]
            ops.append(("update", rid, draw(st.lists(st.integers(0, 3), min_size=1,
                                                     max_size=4))))
    return ops


def run_schedule(p, ops, check_every_step=True):
    """Drive ``p``; after each op compare both kinds of tree with brute force."""
    depth, cap = p.max_depth, p.global_cache.max_requests
    prompts, outputs, cached = {}, {}, []
    for op, rid, toks in ops:
        if op == "start":
            p.start_request(rid, toks)
            prompts[rid], outputs[rid] = list(toks), []
        elif op == "update":
            p.update(rid, toks)
            outputs[rid] += toks
        else:
            p.stop_request(rid, finished=op == "finish")
            out = outputs.pop(rid)
            del prompts[rid]
            if op == "finish" and cap != 0:
                cached = (cached + [out])[-cap:] if cap > 0 else cached + [out]
        if check_every_step or op != "update":
            p.index_pending()  # update only stores tokens; drafting or finishing indexes
            g = p.global_cache
            live = cached + list(outputs.values()) if cap != 0 else []
            assert tree_contents(g.tree, g.arena, g.seqs) == dict(substring_counts(live, depth))
            assert len(g) == len(cached)
            for r in prompts:
                req, buf = p._reqs[r], p.tokens[r]
                want = substring_counts([prompts[r] + outputs[r]], depth)
                assert tree_contents(req.tree, buf.storage, req.seqs) == dict(want)
    return prompts, outputs, cached


@SETTINGS
@given(ops=schedules(), depth=st.integers(1, 8), cap=st.sampled_from([-1, 0, 1, 2, 5]))
def test_global_tree_holds_active_and_finished_outputs(ops, depth, cap):
    p = SuffixProposer(4, depth, cap)
    run_schedule(p, ops)


# ------------------------------------------------------------------ drafts
@SETTINGS
@given(ops=schedules(), depth=st.integers(2, 10), k=st.integers(1, 6),
       factor=st.sampled_from([0.5, 1.0, 2.0, 8.0]), min_prob=st.sampled_from([0.0, 0.1, 0.5]),
       cap=st.sampled_from([-1, 0, 3]))
def test_chain_draft_matches_reference(ops, depth, k, factor, min_prob, cap):
    p = SuffixProposer(k, depth, cap, factor, min_prob, rejected_tail=0)
    prompts, outputs, cached = {}, {}, []
    for op, rid, toks in ops:
        if op == "start":
            p.start_request(rid, toks)
            prompts[rid], outputs[rid] = list(toks), []
        elif op == "update":
            p.update(rid, toks)
            outputs[rid] += toks
        else:
            p.stop_request(rid, finished=op == "finish")
            out = outputs.pop(rid)
            del prompts[rid]
            if op == "finish" and cap != 0:
                cached = (cached + [out])[-cap:] if cap > 0 else cached + [out]
        p.index_pending()  # the reference drafts from every output so far
        for r in prompts:
            glob = cached + list(outputs.values()) if cap != 0 else []
            own = len(outputs[r]) if cap != 0 else 0
            draft = p.propose([r])[0]
            assert len(draft) <= k
            check_chain(draft, prompts[r] + outputs[r], own, glob, depth, k, factor, min_prob,
                        p.local_weight)


def test_draft_continues_a_repeated_pattern():
    p = SuffixProposer(4, suffix_decoding_max_spec_factor=1.0)
    p.start_request("a", [7, 1, 2, 3, 4, 5, 6, 9, 1, 2, 3])
    assert p.propose(["a"]) == [[4, 5, 6]]  # match "1 2 3" (m = 3) caps the draft at 3
    assert p.last_kinds == [draft_kind(3, 3, 1.0)] == [4]  # an own match of 3, one choice
    assert p.propose(["a"], max_tokens=[2]) == [[4, 5]]
    p.update("a", [4, 5])
    assert p.propose(["a"]) == [[6, 9, 1, 2]] and p.last_kinds == [draft_kind(5, 5, 1.0)]
    p.start_request("b", [11, 12, 13])
    assert p.propose(["b"]) == [[]] and p.last_kinds == [0]  # nothing matches
    q = build_proposer("suffix", num_speculative_tokens=4)  # defaults: factor 8
    q.start_request("a", [7, 1, 2, 3, 4, 5, 6, 9, 1, 2, 3])
    assert q.propose(["a"]) == [[4, 5, 6, 9]]


def test_global_cache_drafts_from_finished_outputs():
    p = build_proposer("suffix", num_speculative_tokens=4)
    p.start_request("a", [1])
    p.update("a", [10, 11, 12, 13, 14, 15])
    p.stop_request("a", finished=True)
    p.start_request("b", [2, 10, 11, 12])
    assert p.propose(["b"]) == [[13, 14, 15]]


def test_negative_token_ids_are_stored_like_any_other():
    """A child key holds the token's 32 bits: -1 once cleared the parent's bits, hit the
    hash table's empty key and crashed the process (found by a fresh-user review)."""
    p = build_proposer("suffix", num_speculative_tokens=4)
    p.start_request("r1", [1, 2, 3, 1, 2, 3, 1, 2])
    p.update("r1", [3, 1, 2])
    p.stop_request("r1")
    p.start_request("n", [-1, 2, -1, 2])
    assert p.propose(["n"]) == [[-1, 2]]
    p.update("n", [-1, -2])
    p.stop_request("n")
    p.start_request("m", [5, -1])  # n's output "-1 -2" is in the global tree
    assert p.propose(["m"]) == [[-2]]


def test_local_weight_follows_the_tree_that_predicts():
    """The request tree says 1 -> 2, the global tree 1 -> 3: the local weight rises while
    2 follows, falls while 3 follows, and stays within its bound."""
    p = SuffixProposer(4, 8, -1)
    p.start_request("g", [0])
    p.update("g", [1, 3] * 20)
    p.stop_request("g")
    p.start_request("a", [1, 2, 5, 1, 2, 5])
    assert p.local_weight == 1.0
    p.update("a", [1])  # no vote before this update: nothing learned
    assert p.local_weight == 1.0
    for _ in range(20):
        p.propose(["a"])
        p.update("a", [2, 5, 1])
    high = p.local_weight
    assert high > 1.0
    for _ in range(400):
        p.propose(["a"])
        p.update("a", [3, 1])
    assert np.exp(-SX.LOG_LOCAL_WEIGHT_BOUND) - 1e-9 <= p.local_weight < high
    assert p.local_weight < 1.0


@SETTINGS
@given(ops=schedules(), budget=st.integers(1, 12), depth=st.integers(1, 5))
def test_tree_draft_is_a_valid_tree(ops, budget, depth):
    p = SuffixProposer(depth, 12, -1, 2.0, 0.0)
    prompts, outputs, cached = run_schedule(p, ops, check_every_step=False)
    for rid in p.active_requests:
        ctx = prompts[rid] + outputs[rid]
        v = Voters(ctx, len(outputs[rid]), cached + list(outputs.values()), 12)
        tok, par = p.propose_tree(rid, budget=budget)
        chain = p.propose([rid])[0]
        assert tok.dtype == np.int32 and len(tok) == len(par) <= budget
        assert (len(tok) > 0) == (len(chain) > 0)
        if chain:
            assert tok[0] == chain[0]  # the top vote comes first
        cap = min(depth, int(v.longest * 2.0 + 1e-6))
        for i in range(len(tok)):
            assert -1 <= par[i] < i
            path, j = (), i
            while j >= 0:
                path = (int(tok[j]),) + path
                j = par[j]
            assert len(path) <= cap
            assert any(v.counts[tree][s + path] > 0 for tree, s, _ in v.voters)


# ------------------------------------------------------------------ cap, abort, reuse
def test_cap_holds_after_10000_requests():
    cap = 50
    p = SuffixProposer(4, 8, cap)
    rng = np.random.default_rng(0)
    peak_nodes = peak_arena = 0
    for i in range(10_000):
        rid = f"r{i}"
        p.start_request(rid, rng.integers(0, 30, 3).tolist())
        p.update(rid, rng.integers(0, 30, 5).tolist())
        p.stop_request(rid, finished=i % 7 != 0)  # every 7th aborted
        if i >= 5000:
            peak_nodes = max(peak_nodes, p.global_cache.tree.num_nodes)
            peak_arena = max(peak_arena, len(p.global_cache.arena))
        assert len(p.global_cache) <= cap
    g = p.global_cache
    assert len(g) == cap and g.stored_tokens == 5 * cap
    assert peak_nodes <= 2 * 5 * cap + 1  # a suffix tree has < 2 nodes per token
    assert peak_arena <= 64 * 5 * cap  # removed outputs' tokens are reclaimed
    assert len(g.seqs) <= 8 * cap


def test_committed_tokens_are_indexed_when_drafted_for_or_finished():
    """``update`` stores tokens only; a request's tokens enter its tree and the global tree
    when it is drafted for (a cap above 0), all pending steps at once, or when it finishes;
    an abort drops them. The drafts of the requests drafted for equal those of a proposer
    indexed after every update."""
    lazy, eager = SuffixProposer(4, 8, -1), SuffixProposer(4, 8, -1)
    for p in (lazy, eager):
        p.start_request("a", [1, 2, 3])
        p.start_request("idle", [9])
    g = lazy.global_cache
    steps = [[4], [1, 2], [3], [4, 1]]
    for new in steps:
        for p in (lazy, eager):
            p.update("a", new)
            p.update("idle", new)
        eager.index_pending()
        assert lazy.propose(["a", "idle"], [4, 0]) == eager.propose(["a", "idle"], [4, 0])
        assert lazy._reqs["idle"].tree.num_nodes == 2  # root and the prompt's one token
    output = sum(steps, [])
    assert tree_contents(g.tree, g.arena, g.seqs) == dict(substring_counts([output], 8))
    lazy.stop_request("idle", finished=True)  # its whole output is cached
    assert tree_contents(g.tree, g.arena, g.seqs) == dict(substring_counts([output] * 2, 8))
    lazy.update("a", [2, 3])
    lazy.stop_request("a", finished=False)  # aborted: nothing of it stays, pending or not
    assert tree_contents(g.tree, g.arena, g.seqs) == dict(substring_counts([output], 8))
    assert not lazy._unindexed


def test_requests_drafted_in_one_step_see_each_others_new_tokens():
    """Every request drafted for is indexed before any is drafted, whatever the row order
    (found by a review: ``b``'s new output was missing from ``a``'s draft)."""
    p = SuffixProposer(4, 8, -1)
    p.start_request("a", [1])
    p.start_request("b", [2])
    p.propose(["a", "b"])
    p.update("b", [5, 6, 7, 8, 9, 5, 6, 7])
    p.update("a", [5, 6])
    assert p.propose(["a", "b"]) == [[7, 8, 9, 5], [8, 9, 5, 6]]


def test_local_weight_learns_at_every_update_whether_indexed_or_not():
    """The vote of a request's last draft is scored against the next committed token at
    ``update`` time, also when the request is aborted before it is indexed."""
    lazy, eager = SuffixProposer(4, 8, -1), SuffixProposer(4, 8, -1)
    for p in (lazy, eager):
        p.start_request("g", [0])
        p.update("g", [1, 3] * 20)
        p.stop_request("g")
        p.start_request("r", [9, 1, 2, 5, 1, 2, 5, 1])
        p.propose(["r"])
        p.update("r", [2])
    eager.index_pending()
    lazy.stop_request("r", finished=False)
    assert lazy.local_weight == eager.local_weight != 1.0


def test_abort_and_preempt_leave_no_trace():
    p = SuffixProposer(4, 8, -1)
    p.start_request("done", [1, 2])
    p.update("done", [3, 4, 5])
    p.stop_request("done", finished=True)
    for rid in ("aborted", "preempted"):
        p.start_request(rid, [9])
        p.update(rid, [6, 7, 8, 6, 7])
    before = p.state_nbytes()
    p.stop_request("aborted", finished=False)
    p.stop_request("preempted", finished=False)
    g = p.global_cache
    assert tree_contents(g.tree, g.arena, g.seqs) == dict(substring_counts([[3, 4, 5]], 8))
    assert len(g) == 1 and p.active_requests == set() and not p._reqs
    assert p.state_nbytes() < before
    p.start_request("x", [6, 7])  # nothing of the aborted outputs is drafted
    assert p.propose(["x"]) == [[]]


def test_request_id_reuse():
    p = SuffixProposer(4, 8, -1)
    p.start_request("a", [1])
    p.update("a", [5, 6, 7])
    p.stop_request("a", finished=True)
    p.start_request("a", [2])  # a new request under a finished one's id
    p.update("a", [8, 9])
    p.start_request("a", [3])  # reuse while active: the old one counts as aborted
    g = p.global_cache
    assert tree_contents(g.tree, g.arena, g.seqs) == dict(substring_counts([[5, 6, 7]], 8))
    assert p.tokens["a"].view().tolist() == [3]
    p.update("a", [5, 6])
    assert p.propose(["a"]) == [[7]]
    p.stop_request("a", finished=True)
    assert len(g) == 2


def test_unknown_and_capped_requests_get_no_draft():
    p = build_proposer("suffix", num_speculative_tokens=3)
    p.start_request("a", [1, 2, 1, 2, 1])
    assert p.propose(["a", "nope"], max_tokens=[0, 3]) == [[], []]
    p.stop_request("nope")
    with pytest.raises(KeyError):
        p.update("nope", [1])


# ------------------------------------------------------------------ config
def test_config_keys_and_errors():
    p = build_proposer("suffix", num_speculative_tokens=5, suffix_decoding_max_tree_depth=16,
                       suffix_decoding_max_cached_requests=-1,
                       suffix_decoding_max_spec_factor=2.0,
                       suffix_decoding_min_token_prob=0.05)
    assert isinstance(p, SuffixProposer)
    assert (p.max_depth, p.global_cache.max_requests, p.max_spec_factor,
            p.min_token_prob) == (16, -1, 2.0, 0.05)
    for key, bad in (("suffix_decoding_max_tree_depth", 0),
                     ("suffix_decoding_max_cached_requests", -2),
                     ("suffix_decoding_max_spec_factor", -1.0),
                     ("suffix_decoding_min_token_prob", 1.5)):
        with pytest.raises(SpecExtConfigError, match=key):
            build_proposer("suffix", **{key: bad})


def test_draft_kind_tells_own_matches_past_outputs_and_guesses_apart():
    assert draft_kind(0, 0, 0.0) == 0
    kinds = {draft_kind(m, local, share) for m in (1, 2, 3, 4, 7, 8, 40)
             for local in (0, m) for share in (0.2, 0.9)}
    assert kinds == set(range(1, 17))  # 4 lengths x own/past x sure/guess
    assert draft_kind(3, 3, 0.9) == draft_kind(2, 2, 0.9) != draft_kind(3, 1, 0.9)
    assert draft_kind(8, 8, 0.9) == draft_kind(40, 40, 0.9)
    assert draft_kind(3, 3, 0.4) - draft_kind(3, 3, 0.6) == 8
    q = SuffixProposer(4, suffix_decoding_max_spec_factor=1.0)
    q.start_request("x", [1, 2, 3, 4])
    q.update("x", [1, 2, 3, 4])
    q.stop_request("x", finished=True)  # past output "1 2 3 4"
    q.start_request("y", [9, 1, 2])  # "1 2" matches the past output only
    assert q.propose(["y"]) == [[3, 4]]
    assert q.last_kinds == [draft_kind(2, 0, 1.0)]
