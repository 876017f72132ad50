"""Depth-bounded, path-compressed suffix tree over token sequences, in numpy arrays + numba.

The structure of SuffixDecoding (Oliaro et al., NeurIPS 2025; ArcticInference
``csrc/suffix_decoding/suffix_tree.{h,cc}``), re-designed for numba: every suffix of every
stored sequence, cut to ``max_depth`` tokens, is a root path; a node carries ``count`` =
the number of those suffixes that pass through or end at it (= occurrences of the root
path string, for strings of at most ``max_depth`` tokens). A node holds a run of tokens
(path compression: a child always has a smaller count than its parent) as a reference
``(slot, pos, len)`` into the token store, so memory is O(stored tokens).

Layout (one tree):

* ``nodes``: int32 ``(capacity, NF)``; node 0 is the root. Columns ``TOK`` (first token),
  ``CNT``, ``PAR``, ``LEN``, ``SEQ``/``POS`` (the run is ``tok[seqs[SEQ, 0] + POS:][:LEN]``),
  ``BEST`` (the highest-count child, ties to the most recently incremented, as the head
  of Arctic's count-sorted sibling list), ``FCH``/``NXT``/``PRV`` (child list, newest
  first; ``NXT`` also links free nodes).
* a children hash table ``hkeys`` int64 / ``hvals`` int32 (linear probing, backward-shift
  deletion), key ``parent << 32 | token``, empty = -1.
* ``meta`` int64: used slots, free-list head, live nodes, hash entries, max depth.
* the token store ``tok`` (int32) and ``seqs`` int64 ``(slots, 2)`` = (start, length) are
  owned by the caller: a request's own token buffer, or the global cache's arena.

Appending one token costs O(max_depth): one step per live suffix of the sequence (its
"suffix states", ``act``: the node where each suffix ends), as Arctic's active nodes; a
suffix that occurs only once is a leaf that just grows, without a hash lookup.
``tree_remove`` costs O(len * max_depth) and works for any sequence, in any order: every
node that a suffix lands on is re-pointed at that occurrence, and the tokens of a removed
sequence stay readable (see :class:`GlobalCache`) while a node may still reference them,
so no reference ever dangles and no per-node endpoint maps are needed.

Invariants (checked by ``tests/test_suffix_core.py`` against brute force): a node's count
is the number of occurrences of its root path string; every stored suffix ends at the end
of a node; a child's count is below its parent's (runs are maximal); a suffix state ends
at a node end.
"""
from __future__ import annotations

from collections import deque

import numpy as np
from numba import njit

# node columns
TOK, CNT, PAR, LEN, SEQ, POS, BEST, FCH, NXT, PRV = range(10)
NF = 10
# meta fields
M_USED, M_FREE, M_LIVE, M_HCNT, M_DEPTH = range(5)
_EMPTY = -1


# --------------------------------------------------------------------------- hash table
@njit(cache=True, inline="always")
def _slot(key, mask):
    x = key ^ (key >> 29)
    x = x * 0x3C79AC492BA7B653
    x = x ^ (x >> 32)
    return x & mask


@njit(cache=True)
def _hfind(hkeys, hvals, key):
    mask = len(hkeys) - 1
    i = _slot(key, mask)
    while True:
        k = hkeys[i]
        if k == key:
            return hvals[i]
        if k == _EMPTY:
            return -1
        i = (i + 1) & mask


@njit(cache=True)
def _hput(hkeys, hvals, meta, key, val):
    mask = len(hkeys) - 1
    i = _slot(key, mask)
    while True:
        k = hkeys[i]
        if k == key:
            hvals[i] = val
            return
        if k == _EMPTY:
            hkeys[i] = key
            hvals[i] = val
            meta[M_HCNT] += 1
            return
        i = (i + 1) & mask


@njit(cache=True)
def _hdel(hkeys, hvals, meta, key):
    mask = len(hkeys) - 1
    i = _slot(key, mask)
    while hkeys[i] != key:
        if hkeys[i] == _EMPTY:
            return
        i = (i + 1) & mask
    j = i
    while True:  # backward-shift deletion keeps every probe chain unbroken
        j = (j + 1) & mask
        k = hkeys[j]
        if k == _EMPTY:
            break
        if ((j - _slot(k, mask)) & mask) >= ((j - i) & mask):
            hkeys[i] = k
            hvals[i] = hvals[j]
            i = j
    hkeys[i] = _EMPTY
    meta[M_HCNT] -= 1


@njit(cache=True)
def rehash(hkeys, hvals, new_keys, new_vals):
    """Copy every entry of one children table into an empty, larger one (in place)."""
    mask = len(new_keys) - 1
    for i in range(len(hkeys)):
        k = hkeys[i]
        if k != _EMPTY:
            j = _slot(k, mask)
            while new_keys[j] != _EMPTY:
                j = (j + 1) & mask
            new_keys[j] = k
            new_vals[j] = hvals[i]


@njit(cache=True, inline="always")
def _key(parent, token):
    """Hash key of ``parent``'s child by ``token``: the parent in the high 32 bits, the
    token's 32 bits below (masked, so that a negative id cannot clear the parent's bits
    and collide with the empty key -1)."""
    return (np.int64(parent) << 32) | (np.int64(token) & 0xFFFFFFFF)


# --------------------------------------------------------------------------- nodes
@njit(cache=True, inline="always")
def token_at(nodes, tok, seqs, n, i):
    """Token ``i`` of node ``n``'s run."""
    return tok[seqs[nodes[n, SEQ], 0] + nodes[n, POS] + i]


@njit(cache=True)
def _alloc(nodes, meta, token, count, parent, length, slot, pos):
    n = meta[M_FREE]
    if n >= 0:
        meta[M_FREE] = nodes[n, NXT]
    else:
        n = meta[M_USED]
        meta[M_USED] += 1
    meta[M_LIVE] += 1
    nodes[n, TOK] = token
    nodes[n, CNT] = count
    nodes[n, PAR] = parent
    nodes[n, LEN] = length
    nodes[n, SEQ] = slot
    nodes[n, POS] = pos
    nodes[n, BEST] = -1
    nodes[n, FCH] = -1
    nodes[n, NXT] = -1
    nodes[n, PRV] = -1
    return n


@njit(cache=True)
def _free(nodes, meta, n):
    nodes[n, CNT] = 0
    nodes[n, NXT] = meta[M_FREE]
    meta[M_FREE] = n
    meta[M_LIVE] -= 1


@njit(cache=True)
def _link(nodes, u, c):
    h = nodes[u, FCH]
    nodes[c, NXT] = h
    nodes[c, PRV] = -1
    if h >= 0:
        nodes[h, PRV] = c
    nodes[u, FCH] = c


@njit(cache=True)
def _unlink(nodes, u, c):
    p = nodes[c, PRV]
    n = nodes[c, NXT]
    if p >= 0:
        nodes[p, NXT] = n
    else:
        nodes[u, FCH] = n
    if n >= 0:
        nodes[n, PRV] = p


@njit(cache=True)
def _replace(nodes, u, old, new):
    """``new`` takes ``old``'s place among ``u``'s children (list and best pointer)."""
    p = nodes[old, PRV]
    n = nodes[old, NXT]
    nodes[new, PRV] = p
    nodes[new, NXT] = n
    if p >= 0:
        nodes[p, NXT] = new
    else:
        nodes[u, FCH] = new
    if n >= 0:
        nodes[n, PRV] = new
    if nodes[u, BEST] == old:
        nodes[u, BEST] = new


@njit(cache=True)
def _rescan_best(nodes, u, keep):
    """Best child of ``u`` after a count decrease: the highest count, ``keep`` on ties."""
    best = keep
    bc = nodes[keep, CNT] if keep >= 0 else -1
    c = nodes[u, FCH]
    while c >= 0:
        if nodes[c, CNT] > bc:
            best = c
            bc = nodes[c, CNT]
        c = nodes[c, NXT]
    nodes[u, BEST] = best


# --------------------------------------------------------------------------- insertion
@njit(cache=True)
def _extend(nodes, hkeys, hvals, meta, tok, seqs, slot, u, t, p):
    """Extend the suffix ending at the end of node ``u`` by token ``t`` (at position
    ``p`` of sequence ``slot``); return the node where the longer suffix ends.
    The cases are Arctic's ``SuffixTree::append`` (1a/1b/2a/2b/3a/3b)."""
    if u != 0 and nodes[u, CNT] == 1:  # 1a: a leaf (no children) of this suffix alone
        nodes[u, LEN] += 1
        nodes[u, SEQ] = slot  # its old reference may be a removed sequence
        nodes[u, POS] = p - nodes[u, LEN] + 1
        return u
    key = _key(u, t)
    c = _hfind(hkeys, hvals, key)
    if c < 0:
        c = _alloc(nodes, meta, t, 1, u, 1, slot, p)  # 1b: new leaf
        _link(nodes, u, c)
        _hput(hkeys, hvals, meta, key, c)
        if nodes[u, BEST] < 0:
            nodes[u, BEST] = c
        return c
    cc = nodes[c, CNT]
    if u != 0 and nodes[u, CNT] == cc + 1:
        # every other suffix through u continues into c: u and c become one run
        if nodes[c, LEN] == 1:  # 2a: c absorbs u
            par = nodes[u, PAR]
            ulen = nodes[u, LEN]
            utok = nodes[u, TOK]
            nodes[c, CNT] = cc + 1
            nodes[c, TOK] = utok
            nodes[c, LEN] = ulen + 1
            nodes[c, SEQ] = slot
            nodes[c, POS] = p - ulen
            nodes[c, PAR] = par
            _replace(nodes, par, u, c)
            _hput(hkeys, hvals, meta, _key(par, utok), c)
            _hdel(hkeys, hvals, meta, key)
            _free(nodes, meta, u)
            return c
        nodes[u, LEN] += 1  # 2b: u grows by one token, c loses its first token
        nodes[u, SEQ] = slot
        nodes[u, POS] = p - nodes[u, LEN] + 1
        _hdel(hkeys, hvals, meta, key)
        nodes[c, LEN] -= 1
        nodes[c, POS] += 1
        nt = token_at(nodes, tok, seqs, c, 0)
        nodes[c, TOK] = nt
        _hput(hkeys, hvals, meta, _key(u, nt), c)
        return u
    if nodes[c, LEN] == 1:  # 3a: one more suffix through c
        nodes[c, CNT] = cc + 1
        nodes[c, SEQ] = slot
        nodes[c, POS] = p
        if cc + 1 >= nodes[nodes[u, BEST], CNT]:
            nodes[u, BEST] = c
        return c
    v = _alloc(nodes, meta, t, cc + 1, u, 1, slot, p)  # 3b: split c after its first token
    _replace(nodes, u, c, v)
    _hput(hkeys, hvals, meta, key, v)
    nodes[c, LEN] -= 1
    nodes[c, POS] += 1
    nt = token_at(nodes, tok, seqs, c, 0)
    nodes[c, TOK] = nt
    nodes[c, PAR] = v
    nodes[c, NXT] = -1
    nodes[c, PRV] = -1
    nodes[v, FCH] = c
    nodes[v, BEST] = c
    _hput(hkeys, hvals, meta, _key(v, nt), c)
    if cc + 1 >= nodes[nodes[u, BEST], CNT]:
        nodes[u, BEST] = v
    return v


@njit(cache=True)
def tree_append(nodes, hkeys, hvals, meta, tok, seqs, slot, act, end):
    """Insert positions ``seqs[slot, 1] .. end - 1`` of sequence ``slot`` (tokens already
    in ``tok``), advancing ``seqs[slot, 1]``.

    ``act`` (int32, ``(max_depth,)``) holds the sequence's live suffixes: ``act[m]`` is
    the node where its length-``m`` suffix ends (1 <= m <= min(len, max_depth - 1)).
    Stops early when the next token might overflow ``nodes`` or load the children table
    over one half; the caller grows them and calls again.

    Returns:
        The sequence length reached (``== end`` when done).
    """
    depth = meta[M_DEPTH]
    cap = nodes.shape[0]
    hcap = hkeys.shape[0]
    base = seqs[slot, 0]
    n = seqs[slot, 1]
    while n < end:
        if meta[M_LIVE] + depth + 1 > cap or 2 * (meta[M_HCNT] + 2 * depth + 2) > hcap:
            break
        t = tok[base + n]
        top = min(n, depth - 1)
        for m in range(top, -1, -1):  # longest first, as Arctic's active-node queue
            u = act[m] if m > 0 else 0
            v = _extend(nodes, hkeys, hvals, meta, tok, seqs, slot, u, t, n)
            if m + 1 < depth:
                act[m + 1] = v
        nodes[0, CNT] += 1
        n += 1
        seqs[slot, 1] = n
    return n


# --------------------------------------------------------------------------- removal
@njit(cache=True)
def _drop_subtree(nodes, hkeys, hvals, meta, u, c):
    """Remove child ``c`` of ``u`` and everything below it."""
    _unlink(nodes, u, c)
    _hdel(hkeys, hvals, meta, _key(u, nodes[c, TOK]))
    if nodes[u, BEST] == c:
        nodes[u, BEST] = -1
        _rescan_best(nodes, u, -1)
    x = c
    while True:  # post-order walk over parent pointers, no stack
        while nodes[x, FCH] >= 0:
            x = nodes[x, FCH]
        par = nodes[x, PAR]
        if x != c:
            _unlink(nodes, par, x)
            _hdel(hkeys, hvals, meta, _key(par, nodes[x, TOK]))
        _free(nodes, meta, x)
        if x == c:
            return
        x = par


@njit(cache=True)
def tree_remove(nodes, hkeys, hvals, meta, tok, seqs, slot):
    """Remove every suffix of sequence ``slot`` (length ``seqs[slot, 1]``).

    Merges the last node of each suffix's path into its only child when their counts
    become equal, which keeps every child's count below its parent's (as Arctic).
    """
    depth = meta[M_DEPTH]
    base = seqs[slot, 0]
    n = seqs[slot, 1]
    for i in range(n):
        nodes[0, CNT] -= 1
        u = 0
        d = i
        lim = min(n, i + depth)
        while d < lim:
            c = _hfind(hkeys, hvals, _key(u, tok[base + d]))
            if nodes[c, CNT] == 1:
                _drop_subtree(nodes, hkeys, hvals, meta, u, c)
                break
            nodes[c, CNT] -= 1
            if nodes[u, BEST] == c:
                _rescan_best(nodes, u, c)
            d += nodes[c, LEN]
            u = c
        if u == 0:
            continue
        # the suffix no longer ends at u, or u lost a child: u may now be a plain run
        ch = nodes[u, FCH]
        if ch >= 0 and nodes[ch, NXT] < 0 and nodes[ch, CNT] == nodes[u, CNT]:
            par = nodes[u, PAR]  # u and its only child become one run
            ulen = nodes[u, LEN]
            utok = nodes[u, TOK]
            _hdel(hkeys, hvals, meta, _key(u, nodes[ch, TOK]))
            nodes[ch, TOK] = utok
            nodes[ch, LEN] += ulen
            nodes[ch, POS] -= ulen
            nodes[ch, PAR] = par
            _replace(nodes, par, u, ch)
            _hput(hkeys, hvals, meta, _key(par, utok), ch)
            _free(nodes, meta, u)


# --------------------------------------------------------------------------- queries
@njit(cache=True, inline="always")
def child(hkeys, hvals, u, t):
    """The child of node ``u`` whose run starts with token ``t``, or -1."""
    return _hfind(hkeys, hvals, _key(u, t))


@njit(cache=True)
def match(nodes, hkeys, hvals, tok, seqs, ctx, start, stop):
    """Walk ``ctx[start:stop]`` from the root; return ``(node, used)`` = the node the
    match ends in and the tokens of its run consumed, or ``(-1, 0)`` if absent."""
    u = 0
    used = 0
    for i in range(start, stop):
        t = ctx[i]
        if used == nodes[u, LEN]:
            u = _hfind(hkeys, hvals, _key(u, t))
            if u < 0:
                return -1, 0
            used = 1
        elif token_at(nodes, tok, seqs, u, used) == t:
            used += 1
        else:
            return -1, 0
    return u, used


@njit(cache=True)
def request_append(lnodes, lhkeys, lhvals, lmeta, ltok, lseqs, act, end,
                   gnodes, ghkeys, ghvals, gmeta, arena, gseqs, slot, gact, out_end):
    """Index a request's tokens up to ``end`` in its tree and, if ``slot >= 0``, its
    output (the last ``out_end`` of those tokens) in the global tree, copying the new
    output tokens into the global arena (its region must hold ``out_end`` tokens).

    Returns:
        0 when done; else bit 1 / bit 2: the request / global tree must grow first
        (then call again: finished work is not redone).
    """
    status = 0
    if tree_append(lnodes, lhkeys, lhvals, lmeta, ltok, lseqs, 0, act, end) < end:
        status |= 1
    if slot >= 0:
        base = gseqs[slot, 0]
        shift = end - out_end
        for j in range(gseqs[slot, 1], out_end):
            arena[base + j] = ltok[shift + j]
        if tree_append(gnodes, ghkeys, ghvals, gmeta, arena, gseqs, slot, gact, out_end) < out_end:
            status |= 2
    return status


@njit(cache=True)
def mark_referenced(nodes, meta, refs):
    """``refs[slot] = True`` for every sequence slot a live node references."""
    for n in range(1, meta[M_USED]):
        if nodes[n, CNT] > 0:
            refs[nodes[n, SEQ]] = True


def load_growth_kernels() -> None:
    """Call :func:`rehash` (a growing tree) and :func:`mark_referenced` (a compacting
    :class:`GlobalCache`) once on a throwaway tree, with the argument types their callers
    pass, so that their compiled code is loaded before serving. A short warm-up request
    reaches neither; in the end-to-end benchmark the first step of the first timed
    batch-32 cell reached them, and the drafter's work in that step took 140-146 ms where
    numba compiled them (a fresh install) and 11-15 ms where it loaded them from its disk
    cache, against 3-7 ms in later cells."""
    t = SuffixTree(1)
    keys = np.full(2 * len(t.hkeys), _EMPTY, dtype=np.int64)
    rehash(t.hkeys, t.hvals, keys, np.empty(len(keys), dtype=np.int32))
    mark_referenced(t.nodes, t.meta, np.zeros(1, dtype=np.bool_))


# --------------------------------------------------------------------------- owners
def _pow2(n: int) -> int:
    return 1 << max(4, int(n - 1).bit_length())


class SuffixTree:
    """The arrays of one tree and their growth; tokens live with the caller.

    Args:
        max_depth: longest stored suffix (>= 1); also the longest match + draft.
        capacity: initial node slots (grown x2 on demand).

    Attributes:
        nodes, hkeys, hvals, meta: see the module docstring.
    """

    def __init__(self, max_depth: int, capacity: int = 64):
        if max_depth < 1:
            raise ValueError("max_depth must be >= 1")
        self.max_depth = int(max_depth)
        capacity = max(int(capacity), 2 * self.max_depth + 16)
        self.nodes = np.empty((capacity, NF), dtype=np.int32)
        self.nodes[0] = (-1, 0, -1, 0, 0, 0, -1, -1, -1, -1)
        self.hkeys = np.full(_pow2(4 * capacity), _EMPTY, dtype=np.int64)
        self.hvals = np.empty(len(self.hkeys), dtype=np.int32)
        self.meta = np.array([1, -1, 1, 0, self.max_depth], dtype=np.int64)

    def remove(self, tok: np.ndarray, seqs: np.ndarray, slot: int) -> None:
        """Remove sequence ``slot``, which must be the oldest one inserted."""
        tree_remove(self.nodes, self.hkeys, self.hvals, self.meta, tok, seqs, slot)

    def grow(self) -> None:
        """Make room for one more token (see :func:`tree_append`): node slots and/or
        children table x2."""
        need = int(self.meta[M_LIVE]) + self.max_depth + 1
        if need > len(self.nodes):
            grown = np.empty((max(2 * len(self.nodes), need), NF), dtype=np.int32)
            grown[: len(self.nodes)] = self.nodes
            self.nodes = grown
        if 2 * (int(self.meta[M_HCNT]) + 2 * self.max_depth + 2) > len(self.hkeys):
            keys = np.full(2 * len(self.hkeys), _EMPTY, dtype=np.int64)
            vals = np.empty(len(keys), dtype=np.int32)
            rehash(self.hkeys, self.hvals, keys, vals)
            self.hkeys, self.hvals = keys, vals

    @property
    def num_nodes(self) -> int:
        """Live nodes, the root included."""
        return int(self.meta[M_LIVE])

    @property
    def nbytes(self) -> int:
        """Bytes of the tree's arrays (allocated, not just used)."""
        return self.nodes.nbytes + self.hkeys.nbytes + self.hvals.nbytes + self.meta.nbytes


class ActiveRequest:
    """One active request's suffix structures: a tree over its own tokens (prompt and
    output, read from the request's token buffer) and its output's sequence in the
    global cache.

    Args:
        max_depth: see :class:`SuffixTree`.
        cache: the global cache.
        prompt_len: tokens before the output.
    """

    def __init__(self, max_depth: int, cache: GlobalCache, prompt_len: int):
        self.tree = SuffixTree(max_depth, 2 * prompt_len + 64)
        self.seqs = np.zeros((1, 2), dtype=np.int64)
        self.act = np.zeros(max_depth, dtype=np.int32)
        self.cache = cache
        self.slot = cache.open()
        self.gact = np.zeros(max_depth, dtype=np.int32)
        self.prompt_len = prompt_len

    def extend(self, tok: np.ndarray, length: int) -> None:
        """Index ``tok[:length]`` (int32; the part not indexed yet)."""
        g, t, gt = self.cache, self.tree, self.cache.tree
        out_end = length - self.prompt_len
        if self.slot >= 0:
            g.reserve(self.slot, out_end)
        while status := request_append(t.nodes, t.hkeys, t.hvals, t.meta, tok, self.seqs,
                                       self.act, length, gt.nodes, gt.hkeys, gt.hvals,
                                       gt.meta, g.arena, g.seqs, self.slot, self.gact,
                                       out_end):
            if status & 1:
                t.grow()
            if status & 2:
                gt.grow()

    def close(self, finished: bool) -> None:
        """Keep the output in the global cache (``finished``) or remove it."""
        if self.slot >= 0:
            self.cache.close(self.slot, keep=finished)
            self.slot = -1

    @property
    def nbytes(self) -> int:
        return self.tree.nbytes + self.seqs.nbytes + self.act.nbytes + self.gact.nbytes


class GlobalCache:
    """The tree shared by all requests: the outputs of active requests (as they grow)
    and of finished ones, FIFO-capped in finished outputs (ArcticInference's global tree).

    Each sequence owns a region of one int32 arena, moved to a larger region when full
    (node references are (slot, offset) pairs, so the tree is untouched). Removing a
    sequence (abort, preemption, eviction) subtracts its suffixes; its tokens stay in the
    arena while surviving nodes may still reference them, until a compaction finds that
    none does.

    Args:
        max_depth: see :class:`SuffixTree`.
        max_requests: finished outputs kept (-1: unbounded, 0: the cache stays empty
            and :meth:`open` returns -1).
    """

    _FREE, _ACTIVE, _CACHED, _REMOVED = range(4)
    _FIRST_ROOM = 64  # tokens of a new sequence's first region

    def __init__(self, max_depth: int, max_requests: int):
        if max_requests < -1:
            raise ValueError("max_requests must be >= -1")
        self.max_requests = int(max_requests)
        self.tree = SuffixTree(max_depth)
        self.arena = np.zeros(64 * self._FIRST_ROOM, dtype=np.int32)
        self.used = 0  # arena high-water mark
        self.seqs = np.zeros((16, 2), dtype=np.int64)  # (start, length) per slot
        self._room = [0] * 16  # region size per slot
        self._state = [self._FREE] * 16
        self._free_slots = list(range(15, -1, -1))
        self.fifo: deque[int] = deque()  # finished slots, oldest first

    def __len__(self) -> int:
        """Finished outputs cached."""
        return len(self.fifo)

    @property
    def stored_tokens(self) -> int:
        """Tokens of the active and cached sequences (what the tree indexes)."""
        return int(sum(self.seqs[s, 1] for s, st in enumerate(self._state)
                       if st in (self._ACTIVE, self._CACHED)))

    def open(self) -> int:
        """Start an (empty) sequence for an active request's output; returns its slot,
        or -1 if the cache is disabled."""
        if self.max_requests == 0:
            return -1
        if not self._free_slots:
            self._grow_slots()
        slot = self._free_slots.pop()
        self._state[slot] = self._ACTIVE
        self.seqs[slot] = (0, 0)
        self._place(slot, self._FIRST_ROOM)
        return slot

    def reserve(self, slot: int, length: int) -> None:
        """Make active sequence ``slot``'s region hold ``length`` tokens."""
        if length > self._room[slot]:
            self._place(slot, max(2 * self._room[slot], length))

    def close(self, slot: int, keep: bool) -> None:
        """End active sequence ``slot``: cache it (``keep``; the oldest cached beyond the
        cap are evicted) or remove it (aborted / preempted request)."""
        if not keep:
            self._remove(slot)
            return
        self._state[slot] = self._CACHED
        self.fifo.append(slot)
        while self.max_requests > 0 and len(self.fifo) > self.max_requests:
            self._remove(self.fifo.popleft())

    def _remove(self, slot: int) -> None:
        self.tree.remove(self.arena, self.seqs, slot)
        self._state[slot] = self._REMOVED

    def _grow_slots(self) -> None:
        n = len(self.seqs)
        grown = np.zeros((2 * n, 2), dtype=np.int64)
        grown[:n] = self.seqs
        self.seqs = grown
        self._room += [0] * n
        self._state += [self._FREE] * n
        self._free_slots += list(range(2 * n - 1, n - 1, -1))

    def _place(self, slot: int, room: int) -> None:
        """Give ``slot`` a fresh region of ``room`` tokens at the arena's end."""
        if self.used + room > len(self.arena):
            self._compact(room)
        start, n = int(self.seqs[slot, 0]), int(self.seqs[slot, 1])
        self.arena[self.used:self.used + n] = self.arena[start:start + n]
        self.seqs[slot, 0] = self.used
        self._room[slot] = room
        self.used += room

    def _compact(self, extra: int) -> None:
        """Copy every region still needed to the front of a (possibly larger) arena;
        removed sequences that no node references any more free their slots."""
        refs = np.zeros(len(self.seqs), dtype=np.bool_)
        mark_referenced(self.tree.nodes, self.tree.meta, refs)
        keep = []
        for slot, state in enumerate(self._state):
            if state == self._REMOVED and not refs[slot]:
                self._state[slot] = self._FREE
                self.seqs[slot] = (0, 0)
                self._free_slots.append(slot)
            elif state != self._FREE:
                if state != self._ACTIVE:
                    self._room[slot] = int(self.seqs[slot, 1])
                keep.append(slot)
        need = sum(self._room[s] for s in keep) + extra
        size = len(self.arena)
        while size < 2 * need:
            size *= 2
        arena = np.zeros(size, dtype=np.int32)
        pos = 0
        for slot in keep:
            start, n = int(self.seqs[slot, 0]), int(self.seqs[slot, 1])
            arena[pos:pos + n] = self.arena[start:start + n]
            self.seqs[slot, 0] = pos
            pos += self._room[slot]
        self.arena, self.used = arena, pos

    @property
    def nbytes(self) -> int:
        """Bytes held: tree arrays, arena and slot table."""
        return self.tree.nbytes + self.arena.nbytes + self.seqs.nbytes
