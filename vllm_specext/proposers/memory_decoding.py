"""``memory_decoding``: drafts from a frequency trie of past outputs shared across
requests plus the request's own context (PIA "Lookahead", Zhao et al., KDD 2024;
github alipay/PainlessInferenceAcceleration; Huawei MindIE ``memory_decoding``).

Every step two candidate drafts are built from the context's longest matching suffix
(at most ``max_query_length`` tokens):

* ``copy``: the continuation of an earlier occurrence in the request's own prompt +
  output (PIA's per-request "input" branches; prompt lookup): its first occurrence at
  or after the *copy pointer*, where the previous copy's source ended when it matched
  the committed tokens (a summary or an answer walks through its source in order;
  LLMA, Yang et al. 2023, copies the same way), else its most recent occurrence;
* ``trie``: the highest-count path below the suffix in the shared
  :class:`~vllm_specext.proposers.memory_trie.FrequencyTrie` of finished outputs (PIA's
  "output" frequencies), re-matched on context + draft when a branch ends. When the
  committed tokens followed the previous trie draft, the new suffix's node is that
  draft's node (or its child for the bonus token), a context longer than
  ``max_query_length`` found without a lookup.

The proposer keeps, per (candidate kind, match length), a decayed mean of how many
tokens of that candidate matched what was committed next (it sees every candidate
against the committed tokens, so losers are scored too), and drafts the candidate
with the best mean. ``prompt_first`` sets the prior before statistics exist and breaks
ties: the request's own context first (PIA's mix mode) or the shared trie first.

Where neither candidate drafts, the rest of the request's last draft past the token the
target model replaced is drafted (``rejected_tail``;
:mod:`~vllm_specext.proposers.rejected_tail`, applied in the step kernel).

A draft's kind for adaptive speculation (``last_kinds``) is its candidate and match
length (:func:`draft_kind`), or ``TAIL_KIND``.

``dynamic_algo`` (MindIE's name): each (kind, match length) also learns the
probability that drafted token i is accepted given tokens < i were; the draft stops
where the probability of reaching the next token falls below ``_DYN_MIN_REACH``.

A request's tokens are counted in the trie when it finishes (its output and the
prompt's last ``branch_length - 1`` tokens, so the trie learns how outputs begin), not
per step: PIA's ``stream_put`` counts every step, which costs ``branch_length`` trie
updates per token on the decode path; here that work happens once, in
``stop_request``. Aborted or preempted requests are not counted.

All per-step work is one numba call (:func:`_step`) on two arrays: the trie arena
(its extra words hold the statistics) and the request's state array, which also holds
the request's tokens (the :class:`TokenBuffer` in ``self.tokens`` is a view of it).
"""
from __future__ import annotations

import heapq

import numba as nb
import numpy as np

from vllm_specext.proposers.base import Proposer, TokenBuffer
from vllm_specext.proposers.memory_trie import HEADER as ARENA_HEADER
from vllm_specext.proposers.memory_trie import (BEST, CHILD, CNT, NODE_FIELDS, SIB, TOK,
                                                FrequencyTrie, find_child,
                                                load_relayout_kernels, match, node_base)
from vllm_specext.proposers.rejected_tail import TAIL_KIND, move_tail

#: candidate kinds
COPY, TRIE = 0, 1
N_KINDS = 2
#: statistics are int32 fixed point with this many fraction bits, decayed by
#: 1 - 2**-_DECAY_SHIFT per observation (half-life about 2,800 observations)
_FP = 10
_DECAY_SHIFT = 12
#: dynamic_algo: stop drafting once P(all drafted tokens accepted) would drop below
_DYN_MIN_REACH = 0.03
#: longest backwards walk of the occurrence chain when looking for the copy pointer
_MAX_CHAIN = 64
#: outcomes of a request's previous draft, the context of the position statistics:
#: none accepted (or no draft), some, all
N_OUTCOMES = 3
#: per candidate: kind, order (statistics key), cap, source (context position or trie
#: node), n-gram length of the trie node
_CINFO = 5


@nb.njit(cache=True, inline="always")
def draft_kind(kind: int, order: int) -> int:
    """Draft kind (:attr:`~vllm_specext.proposers.base.Proposer.last_kinds`) of a draft
    from candidate ``kind`` (:data:`COPY` or :data:`TRIE`) whose context suffix matched
    ``order`` tokens (its statistics key, 1..``max_query_length``): a copy 1..4 by match
    length (``min(order, 4)``), a trie path 5..7 (``min(4 + order, 7)``). The adaptive
    controller keeps acceptance per kind; on the e2e workloads' real outputs (scratch
    replay, batch 1) these kinds raised modelled tok/s by 0.5-2.2% over one kind, with
    8-33% fewer draft tokens. Computed in the step kernel (the state's ``H_KIND``): in
    Python it cost about 0.2 µs per request per step."""
    return min(order, 4) if kind == COPY else min(4 + order, 7)


# Request state: int32 array, header fields then regions (offsets from _layout).
(H_LOCAL, H_PTR, H_LAST, H_NCAND, H_CHOSEN, H_NOUT, H_TS, H_PC, H_K, H_ORDERS,
 H_PROMPT_FIRST, H_DYNAMIC, H_OUTCOME, H_TEPOCH, H_KIND, H_TAIL) = range(16)
_HEADER = 16
_TRIE_EPOCH = 4  # arena word counting the trie's renumberings (memory_trie layout)


@nb.njit(cache=True, inline="always")
def _layout(rs):
    """Offsets of the regions of a request state array: draft out (K), candidate
    heads (2 x 5), the tokens (PC), the n-gram table (orders x TS) and the occurrence
    chains (PC x orders: a position's links share a cache line)."""
    out = _HEADER
    cinfo = out + rs[H_K]
    toks = cinfo + N_KINDS * _CINFO
    tab = toks + rs[H_PC]
    prev = tab + rs[H_ORDERS] * rs[H_TS]
    return out, cinfo, toks, tab, prev


def _state_size(k: int, orders: int, ts: int, pc: int) -> int:
    return _HEADER + k + N_KINDS * _CINFO + pc + orders * (ts + pc)


def _stats_size(k: int, orders: int) -> int:
    """int32 words of the statistics: per (kind, match length 0..orders) the decayed
    sum of matched tokens, the decayed count, then per outcome of the request's
    previous draft and draft position the decayed counts of "reached" and "accepted"."""
    return N_KINDS * (orders + 1) * (2 + 2 * N_OUTCOMES * k)


@nb.njit(cache=True, inline="always")
def _decay_add(x, v):
    """One decayed observation of ``v`` (fixed point) added to ``x``."""
    return x - (x >> _DECAY_SHIFT) + v


@nb.njit(cache=True, inline="always")
def _mix(h, tok):
    h = (h ^ (np.uint64(tok) + np.uint64(1))) * np.uint64(0x9E3779B97F4A7C15)
    return h ^ (h >> np.uint64(29))


# Kernels index ``rs`` and the arena directly (no array views: a view costs a
# reference-count update, several times a probe's own work); the request's tokens are
# ``rs[toks:toks + ctx_len]``.
@nb.njit(cache=True)
def _index_local(rs, toks, start, end):
    """Record positions j in [start, end) as the latest continuation of the n-grams
    ``ctx[j-n:j]`` (n = 1..orders), chaining the previous occupant of the slot."""
    _, _, _, tab, prev = _layout(rs)
    orders, ts = rs[H_ORDERS], rs[H_TS]
    mask = np.uint64(ts - 1)
    for j in range(max(start, 1), end):
        h = np.uint64(0)
        for n in range(1, min(orders, j) + 1):
            h = _mix(h, rs[toks + j - n])
            s = tab + (n - 1) * ts + np.int64(h & mask)
            rs[prev + j * orders + n - 1] = rs[s]
            rs[s] = j


@nb.njit(cache=True, inline="always")
def _same(rs, toks, a, b, n):
    """Whether the n tokens before positions a and b agree."""
    for i in range(1, n + 1):
        if rs[toks + a - i] != rs[toks + b - i]:
            return False
    return True


@nb.njit(cache=True)
def _local_match(rs, ctx_len):
    """Longest suffix (<= orders tokens) of the first ``ctx_len`` tokens seen before:
    returns ``(n, j_recent, j_next)``, continuation starts of its most recent
    occurrence and of its earliest occurrence at/after the copy pointer (= j_recent if
    none); n = 0 if no suffix occurred."""
    _, _, toks, tab, prev = _layout(rs)
    orders, ts = rs[H_ORDERS], rs[H_TS]
    mask = np.uint64(ts - 1)
    top = min(orders, ctx_len - 1)
    for n in range(top, 0, -1):
        h = np.uint64(0)
        for i in range(1, n + 1):
            h = _mix(h, rs[toks + ctx_len - i])
        j = rs[tab + (n - 1) * ts + np.int64(h & mask)]
        if j < n or j >= ctx_len or not _same(rs, toks, j, ctx_len, n):
            continue
        ptr = rs[H_PTR]
        jn = j
        for _ in range(_MAX_CHAIN):
            p = rs[prev + jn * orders + n - 1]
            if p < max(ptr, n) or p >= jn or not _same(rs, toks, p, ctx_len, n):
                break
            jn = p
        return n, j, jn
    return 0, -1, -1


@nb.njit(cache=True, inline="always")
def _copy_next(src, idx, ctx_len):
    """The context position of the copy's next token after position ``idx``: the copy
    from ``src`` (< ctx_len) reads V[src:] with V = context + copy, i.e. it is
    periodic once it runs into its own start (no division: a modulo costs more than
    the whole copy)."""
    idx += 1
    return src if idx == ctx_len else idx


@nb.njit(cache=True)
def _trie_draft(arena, rs, toks, ctx_len, orders, g, cap, out):
    """Greedy highest-count walk below node ``g`` into ``rs[out:out + cap]``,
    re-matched on context + draft when a branch ends. Returns the length."""
    nb_ = node_base(arena)
    n = 0
    while g >= 0 and n < cap:
        c = arena[nb_ + NODE_FIELDS * g + BEST]
        while c >= 0 and n < cap:
            rs[out + n] = arena[nb_ + NODE_FIELDS * c + TOK]
            n += 1
            c = arena[nb_ + NODE_FIELDS * c + BEST]
        if n < cap:
            g, _ = match(arena, rs, toks, ctx_len, rs, out, n, orders)
    return n


@nb.njit(cache=True)
def _trie_score(arena, rs, toks, last, m_new, orders, g, q, cap):
    """Replay :func:`_trie_draft` from node ``g`` (n-gram length ``q``) drafted at
    context length ``last`` against the ``m_new`` tokens committed since, stopping at
    the first difference. Returns ``(a, node, length)``: the matched length and the
    trie node of the new context's suffix it leads to (-1 if none with
    continuations)."""
    nb_ = node_base(arena)
    a = 0
    lim = min(m_new, cap)
    while a < lim:
        c = arena[nb_ + NODE_FIELDS * g + BEST]
        if c < 0:
            g, q = match(arena, rs, toks, last + a, rs, toks, 0, orders)
            if g < 0:
                return a, -1, 0
            c = arena[nb_ + NODE_FIELDS * g + BEST]
        if arena[nb_ + NODE_FIELDS * c + TOK] != rs[toks + last + a]:
            break
        g = c
        q += 1
        a += 1
    if a < m_new - 1:
        return a, -1, 0
    if a == m_new - 1:
        g = find_child(arena, g, rs[toks + last + a])
        q += 1
    if g < 0 or arena[nb_ + NODE_FIELDS * g + BEST] < 0:
        return a, -1, 0
    return a, g, q


@nb.njit(cache=True, inline="always")
def _set_info(rs, at, kind, order, cap, src, q):
    rs[at] = kind
    rs[at + 1] = order
    rs[at + 2] = cap
    rs[at + 3] = src
    rs[at + 4] = q


@nb.njit(cache=True)
def _step(arena, rs, ctx_len, cap):
    """One proposer step for one request whose first ``ctx_len`` tokens are committed:
    score the previous candidates against the tokens committed since, index the new
    tokens in the request's context index, then draft at most ``cap`` tokens into the
    state's out region. Statistics (:func:`_stats_size`) are the arena's extra words
    (``arena[ARENA_HEADER:]``); ``prompt_first`` and ``dynamic`` are read from the state
    header.

    Candidates are kept as heads (kind, source, cap); only the chosen one is drafted,
    and each is replayed against the committed tokens as far as they agree.

    Returns the draft length (>= 0), or -1: the state array is too small for
    ``ctx_len`` tokens.
    """
    if ctx_len > rs[H_PC]:
        return -1
    out, cinfo, toks, _, _ = _layout(rs)
    k = rs[H_K]
    orders = rs[H_ORDERS]
    width = 2 + 2 * N_OUTCOMES * k
    one = np.int32(1 << _FP)
    last = rs[H_LAST]
    g0, q0 = -1, 0  # trie node of the new context's suffix, followed from the last draft
    nout = 0  # the last draft's length, still in the out region (rejected_tail)
    if last >= 0 and ctx_len > last:
        m_new = ctx_len - last
        nout = rs[H_NOUT]
        chosen = rs[H_CHOSEN]
        for c in range(rs[H_NCAND]):
            at = cinfo + _CINFO * c
            kind, order, ccap, src = rs[at], rs[at + 1], rs[at + 2], rs[at + 3]
            if kind == TRIE:
                if rs[H_TEPOCH] != arena[_TRIE_EPOCH]:  # renumbered: its node is stale
                    continue
                a, g0, q0 = _trie_score(arena, rs, toks, last, m_new, orders, src,
                                        rs[at + 4], ccap)
            else:
                a = 0
                idx = src
                while a < ccap and a < m_new and rs[toks + idx] == rs[toks + last + a]:
                    a += 1
                    idx = _copy_next(src, idx, last)
                if a > 0:  # the copy matched: its source is where the context goes on
                    rs[H_PTR] = src + m_new
            st = ARENA_HEADER + (kind * (orders + 1) + order) * width
            arena[st] = _decay_add(arena[st], a * one)
            arena[st + 1] = _decay_add(arena[st + 1], one)
            if c == chosen and rs[H_DYNAMIC]:
                drafted = rs[H_NOUT]
                base = st + 2 + 2 * k * rs[H_OUTCOME]
                for i in range(min(drafted, a + 1)):
                    arena[base + i] = _decay_add(arena[base + i], one)
                    if i < a:
                        arena[base + k + i] = _decay_add(arena[base + k + i], one)
                rs[H_OUTCOME] = 0 if a == 0 or drafted == 0 else (2 if a >= drafted else 1)
        rs[H_NCAND] = 0
    if rs[H_LOCAL] < ctx_len:
        _index_local(rs, toks, rs[H_LOCAL], ctx_len)
        rs[H_LOCAL] = ctx_len
    rs[H_LAST] = ctx_len
    rs[H_NOUT] = 0
    rs[H_KIND] = 0
    rs[H_TEPOCH] = arena[_TRIE_EPOCH]
    if cap <= 0:
        return 0
    # ---- candidate heads
    nc = 0
    n, _, j = _local_match(rs, ctx_len)
    if n > 0:
        _set_info(rs, cinfo, COPY, n, cap, j, 0)
        nc = 1
    if g0 < 0:
        g0, q0 = match(arena, rs, toks, ctx_len, rs, toks, 0, orders)
    if g0 >= 0:
        _set_info(rs, cinfo + _CINFO * nc, TRIE, min(q0, orders), cap, g0, q0)
        nc += 1
    rs[H_NCAND] = nc
    if nc == 0:  # nothing found: the last draft's rejected tail, if it left one
        nd = min(move_tail(rs, out, nout, rs, toks + last, toks + ctx_len, rs[H_TAIL]), cap)
        rs[H_NOUT] = nd
        rs[H_KIND] = TAIL_KIND if nd > 0 else 0
        return nd
    # ---- choice: best decayed mean of matched tokens, prior by prompt_first
    prompt_first = rs[H_PROMPT_FIRST] != 0
    best = -1
    best_score = -1.0
    for c in range(nc):
        kind, order = rs[cinfo + _CINFO * c], rs[cinfo + _CINFO * c + 1]
        preferred = (kind != TRIE) == prompt_first
        st = ARENA_HEADER + (kind * (orders + 1) + order) * width
        score = ((arena[st] / one + (1.0 if preferred else 0.5))
                 / (arena[st + 1] / one + 1.0))
        score += 1e-6 * order + (1e-7 if preferred else 0.0)  # ties: longer, preferred
        if score > best_score:
            best, best_score = c, score
    rs[H_CHOSEN] = best
    at = cinfo + _CINFO * best
    nd = cap
    if rs[H_DYNAMIC]:
        base = (ARENA_HEADER + (rs[at] * (orders + 1) + rs[at + 1]) * width + 2
                + 2 * k * rs[H_OUTCOME])
        reach = 1.0
        for i in range(cap):
            reach *= (arena[base + k + i] / one + 1.0) / (arena[base + i] / one + 1.25)
            if reach < _DYN_MIN_REACH:
                nd = i + 1
                break
    if rs[at] == TRIE:
        nd = _trie_draft(arena, rs, toks, ctx_len, orders, g0, nd, out)
    else:
        src = rs[at + 3]
        idx = src
        for i in range(nd):
            rs[out + i] = rs[toks + idx]
            idx = _copy_next(src, idx, ctx_len)
    rs[H_NOUT] = nd
    rs[H_KIND] = draft_kind(rs[at], rs[at + 1]) if nd > 0 else 0
    return nd


@nb.njit(cache=True, inline="always")
def _tree_child(tok, par, n, p, t):
    """Index of the child of tree node p (-1 = root) with token t among the first n
    nodes, or -1."""
    for u in range(n):
        if par[u] == p and tok[u] == t:
            return u
    return -1


@nb.njit(cache=True)
def _tree(arena, rs, ctx_len, budget, max_depth, tok, par):
    """Token tree: the candidate drafts (chosen first) merged on shared prefixes, the
    continuations of the matched suffix's occurrences in the request's context, most
    recent first (up to a quarter of the nodes left), then the most probable other trie
    continuations, best first (probability = product of child/parent count ratios).
    Fills ``tok[:n]``, ``par[:n]`` (-1 = child of the last context token); returns n.
    The candidate heads must be fresh (``_step`` just ran with cap ``max_depth``)."""
    nb_ = node_base(arena)
    out, cinfo, toks, _, prev = _layout(rs)
    orders = rs[H_ORDERS]
    nc = rs[H_NCAND]
    depth = np.zeros(budget, dtype=np.int64)
    trie_node = np.full(budget, -1, dtype=np.int64)
    draft = np.empty(max_depth, dtype=np.int32)
    n = 0
    for r in range(nc):
        c = rs[H_CHOSEN] if r == 0 else (r - 1 if r - 1 < rs[H_CHOSEN] else r)
        at = cinfo + _CINFO * c
        if rs[at] == TRIE:  # drafted into the out region, then copied
            nd = _trie_draft(arena, rs, toks, ctx_len, orders, rs[at + 3], max_depth, out)
            draft[:nd] = rs[out:out + nd]
        else:
            nd = max_depth
            src = rs[at + 3]
            idx = src
            for i in range(nd):
                draft[i] = rs[toks + idx]
                idx = _copy_next(src, idx, ctx_len)
        p = -1
        for i in range(nd):
            f = _tree_child(tok, par, n, p, draft[i])
            if f < 0:
                if n >= budget:
                    break
                tok[n] = draft[i]
                par[n] = p
                depth[n] = i + 1
                f = n
                n += 1
            p = f
    # the occurrences of the matched suffix in the request's context, most recent
    # first, up to a quarter of the nodes left
    m, j, _ = _local_match(rs, ctx_len)
    stop = n + (budget - n) // 4
    for it in range(_MAX_CHAIN if m > 0 else 0):
        if it:
            j = rs[prev + j * orders + m - 1]
        if j < m or n >= stop or not _same(rs, toks, j, ctx_len, m):
            break
        p = -1
        for i in range(min(max_depth, ctx_len - j)):
            t = rs[toks + j + i]
            f = _tree_child(tok, par, n, p, t)
            if f < 0:
                if n >= stop:
                    break
                tok[n] = t
                par[n] = p
                depth[n] = i + 1
                f = n
                n += 1
            p = f
    # trie node of each tree node's context (ctx + path), root first
    path = np.empty(max_depth, dtype=np.int32)
    heap = [(0.0, np.int64(0), np.int64(0))]
    heap.pop()
    g_root = -1
    for u in range(-1, n):
        g = -1
        if u >= 0:
            gp = g_root if par[u] < 0 else trie_node[par[u]]
            if gp >= 0:
                g = find_child(arena, gp, tok[u])
        if g < 0 or arena[nb_ + NODE_FIELDS * g + BEST] < 0:
            d = 0 if u < 0 else depth[u]
            v = u
            for i in range(d - 1, -1, -1):
                path[i] = tok[v]
                v = par[v]
            g, _ = match(arena, rs, toks, ctx_len, path, 0, d, orders)
        if u >= 0:
            trie_node[u] = g
        else:
            g_root = g
        if g < 0:
            continue
        gcnt = max(arena[nb_ + NODE_FIELDS * g + CNT], 1)
        c = arena[nb_ + NODE_FIELDS * g + CHILD]
        while c >= 0:
            ct = arena[nb_ + NODE_FIELDS * c + TOK]
            dup = False
            for w in range(n):
                if par[w] == u and tok[w] == ct:
                    dup = True
                    break
            if not dup:
                heapq.heappush(heap, (-arena[nb_ + NODE_FIELDS * c + CNT] / gcnt,
                                      np.int64(u), np.int64(c)))
            c = arena[nb_ + NODE_FIELDS * c + SIB]
    while n < budget and len(heap) > 0:
        s, p, c = heapq.heappop(heap)
        d = 1 if p < 0 else depth[p] + 1
        if d > max_depth:
            continue
        tok[n] = arena[nb_ + NODE_FIELDS * c + TOK]
        par[n] = p
        depth[n] = d
        ccnt = max(arena[nb_ + NODE_FIELDS * c + CNT], 1)
        cc = arena[nb_ + NODE_FIELDS * c + CHILD]
        while cc >= 0:
            heapq.heappush(heap, (s * arena[nb_ + NODE_FIELDS * cc + CNT] / ccnt,
                                  np.int64(n), np.int64(cc)))
            cc = arena[nb_ + NODE_FIELDS * cc + SIB]
        n += 1
    return n


_STEP_ENTRY = []


def _step_entry():
    """:func:`_step`'s native entry point for its one signature (int32 1-D C arrays,
    int64 scalars), compiled or loaded on first use. Calling it skips numba's per-call
    type dispatch (about 0.2 µs); every call site passes exactly these types."""
    if not _STEP_ENTRY:
        i32 = nb.types.Array(nb.int32, 1, "C")
        _STEP_ENTRY.append(_step.compile((i32, i32, nb.int64, nb.int64)))
    return _STEP_ENTRY[0]


class _Tokens(TokenBuffer):
    """The request's token history as a view of its state array (:func:`_layout`), so
    that a step passes one array per request. Appending past the view's capacity
    moves the tokens to a larger private array (:class:`TokenBuffer`'s growth); the
    proposer then grows the state array and re-attaches the view."""

    __slots__ = ()

    @classmethod
    def over(cls, region: np.ndarray, length: int) -> "_Tokens":
        """A buffer whose storage is ``region`` (int32, capacity ``len(region)``) and
        whose first ``length`` tokens are committed."""
        t = cls.__new__(cls)
        t._data = region
        t._len = length
        t._mv = memoryview(region)
        return t


class MemoryDecodingProposer(Proposer):
    """Memory-decoding proposer (see module doc).

    Args:
        num_speculative_tokens: k, draft slots per request per step (>= 1).
        decoding_length: most draft tokens per step (MindIE, 1..16); the cap is
            ``min(k, decoding_length)``.
        dynamic_algo: per-request draft length from acceptance history (module doc).
        branch_length: longest n-gram counted in the shared trie (its depth).
        max_query_length: longest context suffix used as a lookup key (also the longest
            n-gram of the per-request index).
        max_nodes: node cap of the shared trie (40 bytes per node).
        eviction: ``"frequency"`` or ``"age"`` (see :class:`FrequencyTrie`).
        prompt_first: the request's own prompt/output outranks the shared trie before
            statistics exist and on ties.
        insert_prompt: count each finished request's whole prompt in the shared trie,
            not only its last ``branch_length - 1`` tokens.
        rejected_tail: where neither candidate drafts, draft up to this many tokens of
            the last draft's tail (:mod:`~vllm_specext.proposers.rejected_tail`, applied
            in :func:`_step`; 0: off).

    Memory: the trie (<= ``40 * max_nodes`` bytes, 41.9 MB at the default cap) plus
    per active request one state array of about ``4 * (2 + 6 * max_query_length)``
    bytes per context token (tokens, n-gram table and chains for twice the context).
    """

    method = "memory_decoding"

    def __init__(self, num_speculative_tokens: int, decoding_length: int = 16,
                 dynamic_algo: bool = False, branch_length: int = 16,
                 max_query_length: int = 4, max_nodes: int = 1 << 20,
                 eviction: str = "frequency", prompt_first: bool = True,
                 insert_prompt: bool = False, rejected_tail: int = 2):
        super().__init__(num_speculative_tokens)
        if not 1 <= max_query_length <= 64:
            raise ValueError("max_query_length must be in [1, 64]")
        self.decoding_length = int(decoding_length)
        self.dynamic_algo = bool(dynamic_algo)
        self.max_query_length = int(max_query_length)
        self.prompt_first = bool(prompt_first)
        self.insert_prompt = bool(insert_prompt)
        self.rejected_tail = max(0, int(rejected_tail))
        self._k = max(self.num_speculative_tokens, self.decoding_length)
        self._cap = min(self.num_speculative_tokens, self.decoding_length)
        self.trie = FrequencyTrie(branch_length, max_nodes, eviction,
                                  extra_words=_stats_size(self._k, self.max_query_length))
        self.state: dict[str, np.ndarray] = {}
        #: per request (state, memoryview of its draft region, token buffer, memoryview
        #: of its header and candidate heads)
        self._hot: dict[str, tuple] = {}
        self._step = _step_entry()

    # ------------------------------------------------------------ state arrays
    def _attach(self, req_id: str, old: np.ndarray | None = None) -> None:
        """(Re)build the request's state array for twice its context (chains for 2x,
        the n-gram table a power of two >= 2x that) and point its token buffer at it;
        ``old``: the header and candidates carry over, the n-gram table is rebuilt on
        the next step."""
        buf = self.tokens[req_id]
        length = len(buf)
        pc = max(64, 2 * length)
        ts = 1 << (2 * pc - 1).bit_length()
        rs = np.zeros(_state_size(self._k, self.max_query_length, ts, pc), dtype=np.int32)
        toks = _HEADER + self._k + N_KINDS * _CINFO
        if old is None:
            rs[H_LAST] = -1
        else:
            rs[:toks] = old[:toks]
            rs[H_LOCAL] = 0
        rs[H_TS], rs[H_PC] = ts, pc
        rs[H_PROMPT_FIRST], rs[H_DYNAMIC] = self.prompt_first, self.dynamic_algo
        rs[H_TAIL] = self.rejected_tail
        rs[H_K], rs[H_ORDERS] = self._k, self.max_query_length
        rs[toks:toks + length] = buf.storage[:length]
        buf = _Tokens.over(rs[toks:toks + pc], length)
        self.tokens[req_id] = buf
        self.state[req_id] = rs
        self._hot[req_id] = (rs, memoryview(rs)[_HEADER:_HEADER + self._k], buf,
                             memoryview(rs)[:toks])

    def _run(self, req_id: str, cap: int) -> int:
        """One step, growing the state array first if the context outgrew it."""
        n = self._step(self.trie.arena, self.state[req_id], len(self.tokens[req_id]), cap)
        if n < 0:
            self._attach(req_id, self.state[req_id])
            n = self._step(self.trie.arena, self.state[req_id], len(self.tokens[req_id]),
                           cap)
        return n

    # ------------------------------------------------------------ life cycle
    def _on_start(self, req_id: str) -> None:
        self._attach(req_id)

    def update(self, req_id: str, new_token_ids) -> None:
        """Append committed tokens (see :meth:`Proposer.update`); the work they cause
        (indexing, scoring the previous draft) happens in the next :meth:`propose`.

        Raises:
            KeyError: ``req_id`` is not active.
        """
        self.tokens[req_id].extend(new_token_ids)

    def warm_up_kernels(self) -> None:
        """Load the shared trie's growth kernels
        (:func:`~vllm_specext.proposers.memory_trie.load_relayout_kernels`)."""
        load_relayout_kernels()

    def _on_stop(self, req_id: str, finished: bool) -> None:
        """Score the last draft; count a finished request in the shared trie (its
        output after the prompt's last ``branch_length - 1`` tokens, or its whole
        context with ``insert_prompt``)."""
        self._run(req_id, 0)
        del self.state[req_id], self._hot[req_id]
        if finished:
            buf = self.tokens[req_id]
            start = 0 if self.insert_prompt else max(
                0, self.prompt_len[req_id] - self.trie.branch_length + 1)
            self.trie.insert(buf.storage[start:len(buf)])

    # ------------------------------------------------------------ drafting
    def propose(self, req_ids, max_tokens=None) -> list[list[int]]:
        """Draft up to ``min(k, decoding_length, max_tokens[i])`` tokens per request
        (see :meth:`Proposer.propose`): one native call per request.

        Sets :attr:`last_kinds`: per row, :func:`draft_kind` of the candidate drafted
        (copy or trie, and its match length), ``TAIL_KIND`` for a rejected tail, 0 for no
        draft."""
        step, arena, cap, hot = self._step, self.trie.arena, self._cap, self._hot
        out = []
        kinds = []
        for rid in req_ids:
            h = hot.get(rid)
            if max_tokens is not None:
                cap = min(self._cap, int(max_tokens[len(out)]))
            if h is None or cap <= 0:
                out.append([])
                kinds.append(0)
                continue
            rs, draft, buf, head = h
            n = step(arena, rs, buf._len, cap)
            if n < 0:
                n = self._run(rid, cap)
                _, draft, _, head = hot[rid]
            out.append(draft.tolist()[:n])  # cheaper than slicing the memoryview
            kinds.append(head[H_KIND])
        self.last_kinds = kinds
        return out

    def _propose_one(self, req_id: str, max_tokens: int) -> list[int]:
        return self.propose([req_id], [max_tokens])[0]

    def propose_tree(self, req_id: str, budget: int = 64,
                     max_depth: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Multi-branch draft for offline replay (vLLM has no tree verification).

        Args:
            req_id: an active request.
            budget: most tree nodes (>= 1).
            max_depth: longest branch, <= ``max(k, decoding_length)`` (default: the
                single-branch cap ``min(k, decoding_length)``).

        Returns:
            ``(tokens, parents)``, int32 ``(n,)`` each, n <= budget; ``parents[i] < i``
            is the index of node i's parent, -1 for children of the last context token.
            The single-branch draft is the chain of nodes 0, 1, ... (unless it was the
            rejected tail, which the tree leaves out).

        Raises:
            KeyError: ``req_id`` is not active.
        """
        depth = self._cap if max_depth is None else min(int(max_depth), self._k)
        self._run(req_id, depth)
        tok = np.empty(budget, dtype=np.int32)
        par = np.empty(budget, dtype=np.int32)
        rs = self.state[req_id]
        n = _tree(self.trie.arena, rs, len(self.tokens[req_id]), int(budget), depth, tok, par)
        rs[H_NOUT] = 0  # _tree drafted candidates into the out region: no tail from it
        return tok[:n], par[:n]

    def state_nbytes(self) -> int:
        """The trie (with the statistics) and the request state arrays (with the
        tokens), in bytes."""
        return self.trie.nbytes + sum(rs.nbytes for rs in self.state.values())
