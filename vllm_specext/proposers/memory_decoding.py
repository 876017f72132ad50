"""``memory_decoding``: drafts from a frequency trie of past outputs shared across
requests plus the request's own context (PIA "Lookahead", Zhao et al., KDD 2024;
github alipay/PainlessInferenceAcceleration; Huawei MindIE ``memory_decoding``).

Every step three candidate drafts are built from the context's longest matching suffix
(at most ``max_query_length`` tokens):

* ``recent``: the continuation of its most recent earlier occurrence in the request's
  own prompt + output (PIA's per-request "input" branches; prompt lookup);
* ``next``: the continuation of its first occurrence at or after the *copy pointer*,
  where the context copy that best matched the last committed tokens ended (a summary
  or an answer walks through its source in order; LLMA, Yang et al. 2023, copies the
  same way);
* ``trie``: the highest-count path below the suffix in the shared
  :class:`~vllm_specext.proposers.memory_trie.FrequencyTrie` of all outputs (PIA's
  "output" frequencies), re-matched on context + draft when a branch ends.

The proposer keeps, per (candidate kind, match length), a decayed mean of how many
tokens of that candidate matched what was committed next (it sees every candidate
against the committed tokens, so losers are scored too), and drafts the candidate
with the best mean. ``prompt_first`` sets the prior before statistics exist and breaks
ties: the request's own context first (PIA's mix mode) or the shared trie first.

``dynamic_algo`` (MindIE's name): each (kind, match length) also learns the
probability that drafted token i is accepted given tokens < i were; the draft stops
where the probability of reaching the next token falls below ``_DYN_MIN_REACH``.

Committed tokens are counted in the trie as they arrive (lazily, at the next
``propose`` or at ``stop_request``), like PIA's ``stream_put``, so concurrent requests
share them; tokens of aborted or preempted requests stay counted.

All per-step work is one numba call (:func:`_step`) over flat arrays: the trie arena,
the request's state array (layout below), its token buffer and the statistics.
"""
from __future__ import annotations

import heapq

import numba as nb
import numpy as np

from vllm_specext.proposers.base import Proposer
from vllm_specext.proposers.memory_trie import (BEST, CHILD, CNT, SIB, TOK, FrequencyTrie,
                                                extend_stream, find_child, htab_of, match,
                                                nodes_of, remap_window)

#: candidate kinds
RECENT, NEXT, TRIE = 0, 1, 2
N_KINDS = 3
#: per-observation decay of the statistics (half-life about 2,800 steps)
_DECAY = 1.0 - 1.0 / 4096
#: dynamic_algo: stop drafting once P(all drafted tokens accepted) would drop below
_DYN_MIN_REACH = 0.03
#: longest backwards walk of the occurrence chain when looking for the copy pointer
_MAX_CHAIN = 64

# Request state: int32 array, header fields then regions (offsets from _layout).
(H_LOCAL, H_TRIE, H_STAMP, H_PTR, H_LAST, H_NCAND, H_CHOSEN, H_NOUT, H_TS, H_PC,
 H_DEPTH, H_K, H_ORDERS, H_PROMPT_FIRST, H_DYNAMIC, H_OUTCOME) = range(16)
_HEADER = 16
#: outcomes of a request's previous draft, the context of the position statistics:
#: none accepted (or no draft), some, all
N_OUTCOMES = 3
_CINFO = 4  # per candidate: kind, order, length, source position


@nb.njit(cache=True, inline="always")
def _layout(rs):
    """Offsets of the regions of a request state array: draft out (K), open trie
    windows (depth), candidates (3 x K), candidate info (3 x 4), the n-gram table
    (orders x TS) and the occurrence chains (orders x PC)."""
    k = rs[H_K]
    out = _HEADER
    win = out + k
    cand = win + rs[H_DEPTH]
    cinfo = cand + N_KINDS * k
    tab = cinfo + N_KINDS * _CINFO
    prev = tab + rs[H_ORDERS] * rs[H_TS]
    return out, win, cand, cinfo, tab, prev


def _state_size(k: int, depth: int, orders: int, ts: int, pc: int) -> int:
    return _HEADER + k + depth + N_KINDS * (k + _CINFO) + orders * (ts + pc)


@nb.njit(cache=True, inline="always")
def _mix(h, tok):
    h = (h ^ (np.uint64(tok) + np.uint64(1))) * np.uint64(0x9E3779B97F4A7C15)
    return h ^ (h >> np.uint64(29))


@nb.njit(cache=True)
def _index_local(rs, ctx, start, end):
    """Record positions j in [start, end) as the latest continuation of the n-grams
    ``ctx[j-n:j]`` (n = 1..orders), chaining the previous occupant of the slot."""
    _, _, _, _, tab, prev = _layout(rs)
    orders, ts, pc = rs[H_ORDERS], rs[H_TS], rs[H_PC]
    mask = np.uint64(ts - 1)
    for j in range(max(start, 1), end):
        h = np.uint64(0)
        for n in range(1, min(orders, j) + 1):
            h = _mix(h, ctx[j - n])
            s = tab + (n - 1) * ts + np.int64(h & mask)
            rs[prev + (n - 1) * pc + j] = rs[s]
            rs[s] = j


@nb.njit(cache=True, inline="always")
def _same(ctx, a, b, n):
    for i in range(1, n + 1):
        if ctx[a - i] != ctx[b - i]:
            return False
    return True


@nb.njit(cache=True)
def _local_match(rs, ctx, ctx_len):
    """Longest suffix (<= orders tokens) of ``ctx[:ctx_len]`` seen before: returns
    ``(n, j_recent, j_next)``, continuation starts of its most recent occurrence and of
    its earliest occurrence at/after the copy pointer (= j_recent if none); n = 0 if no
    suffix occurred."""
    _, _, _, _, tab, prev = _layout(rs)
    orders, ts, pc = rs[H_ORDERS], rs[H_TS], rs[H_PC]
    mask = np.uint64(ts - 1)
    top = min(orders, ctx_len - 1)
    for n in range(top, 0, -1):
        h = np.uint64(0)
        for i in range(1, n + 1):
            h = _mix(h, ctx[ctx_len - i])
        j = rs[tab + (n - 1) * ts + np.int64(h & mask)]
        if j < n or j >= ctx_len or not _same(ctx, j, ctx_len, n):
            continue
        ptr = rs[H_PTR]
        jn = j
        for _ in range(_MAX_CHAIN):
            p = rs[prev + (n - 1) * pc + jn]
            if p < max(ptr, n) or p >= jn or not _same(ctx, p, ctx_len, n):
                break
            jn = p
        return n, j, jn
    return 0, -1, -1


@nb.njit(cache=True)
def _copy(ctx, ctx_len, src, cap, out):
    """Periodic copy: ``out[i] = V[src + i]`` where V = ctx[:ctx_len] + out."""
    for i in range(cap):
        t = src + i
        out[i] = ctx[t] if t < ctx_len else out[t - ctx_len]


@nb.njit(cache=True)
def _trie_draft(nodes, htab, ctx, ctx_len, orders, cap, out):
    """Greedy highest-count walk below the longest matching suffix, re-matched on
    context + draft when a branch ends. Returns ``(length, first match length)``."""
    n = 0
    q0 = 0
    while n < cap:
        g, q = match(nodes, htab, ctx, ctx_len, out, n, orders)
        if g < 0:
            break
        if n == 0:
            q0 = q
        c = nodes[g, BEST]
        while c >= 0 and n < cap:
            out[n] = nodes[c, TOK]
            n += 1
            c = nodes[c, BEST]
    return n, q0


@nb.njit(cache=True, inline="always")
def _set_info(rs, at, kind, order, length, src):
    rs[at] = kind
    rs[at + 1] = order
    rs[at + 2] = length
    rs[at + 3] = src


@nb.njit(cache=True)
def _step(arena, rs, ctx, ctx_len, stats, cap):
    """One proposer step for one request: score the previous candidates against the
    tokens committed since, count the new tokens in the trie and the local index, then
    draft at most ``cap`` tokens into the state's out region.

    ``stats``: float64 ``(3, orders + 1, 2 + 2 * 3 * K)``: per (kind, match length) the
    decayed sum of matched tokens, the decayed count, then per outcome of the request's
    previous draft (:data:`N_OUTCOMES`) and draft position the decayed counts of
    "reached" and "accepted" (for ``dynamic_algo``).

    ``prompt_first`` and ``dynamic`` are read from the state header.

    Returns the draft length (>= 0), or -1: the trie needs ``(ctx_len - rs[H_TRIE]) *
    depth`` free nodes, -2: the state array is too small for ``ctx_len`` tokens.
    """
    if ctx_len > rs[H_PC]:
        return -2
    if arena[0] + (ctx_len - rs[H_TRIE]) * rs[H_DEPTH] > arena[1]:
        return -1
    out, win, cand, cinfo, _, _ = _layout(rs)
    k = rs[H_K]
    last = rs[H_LAST]
    if last >= 0 and ctx_len > last:
        m_new = ctx_len - last
        chosen = rs[H_CHOSEN]
        best_copy = 0
        for c in range(rs[H_NCAND]):
            kind, order, nd, src = (rs[cinfo + _CINFO * c], rs[cinfo + _CINFO * c + 1],
                                    rs[cinfo + _CINFO * c + 2], rs[cinfo + _CINFO * c + 3])
            a = 0
            while a < nd and a < m_new and rs[cand + k * c + a] == ctx[last + a]:
                a += 1
            if kind != TRIE and a > best_copy:  # the copy that went furthest moves the pointer
                best_copy = a
                rs[H_PTR] = src + m_new
            st = stats[kind, order]
            st[0] = st[0] * _DECAY + a
            st[1] = st[1] * _DECAY + 1.0
            if c == chosen:
                drafted = rs[H_NOUT]
                base = 2 + 2 * k * rs[H_OUTCOME]
                for i in range(min(drafted, a + 1)):
                    st[base + i] = st[base + i] * _DECAY + 1.0
                    if i < a:
                        st[base + k + i] = st[base + k + i] * _DECAY + 1.0
                rs[H_OUTCOME] = 0 if a == 0 or drafted == 0 else (2 if a >= drafted else 1)
        rs[H_NCAND] = 0
    if rs[H_TRIE] < ctx_len:
        extend_stream(arena, rs[win:win + rs[H_DEPTH]], ctx, rs[H_TRIE], ctx_len, rs[H_STAMP])
        rs[H_TRIE] = ctx_len
    if rs[H_LOCAL] < ctx_len:
        _index_local(rs, ctx, rs[H_LOCAL], ctx_len)
        rs[H_LOCAL] = ctx_len
    rs[H_LAST] = ctx_len
    rs[H_NOUT] = 0
    if cap <= 0:
        return 0
    # ---- candidates
    nc = 0
    n, j_recent, j_next = _local_match(rs, ctx, ctx_len)
    if n > 0:
        for kind in (RECENT, NEXT):
            src = j_recent if kind == RECENT else j_next
            _copy(ctx, ctx_len, src, cap, rs[cand + k * nc:cand + k * nc + cap])
            _set_info(rs, cinfo + _CINFO * nc, kind, n, cap, src)
            nc += 1
    nodes = nodes_of(arena)
    htab = htab_of(arena)
    nt, q = _trie_draft(nodes, htab, ctx, ctx_len, rs[H_ORDERS], cap,
                        rs[cand + k * nc:cand + k * nc + cap])
    if nt > 0:
        _set_info(rs, cinfo + _CINFO * nc, TRIE, q, nt, -1)
        nc += 1
    rs[H_NCAND] = nc
    if nc == 0:
        return 0
    # ---- choice: best decayed mean of matched tokens, prior by prompt_first
    prompt_first = rs[H_PROMPT_FIRST] != 0
    best = -1
    best_score = -1.0
    for c in range(nc):
        kind, order = rs[cinfo + _CINFO * c], rs[cinfo + _CINFO * c + 1]
        preferred = (kind != TRIE) == prompt_first
        st = stats[kind, order]
        score = (st[0] + (1.0 if preferred else 0.5)) / (st[1] + 1.0)
        score += 1e-6 * order + (1e-7 if preferred else 0.0)  # ties: longer, preferred
        if score > best_score:
            best, best_score = c, score
    rs[H_CHOSEN] = best
    nd = rs[cinfo + _CINFO * best + 2]
    if rs[H_DYNAMIC]:
        st = stats[rs[cinfo + _CINFO * best], rs[cinfo + _CINFO * best + 1]]
        base = 2 + 2 * k * rs[H_OUTCOME]
        reach = 1.0
        for i in range(nd):
            reach *= (st[base + k + i] + 1.0) / (st[base + i] + 1.25)
            if reach < _DYN_MIN_REACH:
                nd = i + 1
                break
    rs[out:out + nd] = rs[cand + k * best:cand + k * best + nd]
    rs[H_NOUT] = nd
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
def _tree(arena, rs, ctx, ctx_len, budget, max_depth, tok, par):
    """Token tree: the candidate drafts (chosen first) merged on shared prefixes, the
    continuations of older occurrences of the matched suffix in the request's context
    (up to a quarter of the nodes left), then the most probable other trie
    continuations, best first (probability = product of child/parent count ratios).
    Fills ``tok[:n]``, ``par[:n]`` (-1 = child of the last context token); returns n.
    The candidates must be fresh (``_step`` just ran)."""
    nodes = nodes_of(arena)
    htab = htab_of(arena)
    _, _, cand, cinfo, _, _ = _layout(rs)
    k = rs[H_K]
    nc = rs[H_NCAND]
    depth = np.zeros(budget, dtype=np.int64)
    trie_node = np.full(budget, -1, dtype=np.int64)
    n = 0
    for r in range(nc):
        c = rs[H_CHOSEN] if r == 0 else (r - 1 if r - 1 < rs[H_CHOSEN] else r)
        p = -1
        for i in range(min(rs[cinfo + _CINFO * c + 2], max_depth)):
            t = rs[cand + k * c + i]
            f = _tree_child(tok, par, n, p, t)
            if f < 0:
                if n >= budget:
                    break
                tok[n] = t
                par[n] = p
                depth[n] = i + 1
                f = n
                n += 1
            p = f
    # other occurrences of the matched suffix in the request's context, most recent
    # first, up to a quarter of the nodes left
    m, j, _ = _local_match(rs, ctx, ctx_len)
    _, _, _, _, _, prev = _layout(rs)
    stop = n + (budget - n) // 4
    for _ in range(_MAX_CHAIN if m > 0 else 0):
        j = rs[prev + (m - 1) * rs[H_PC] + j]
        if j < m or n >= stop or not _same(ctx, j, ctx_len, m):
            break
        p = -1
        for i in range(min(max_depth, ctx_len - j)):
            f = _tree_child(tok, par, n, p, ctx[j + i])
            if f < 0:
                if n >= stop:
                    break
                tok[n] = ctx[j + i]
                par[n] = p
                depth[n] = i + 1
                f = n
                n += 1
            p = f
    # trie node of each tree node's context (ctx + path), root first
    orders = rs[H_ORDERS]
    path = np.empty(max_depth, dtype=np.int32)
    heap = [(0.0, np.int64(0), np.int64(0))]
    heap.pop()
    g_root = -1
    for u in range(-1, n):
        g = -1
        if u >= 0:
            gp = g_root if par[u] < 0 else trie_node[par[u]]
            if gp >= 0:
                g = find_child(nodes, htab, gp, tok[u])
        if g < 0 or nodes[g, BEST] < 0:
            d = 0 if u < 0 else depth[u]
            v = u
            for i in range(d - 1, -1, -1):
                path[i] = tok[v]
                v = par[v]
            g, _ = match(nodes, htab, ctx, ctx_len, path, d, orders)
        if u >= 0:
            trie_node[u] = g
        else:
            g_root = g
        if g < 0:
            continue
        c = nodes[g, CHILD]
        while c >= 0:
            dup = False
            for w in range(n):
                if par[w] == u and tok[w] == nodes[c, TOK]:
                    dup = True
                    break
            if not dup:
                heapq.heappush(heap, (-nodes[c, CNT] / max(nodes[g, CNT], 1), np.int64(u),
                                      np.int64(c)))
            c = nodes[c, SIB]
    while n < budget and len(heap) > 0:
        s, p, c = heapq.heappop(heap)
        d = 1 if p < 0 else depth[p] + 1
        if d > max_depth:
            continue
        tok[n] = nodes[c, TOK]
        par[n] = p
        depth[n] = d
        cc = nodes[c, CHILD]
        while cc >= 0:
            heapq.heappush(heap, (s * nodes[cc, CNT] / max(nodes[c, CNT], 1), np.int64(n),
                                  np.int64(cc)))
            cc = nodes[cc, SIB]
        n += 1
    return n


_STEP_ENTRY = []


def _step_entry():
    """:func:`_step`'s native entry point for its one signature (arrays int32 1-D C,
    float64 3-D C for ``stats``, int64 scalars), compiled or loaded on first use.
    Calling it skips numba's per-call type dispatch, about 0.35 µs of a 0.8 µs call
    with these six arguments; every call site passes exactly these types."""
    if not _STEP_ENTRY:
        i32 = nb.types.Array(nb.int32, 1, "C")
        _STEP_ENTRY.append(_step.compile(
            (i32, i32, i32, nb.int64, nb.types.Array(nb.float64, 3, "C"), nb.int64)))
    return _STEP_ENTRY[0]


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
        max_nodes: node cap of the shared trie (36 bytes per node).
        eviction: ``"frequency"`` or ``"age"`` (see :class:`FrequencyTrie`).
        prompt_first: the request's own prompt/output outranks the shared trie before
            statistics exist and on ties.
        insert_prompt: also count each finished request's prompt in the shared trie
            (at ``stop_request``, never on the first decode step).

    Memory: the trie (<= ``36 * max_nodes`` bytes, 37.7 MB at the default cap) plus
    per active request its tokens and 4 * max_query_length * (table + chain) slots,
    i.e. 24-40 bytes per context token per key length (133 bytes per token measured
    at the default ``max_query_length=4`` on RAG prompts).
    """

    method = "memory_decoding"

    def __init__(self, num_speculative_tokens: int, decoding_length: int = 16,
                 dynamic_algo: bool = False, branch_length: int = 8,
                 max_query_length: int = 4, max_nodes: int = 1 << 20,
                 eviction: str = "frequency", prompt_first: bool = True,
                 insert_prompt: bool = False):
        super().__init__(num_speculative_tokens)
        if not 1 <= max_query_length <= 64:
            raise ValueError("max_query_length must be in [1, 64]")
        self.decoding_length = int(decoding_length)
        self.dynamic_algo = bool(dynamic_algo)
        self.max_query_length = int(max_query_length)
        self.prompt_first = bool(prompt_first)
        self.insert_prompt = bool(insert_prompt)
        self.trie = FrequencyTrie(branch_length, max_nodes, eviction)
        self._k = max(self.num_speculative_tokens, self.decoding_length)
        self.stats = np.zeros((N_KINDS, self.max_query_length + 1,
                               2 + 2 * N_OUTCOMES * self._k))
        self.state: dict[str, np.ndarray] = {}
        self._step = _step_entry()

    # ------------------------------------------------------------ state arrays
    def _new_state(self, length: int, old: np.ndarray | None = None) -> np.ndarray:
        """A state array for up to ``2 * length`` context tokens (chains for 2x, the
        n-gram table a power of two >= 2x that); ``old``: the header, windows and
        candidates carry over and the n-gram table is rebuilt on the next step."""
        pc = max(64, 2 * length)
        ts = 1 << (2 * pc - 1).bit_length()
        depth = self.trie.branch_length
        rs = np.zeros(_state_size(self._k, depth, self.max_query_length, ts, pc),
                      dtype=np.int32)
        win = _HEADER + self._k
        head = win + depth + N_KINDS * (self._k + _CINFO)
        if old is None:
            rs[H_LAST] = -1
            rs[win:win + depth] = -1  # no open trie windows yet
        else:
            rs[:head] = old[:head]
            rs[H_LOCAL] = 0
        rs[H_TS], rs[H_PC] = ts, pc
        rs[H_PROMPT_FIRST], rs[H_DYNAMIC] = self.prompt_first, self.dynamic_algo
        rs[H_DEPTH], rs[H_K], rs[H_ORDERS] = (self.trie.branch_length, self._k,
                                              self.max_query_length)
        return rs

    def _windows(self):
        off = _HEADER + self._k
        return [rs[off:off + self.trie.branch_length] for rs in self.state.values()]

    def _run(self, req_id: str, cap: int) -> int:
        buf = self.tokens[req_id]
        while True:
            rs = self.state[req_id]
            n = self._step(self.trie.arena, rs, buf.storage, len(buf), self.stats, cap)
            if n >= 0:
                return n
            if n == -2:
                self.state[req_id] = self._new_state(len(buf), rs)
            else:
                need = (len(buf) - int(rs[H_TRIE])) * self.trie.branch_length
                if need > self.trie.max_nodes // 4:  # a long first step: count in chunks
                    stop = int(rs[H_TRIE]) + self.trie.max_nodes // 4 // self.trie.branch_length
                    self._count(req_id, stop)
                else:
                    self._reserve(need)

    def _reserve(self, need: int) -> None:
        remap = self.trie.reserve(need)
        if remap is not None:
            for w in self._windows():
                remap_window(w, remap)

    def _count(self, req_id: str, stop: int) -> None:
        rs = self.state[req_id]
        off = _HEADER + self._k
        self.trie.extend(rs[off:off + self.trie.branch_length], self.tokens[req_id].storage,
                         int(rs[H_TRIE]), stop, int(rs[H_STAMP]),
                         [w for r, w in zip(self.state, self._windows()) if r != req_id])
        rs[H_TRIE] = stop

    # ------------------------------------------------------------ life cycle hooks
    def _on_start(self, req_id: str) -> None:
        n = len(self.tokens[req_id])
        rs = self._new_state(n)
        rs[H_TRIE] = n  # the shared trie counts outputs; the prompt is indexed lazily
        rs[H_STAMP] = self.trie.tick()
        self.state[req_id] = rs

    def _on_stop(self, req_id: str, finished: bool) -> None:
        self._run(req_id, 0)  # count the last committed tokens
        del self.state[req_id]
        if finished and self.insert_prompt:
            self.trie.insert(self.tokens[req_id].storage[: self.prompt_len[req_id]],
                             self._windows())

    # ------------------------------------------------------------ drafting
    def _propose_one(self, req_id: str, max_tokens: int) -> list[int]:
        rs = self.state[req_id]
        buf = self.tokens[req_id]
        cap = min(max_tokens, self.decoding_length)
        n = self._step(self.trie.arena, rs, buf.storage, len(buf), self.stats, cap)
        if n < 0:  # grow the state or the trie first (rare)
            n = self._run(req_id, cap)
            rs = self.state[req_id]
        return rs[_HEADER:_HEADER + n].tolist()

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
            The single-branch draft is the chain of nodes 0, 1, ...

        Raises:
            KeyError: ``req_id`` is not active.
        """
        cap = min(self.num_speculative_tokens, self.decoding_length)
        depth = cap if max_depth is None else min(int(max_depth), self._k)
        self._run(req_id, depth)
        tok = np.empty(budget, dtype=np.int32)
        par = np.empty(budget, dtype=np.int32)
        buf = self.tokens[req_id]
        n = _tree(self.trie.arena, self.state[req_id], buf.storage, len(buf), int(budget),
                  depth, tok, par)
        return tok[:n], par[:n]

    def state_nbytes(self) -> int:
        return (super().state_nbytes() + self.trie.nbytes + self.stats.nbytes
                + sum(rs.nbytes for rs in self.state.values()))
