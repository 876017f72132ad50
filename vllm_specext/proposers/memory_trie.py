"""The shared memory of ``memory_decoding``: a bounded frequency trie of token n-grams.

Design after PIA "Lookahead" (Zhao et al., "Lookahead: An Inference Acceleration
Framework for Large Language Model with Lossless Generation Accuracy", KDD 2024;
github alipay/PainlessInferenceAcceleration, ``lookahead/lookahead/common/lookahead_cache.py``),
re-built on one flat int32 array walked by numba kernels instead of Python dicts.

The trie holds every n-gram of length 1..``branch_length`` of the streams fed to it;
a node's count is the number of occurrences of its n-gram. PIA inserts the
``branch_length`` tokens that follow each position once they are all known; here each
stream keeps its *open windows* (``win[d]`` = the node of the stream's last d+1 tokens),
so a new token costs ``branch_length`` child steps and no branch waits for its tail.
Counts and stamps never increase from parent to child, so pruning by either keeps the
trie closed under prefixes.

Arena layout (int32, 1-D; one array so a kernel call passes one argument)::

    [0] number of nodes (root included)  [1] node capacity  [2] hash slots
    [HEADER : HEADER + 7 * capacity]      node table, row = (token, count, stamp,
                                          parent, best child, first child, next sibling)
    [... : ... + slots]                   open-addressing hash of child ids by (parent, token)
"""
from __future__ import annotations

import numba as nb
import numpy as np

# Columns of the node table; row 0 is the root.
TOK, CNT, STAMP, PARENT, BEST, CHILD, SIB = range(7)
NODE_FIELDS = 7
ROOT = 0
HEADER = 4
#: bytes per node of capacity: the node row plus two int32 hash slots
BYTES_PER_NODE = NODE_FIELDS * 4 + 2 * 4
_INT32_MAX = np.iinfo(np.int32).max
_M1 = np.uint64(0x9E3779B97F4A7C15)
_M2 = np.uint64(0xC2B2AE3D27D4EB4F)


@nb.njit(cache=True, inline="always")
def nodes_of(arena):
    """The node table ``int32 (capacity, 7)`` of an arena (a view)."""
    cap = np.int64(arena[1])
    return arena[HEADER:HEADER + NODE_FIELDS * cap].reshape((cap, np.int64(NODE_FIELDS)))


@nb.njit(cache=True, inline="always")
def htab_of(arena):
    """The hash slots ``int32 (slots,)`` of an arena (a view; -1 = empty)."""
    start = HEADER + NODE_FIELDS * np.int64(arena[1])
    return arena[start:start + np.int64(arena[2])]


@nb.njit(cache=True, inline="always")
def _slot(parent, tok, mask):
    h = np.uint64(parent) * _M1 ^ (np.uint64(tok) + np.uint64(1)) * _M2
    h ^= h >> np.uint64(31)
    return np.int64(h & np.uint64(mask))


@nb.njit(cache=True)
def find_child(nodes, htab, parent, tok):
    """Node id of child ``tok`` of ``parent``, or -1."""
    mask = htab.shape[0] - 1
    s = _slot(parent, tok, mask)
    while True:
        c = htab[s]
        if c < 0:
            return -1
        if nodes[c, PARENT] == parent and nodes[c, TOK] == tok:
            return c
        s = (s + 1) & mask


@nb.njit(cache=True)
def _hash_insert(nodes, htab, c):
    mask = htab.shape[0] - 1
    s = _slot(nodes[c, PARENT], nodes[c, TOK], mask)
    while htab[s] >= 0:
        s = (s + 1) & mask
    htab[s] = c


@nb.njit(cache=True)
def _bump(arena, nodes, htab, parent, tok, stamp):
    """Count one occurrence of child ``tok`` of ``parent`` (created if missing)."""
    c = find_child(nodes, htab, parent, tok)
    if c < 0:
        c = arena[0]
        arena[0] += 1
        nodes[c, TOK] = tok
        nodes[c, CNT] = 0
        nodes[c, STAMP] = stamp
        nodes[c, PARENT] = parent
        nodes[c, BEST] = -1
        nodes[c, CHILD] = -1
        nodes[c, SIB] = nodes[parent, CHILD]
        nodes[parent, CHILD] = c
        _hash_insert(nodes, htab, c)
    if nodes[c, CNT] < _INT32_MAX:
        nodes[c, CNT] += 1
    if nodes[c, STAMP] < stamp:
        nodes[c, STAMP] = stamp
    b = nodes[parent, BEST]
    if b < 0 or nodes[c, CNT] >= nodes[b, CNT]:  # ties: the most recently counted
        nodes[parent, BEST] = c
    return c


@nb.njit(cache=True)
def extend_stream(arena, win, tokens, start, end, stamp):
    """Count the n-grams ending in ``tokens[start:end]`` of the stream whose open
    windows are ``win`` (int32 ``(branch_length,)``, updated in place). The caller
    reserves ``(end - start) * branch_length`` free nodes first."""
    nodes = nodes_of(arena)
    htab = htab_of(arena)
    depth = win.shape[0]
    for i in range(start, end):
        x = tokens[i]
        for d in range(depth - 1, 0, -1):
            p = win[d - 1]
            win[d] = _bump(arena, nodes, htab, p, x, stamp) if p >= 0 else -1
        win[0] = _bump(arena, nodes, htab, ROOT, x, stamp)
        if nodes[ROOT, CNT] < _INT32_MAX:
            nodes[ROOT, CNT] += 1


@nb.njit(cache=True)
def match(nodes, htab, ctx, ctx_len, ext, ext_len, max_q):
    """Node of the longest suffix (<= ``max_q`` tokens) of the sequence
    ``ctx[:ctx_len] + ext[:ext_len]`` that is in the trie and has children.
    Returns ``(node, q)``, ``(-1, 0)`` if none."""
    end = ctx_len + ext_len
    for q in range(min(max_q, end), 0, -1):
        node = ROOT
        for i in range(end - q, end):
            node = find_child(nodes, htab, node, ctx[i] if i < ctx_len else ext[i - ctx_len])
            if node < 0:
                break
        if node >= 0 and nodes[node, BEST] >= 0:
            return node, q
    return -1, 0


@nb.njit(cache=True)
def _relink(arena):
    """Rebuild hash slots, child lists and best children of all nodes."""
    nodes = nodes_of(arena)
    htab = htab_of(arena)
    n = arena[0]
    htab[:] = -1
    for c in range(n):
        nodes[c, BEST] = -1
        nodes[c, CHILD] = -1
    for c in range(1, n):
        p = nodes[c, PARENT]
        nodes[c, SIB] = nodes[p, CHILD]
        nodes[p, CHILD] = c
        _hash_insert(nodes, htab, c)
        b = nodes[p, BEST]
        if b < 0 or nodes[c, CNT] >= nodes[b, CNT]:
            nodes[p, BEST] = c


def _pow2(n: int) -> int:
    """Smallest power of two >= max(n, 2)."""
    return 1 << max(int(n) - 1, 1).bit_length()


def _new_arena(cap: int) -> np.ndarray:
    slots = 2 * _pow2(cap)
    arena = np.zeros(HEADER + NODE_FIELDS * cap + slots, dtype=np.int32)
    arena[:3] = (1, cap, slots)
    arena[HEADER:HEADER + NODE_FIELDS] = (-1, 0, 0, -1, -1, -1, -1)  # the root
    arena[HEADER + NODE_FIELDS * cap:] = -1
    return arena


class FrequencyTrie:
    """Frequency trie of n-grams (length 1..``branch_length``), bounded to ``max_nodes``.

    Storage: one int32 arena (module doc); capacity doubles from 4096 nodes up to
    ``max_nodes``, :data:`BYTES_PER_NODE` (36) bytes per node of capacity.

    Eviction (:meth:`reserve`, when an insertion could pass ``max_nodes``): keep the
    ``3/4 max_nodes`` best nodes by ``(count, stamp)`` after halving every count
    (``eviction="frequency"``; PIA's ``_squeeze`` halves output counts and drops
    count-1 nodes) or by ``(stamp, count)`` (``"age"``, stamps being the clock value of
    the stream that last counted the node). Both orders never rise from parent to
    child, so survivors are closed under prefixes.

    Args:
        branch_length: longest n-gram stored (trie depth), >= 1.
        max_nodes: node cap, root included, >= 64.
        eviction: ``"frequency"`` or ``"age"``.

    Raises:
        ValueError: an argument out of range.
    """

    def __init__(self, branch_length: int = 16, max_nodes: int = 1 << 20,
                 eviction: str = "frequency"):
        if branch_length < 1:
            raise ValueError("branch_length must be >= 1")
        if max_nodes < 64:
            raise ValueError("max_nodes must be >= 64")
        if eviction not in ("frequency", "age"):
            raise ValueError("eviction must be 'frequency' or 'age'")
        self.branch_length = int(branch_length)
        self.max_nodes = int(max_nodes)
        self.eviction = eviction
        self.arena = _new_arena(min(self.max_nodes, 1 << 12))
        self.clock = 0
        self.num_prunes = 0

    # ------------------------------------------------------------ views
    @property
    def nodes(self) -> np.ndarray:
        """int32 ``(capacity, 7)`` node table (a view; rows ``[0, num_nodes)`` valid)."""
        cap = int(self.arena[1])
        return self.arena[HEADER:HEADER + NODE_FIELDS * cap].reshape(cap, NODE_FIELDS)

    @property
    def htab(self) -> np.ndarray:
        start = HEADER + NODE_FIELDS * int(self.arena[1])
        return self.arena[start:start + int(self.arena[2])]

    @property
    def num_nodes(self) -> int:
        return int(self.arena[0])

    @property
    def nbytes(self) -> int:
        return self.arena.nbytes

    # ------------------------------------------------------------ updates
    def new_window(self) -> np.ndarray:
        """Open windows of a new stream: int32 ``(branch_length,)``, all -1."""
        return np.full(self.branch_length, -1, dtype=np.int32)

    def tick(self) -> int:
        """A fresh stamp (clock value) for a new stream."""
        self.clock += 1
        return self.clock

    def extend(self, win: np.ndarray, tokens: np.ndarray, start: int, end: int,
               stamp: int, other_windows=()) -> None:
        """Count the n-grams ending in ``tokens[start:end]`` (int32) of the stream with
        open windows ``win``; prunes first if needed, re-mapping ``win`` and
        ``other_windows`` (the open windows of other live streams)."""
        step = max(1, (self.max_nodes // 4) // self.branch_length)
        while start < end:
            stop = min(end, start + step)
            remap = self.reserve((stop - start) * self.branch_length)
            if remap is not None:
                for w in (win, *other_windows):
                    remap_window(w, remap)
            extend_stream(self.arena, win, tokens, start, stop, stamp)
            start = stop

    def insert(self, tokens: np.ndarray, other_windows=()) -> None:
        """Count all n-grams of one whole sequence (int32) as a one-off stream."""
        self.extend(self.new_window(), np.ascontiguousarray(tokens, dtype=np.int32), 0,
                    len(tokens), self.tick(), other_windows)

    def reserve(self, need: int) -> np.ndarray | None:
        """Make room for ``need`` (<= max_nodes / 4) new nodes: grow the arena, or
        prune when the cap would be passed.

        Returns:
            ``None``, or after a prune an int32 ``(old num_nodes,)`` map from old to
            new node ids (-1 = evicted) for :func:`remap_window`.
        """
        remap = None
        n = self.num_nodes
        if n + need > self.max_nodes:
            remap = self.prune(min(3 * self.max_nodes // 4, self.max_nodes - need))
            n = self.num_nodes
        cap = int(self.arena[1])
        if n + need > cap:
            new_cap = min(self.max_nodes, max(2 * cap, _pow2(n + need)))
            old = self.nodes[:n].copy()
            self.arena = _new_arena(new_cap)
            self.nodes[:n] = old
            self.arena[0] = n
            _relink(self.arena)
        return remap

    def prune(self, target: int) -> np.ndarray:
        """Evict nodes until at most ``max(target, 1)`` remain (see class doc).

        Returns:
            int32 map from old to new node ids (-1 = evicted).
        """
        n = self.num_nodes
        self.num_prunes += 1
        nodes = self.nodes
        cnt = nodes[:n, CNT]
        if self.eviction == "frequency":
            cnt >>= 1
            score = (cnt.astype(np.int64) << 32) | nodes[:n, STAMP]
        else:
            score = (nodes[:n, STAMP].astype(np.int64) << 32) | cnt
        keep = np.ones(n, dtype=bool)
        if n > target:
            if target <= 1:
                keep[1:] = False
            else:
                thr = np.partition(score[1:], n - target)[n - target]
                keep[1:] = score[1:] >= thr
                if keep.sum() > target:  # ties at the threshold: drop them all
                    keep[1:] = score[1:] > thr
        new_id = (np.cumsum(keep) - 1).astype(np.int32)
        kept = nodes[:n][keep]
        kept[1:, PARENT] = new_id[kept[1:, PARENT]]
        nodes[:len(kept)] = kept
        self.arena[0] = len(kept)
        _relink(self.arena)
        return np.where(keep, new_id, -1).astype(np.int32)

    # ------------------------------------------------------------ queries
    def _node(self, seq) -> int:
        node = ROOT
        for t in seq:
            node = find_child(self.nodes, self.htab, node, int(t))
            if node < 0:
                break
        return node

    def count(self, seq) -> int:
        """Occurrences of n-gram ``seq`` (``()`` gives the number of tokens counted)."""
        node = self._node(seq)
        return 0 if node < 0 else int(self.nodes[node, CNT])

    def children(self, seq) -> dict[int, int]:
        """``{token: count}`` of the continuations of n-gram ``seq`` (empty if absent)."""
        node = self._node(seq)
        out: dict[int, int] = {}
        if node < 0:
            return out
        nodes = self.nodes
        c = nodes[node, CHILD]
        while c >= 0:
            out[int(nodes[c, TOK])] = int(nodes[c, CNT])
            c = nodes[c, SIB]
        return out


def remap_window(win: np.ndarray, remap: np.ndarray) -> None:
    """Re-map a stream's open windows in place after :meth:`FrequencyTrie.prune`."""
    ok = win >= 0
    win[ok] = remap[win[ok]]
