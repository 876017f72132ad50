"""The shared memory of ``memory_decoding``: a bounded frequency trie of token n-grams.

Design after PIA "Lookahead" (Zhao et al., "Lookahead: An Inference Acceleration
Framework for Large Language Model with Lossless Generation Accuracy", KDD 2024;
github alipay/PainlessInferenceAcceleration, ``lookahead/lookahead/common/lookahead_cache.py``),
re-built on one flat int32 array walked by numba kernels instead of Python dicts.

The trie holds every n-gram of length 1..``branch_length`` of the sequences fed to it;
a node's count is the number of occurrences of its n-gram. As in PIA, a sequence is
inserted as the branch of ``branch_length`` tokens that starts at each of its
positions. Walks follow best children, so rows are kept in best-child-first depth-first
order: the nodes a new branch creates are consecutive rows, and every growth or prune
of the arena renumbers all nodes in that order, so a walk reads memory in order.
Counts and stamps never increase from parent to child, so pruning by either keeps the
trie closed under prefixes.

Every node stores a 31-bit polynomial hash of its whole n-gram (``HASH``;
``hash(g + t) = hash(g) * B + t + 1 mod 2**31``, :func:`path_hash`), and the hash
table is keyed by it: the child ``t`` of node ``p`` sits at ``path_hash(hash(p), t)``,
and an n-gram read off a context is found with one probe (:func:`find_gram`) instead
of a walk from the root. A polynomial hash also extends to the left
(``hash(t + g) = (t + 1) * B**len(g) + hash(g)``), so the suffixes of a context are
hashed in one pass. A slot holds the node id (< 2**26) and 5 more bits of the
(scrambled) hash, so a probe reads a node row only when those agree: a lookup costs
about one cache miss, not one per slot of its probe run.

Arena layout (int32, 1-D; one array so a kernel call passes one argument)::

    [0] number of nodes (root included)  [1] node capacity  [2] hash slots
    [3] E, the number of extra words      [4] number of renumberings so far (node
                                          ids taken before one are stale after it)
    [HEADER : HEADER + E]                 extra words, the owner's (kept across growth
                                          and pruning; ``memory_decoding`` keeps its
                                          selection statistics there)
    [... : ... + 8 * capacity]            node table, row = (token, count, stamp,
                                          parent, best child, first child, next sibling,
                                          n-gram hash)
    [... : ... + slots]                   open-addressing table by n-gram hash: node id
                                          | hash tag << 26, -1 = empty
"""
from __future__ import annotations

import numba as nb
import numpy as np

# Columns of the node table; row 0 is the root.
TOK, CNT, STAMP, PARENT, BEST, CHILD, SIB, HASH = range(8)
NODE_FIELDS = 8
ROOT = 0
HEADER = 8
#: bytes per node of capacity: the node row plus two int32 hash slots
BYTES_PER_NODE = NODE_FIELDS * 4 + 2 * 4
#: n-gram hash of the root (the empty n-gram)
ROOT_HASH = 0
#: the polynomial hash's base (odd)
HASH_BASE = 0x5BD1E995
_LOW31 = 0x7FFFFFFF
_INT32_MAX = np.iinfo(np.int32).max
#: node ids fit in the low 26 bits of a hash slot (so max_nodes <= 2**26)
ID_BITS = 26
MAX_NODES = 1 << ID_BITS
_ID_MASK = MAX_NODES - 1


# Kernels index the arena directly: numba array views (slices, reshapes) cost a
# reference-count update each, several times a lookup's own work.
@nb.njit(cache=True, inline="always")
def node_base(arena):
    """Offset of the node table: field f of node c is ``arena[node_base + 8 * c + f]``."""
    return HEADER + np.int64(arena[3])


@nb.njit(cache=True, inline="always")
def _slot_base(arena):
    return HEADER + np.int64(arena[3]) + NODE_FIELDS * np.int64(arena[1])


@nb.njit(cache=True, inline="always")
def path_hash(h, tok):
    """The n-gram hash of (n-gram with hash ``h``) + ``tok`` (a token id >= 0)."""
    return (np.int64(h) * HASH_BASE + np.int64(tok) + 1) & _LOW31


@nb.njit(cache=True, inline="always")
def _scramble(h):
    """The n-gram hash's bits mixed for the table (slot and tag), 31 bits."""
    x = np.uint64(h) * np.uint64(0x9E3779B97F4A7C15)
    return np.int64((x ^ (x >> np.uint64(31))) >> np.uint64(33))


@nb.njit(cache=True, inline="always")
def _tag(x):
    """The scrambled hash bits a slot keeps next to the node id."""
    return (x >> ID_BITS) & 31


@nb.njit(cache=True, inline="always")
def _probe(arena, h, tok, parent):
    """Node with n-gram hash ``h`` and last token ``tok`` in the slot table, or
    ``-1 - slot`` of the empty slot where it would go; ``parent >= 0`` matches on the
    parent node instead of the hash (exact)."""
    nb_ = node_base(arena)
    hb = _slot_base(arena)
    mask = np.int64(arena[2]) - 1
    x = _scramble(h)
    tag = _tag(x)
    s = x & mask
    while True:
        e = arena[hb + s]
        if e < 0:
            return -1 - s
        if e >> ID_BITS == tag:
            c = e & _ID_MASK
            row = nb_ + NODE_FIELDS * c
            if arena[row + TOK] == tok and (arena[row + PARENT] == parent if parent >= 0
                                            else arena[row + HASH] == h):
                return c
        s = (s + 1) & mask


@nb.njit(cache=True, inline="always")
def find_child(arena, parent, tok):
    """Node id of child ``tok`` of ``parent`` (>= 0), or -1."""
    h = path_hash(arena[node_base(arena) + NODE_FIELDS * parent + HASH], tok)
    return max(_probe(arena, h, tok, parent), -1)


@nb.njit(cache=True, inline="always")
def find_gram(arena, h, tok):
    """Node of the n-gram with hash ``h`` and last token ``tok``, or -1 (two n-grams
    sharing both give either: a draft, never the counts, may follow the wrong one)."""
    return max(_probe(arena, h, tok, -1), -1)


@nb.njit(cache=True, inline="always")
def _bump(arena, nb_, hb, parent, tok, h, stamp):
    """Count one occurrence of child ``tok`` (n-gram hash ``h``) of ``parent``,
    created if missing; ``nb_`` / ``hb``: node table / slot offsets."""
    c = _probe(arena, h, tok, parent)
    prow = nb_ + NODE_FIELDS * parent
    if c < 0:
        s = -1 - c
        c = arena[0]
        arena[0] += 1
        row = nb_ + NODE_FIELDS * c
        arena[row + TOK] = tok
        arena[row + CNT] = 0
        arena[row + STAMP] = stamp
        arena[row + PARENT] = parent
        arena[row + BEST] = -1
        arena[row + CHILD] = -1
        arena[row + SIB] = arena[prow + CHILD]
        arena[row + HASH] = h
        arena[prow + CHILD] = c
        arena[hb + s] = c | (_tag(_scramble(h)) << ID_BITS)
    row = nb_ + NODE_FIELDS * c
    if arena[row + CNT] < _INT32_MAX:
        arena[row + CNT] += 1
    if arena[row + STAMP] < stamp:
        arena[row + STAMP] = stamp
    b = arena[prow + BEST]
    if b < 0 or arena[row + CNT] >= arena[nb_ + NODE_FIELDS * b + CNT]:
        arena[prow + BEST] = c  # ties: the most recently counted
    return c


@nb.njit(cache=True)
def insert_branches(arena, tokens, start, end, depth, stamp):
    """Count the n-grams (length <= ``depth``) of ``tokens`` that start at positions
    ``start..end-1``. The caller reserves ``(end - start) * depth`` free nodes first.
    Hashes come from the tokens, not the parent rows, so the probes of a branch do not
    wait on each other's cache misses."""
    nb_ = node_base(arena)
    hb = _slot_base(arena)
    n = tokens.shape[0]
    for i in range(start, end):
        node = ROOT
        h = np.int64(ROOT_HASH)
        for j in range(i, min(i + depth, n)):
            h = path_hash(h, tokens[j])
            node = _bump(arena, nb_, hb, node, tokens[j], h, stamp)
        if arena[nb_ + CNT] < _INT32_MAX:
            arena[nb_ + CNT] += 1


@nb.njit(cache=True)
def match(arena, a, a_off, a_len, b, b_off, b_len, max_q):
    """Node of the longest suffix (<= ``max_q`` tokens) of the sequence
    ``a[a_off:a_off+a_len] + b[b_off:b_off+b_len]`` that is in the trie and has
    children. Suffixes are tried shortest first, one hash probe each, until one is
    missing (the trie holds every substring of what it counted, so no longer one is
    there either). Returns ``(node, q)``, ``(-1, 0)`` if none."""
    end = a_len + b_len
    best, best_q = -1, 0
    if end == 0:
        return best, best_q
    nb_ = node_base(arena)
    h = np.int64(ROOT_HASH)
    pw = np.int64(1)
    last = a[a_off + end - 1] if b_len == 0 else b[b_off + b_len - 1]
    for q in range(1, min(max_q, end) + 1):
        i = end - q
        t = a[a_off + i] if i < a_len else b[b_off + i - a_len]
        h = (h + (np.int64(t) + 1) * pw) & _LOW31
        pw = (pw * HASH_BASE) & _LOW31
        node = find_gram(arena, h, last)
        if node < 0:
            break
        if arena[nb_ + NODE_FIELDS * node + BEST] >= 0:
            best, best_q = node, q
    return best, best_q


@nb.njit(cache=True)
def _best_first_order(arena):
    """Node ids in depth-first order, each node's best child right after it: a chain
    of best children becomes consecutive rows. int64 ``(num_nodes,)``, root first."""
    nb_ = node_base(arena)
    n = arena[0]
    order = np.empty(n, dtype=np.int64)
    stack = np.empty(n, dtype=np.int64)
    stack[0] = ROOT
    top = 1
    m = 0
    while top > 0:
        top -= 1
        u = stack[top]
        order[m] = u
        m += 1
        b = arena[nb_ + NODE_FIELDS * u + BEST]
        c = arena[nb_ + NODE_FIELDS * u + CHILD]
        while c >= 0:
            if c != b:
                stack[top] = c
                top += 1
            c = arena[nb_ + NODE_FIELDS * c + SIB]
        if b >= 0:
            stack[top] = b
            top += 1
    return order[:m]


@nb.njit(cache=True)
def _relink(arena):
    """Rebuild hash slots, child lists and best children of all nodes."""
    nb_ = node_base(arena)
    hb = _slot_base(arena)
    slots = np.int64(arena[2])
    mask = slots - 1
    n = arena[0]
    for s in range(slots):
        arena[hb + s] = -1
    for c in range(n):
        arena[nb_ + NODE_FIELDS * c + BEST] = -1
        arena[nb_ + NODE_FIELDS * c + CHILD] = -1
    for c in range(1, n):
        row = nb_ + NODE_FIELDS * c
        prow = nb_ + NODE_FIELDS * arena[row + PARENT]
        arena[row + SIB] = arena[prow + CHILD]
        arena[prow + CHILD] = c
        x = _scramble(arena[row + HASH])
        s = x & mask
        while arena[hb + s] >= 0:
            s = (s + 1) & mask
        arena[hb + s] = c | (_tag(x) << ID_BITS)
        b = arena[prow + BEST]
        if b < 0 or arena[row + CNT] > arena[nb_ + NODE_FIELDS * b + CNT]:
            arena[prow + BEST] = c  # ties: the lowest id, after a renumbering the old best


def load_relayout_kernels() -> None:
    """Renumber a throwaway trie once, so that the compiled code of
    :func:`_best_first_order` and :func:`_relink` (called only when a trie grows or is
    pruned, which a short warm-up request does not reach) is loaded before serving
    rather than in the step that first grows the trie."""
    FrequencyTrie(1, 64)._relayout()


def _pow2(n: int) -> int:
    """Smallest power of two >= max(n, 2)."""
    return 1 << max(int(n) - 1, 1).bit_length()


def _new_arena(cap: int, extra: int) -> np.ndarray:
    """A zeroed arena whose node rows start on 64-byte boundaries (a row never spans
    two cache lines); ``extra`` is rounded up to keep that alignment."""
    slots = 2 * _pow2(cap)
    extra = -(-(HEADER + extra) // 16) * 16 - HEADER
    start = HEADER + extra
    size = start + NODE_FIELDS * cap + slots
    raw = np.zeros(size + 16, dtype=np.int32)
    skip = (-raw.ctypes.data // 4) % 16
    arena = raw[skip:skip + size]
    arena[:5] = (1, cap, slots, extra, 0)
    arena[start:start + NODE_FIELDS] = (-1, 0, 0, -1, -1, -1, -1, ROOT_HASH)  # the root
    arena[start + NODE_FIELDS * cap:] = -1
    return arena


class FrequencyTrie:
    """Frequency trie of n-grams (length 1..``branch_length``), bounded to ``max_nodes``.

    Storage: one int32 arena (module doc); capacity doubles from 4096 nodes up to
    ``max_nodes``, :data:`BYTES_PER_NODE` (40) bytes per node of capacity, plus
    ``extra_words`` int32 words for the owner (:attr:`extra`).

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
        extra_words: int32 words kept in the arena for the owner, zeroed (>= 0;
            rounded up for alignment).

    Raises:
        ValueError: an argument out of range.
    """

    def __init__(self, branch_length: int = 16, max_nodes: int = 1 << 20,
                 eviction: str = "frequency", extra_words: int = 0):
        if branch_length < 1:
            raise ValueError("branch_length must be >= 1")
        if not 64 <= max_nodes <= MAX_NODES:
            raise ValueError(f"max_nodes must be in [64, {MAX_NODES}]")
        if eviction not in ("frequency", "age"):
            raise ValueError("eviction must be 'frequency' or 'age'")
        if extra_words < 0:
            raise ValueError("extra_words must be >= 0")
        self.branch_length = int(branch_length)
        self.max_nodes = int(max_nodes)
        self.eviction = eviction
        self.arena = _new_arena(min(self.max_nodes, 1 << 12), int(extra_words))
        self.clock = 0
        self.num_prunes = 0

    # ------------------------------------------------------------ views
    @property
    def extra(self) -> np.ndarray:
        """The owner's int32 words (a view of the current arena)."""
        return self.arena[HEADER:HEADER + int(self.arena[3])]

    @property
    def nodes(self) -> np.ndarray:
        """int32 ``(capacity, 8)`` node table (a view; rows ``[0, num_nodes)`` valid)."""
        start = HEADER + int(self.arena[3])
        cap = int(self.arena[1])
        return self.arena[start:start + NODE_FIELDS * cap].reshape(cap, NODE_FIELDS)

    @property
    def htab(self) -> np.ndarray:
        start = HEADER + int(self.arena[3]) + NODE_FIELDS * int(self.arena[1])
        return self.arena[start:start + int(self.arena[2])]

    @property
    def num_nodes(self) -> int:
        return int(self.arena[0])

    @property
    def nbytes(self) -> int:
        return self.arena.nbytes

    # ------------------------------------------------------------ updates
    def insert(self, tokens) -> None:
        """Count all n-grams (length <= ``branch_length``) of one sequence (ints), in
        chunks of at most ``max_nodes / 4`` new nodes (pruning in between if needed).
        The sequence's stamp is a fresh clock value."""
        tokens = np.ascontiguousarray(tokens, dtype=np.int32)
        self.clock += 1
        step = max(1, (self.max_nodes // 4) // self.branch_length)
        for start in range(0, len(tokens), step):
            stop = min(len(tokens), start + step)
            self.reserve((stop - start) * self.branch_length)
            insert_branches(self.arena, tokens, start, stop, self.branch_length, self.clock)

    def reserve(self, need: int) -> None:
        """Make room for ``need`` (<= max_nodes / 4) new nodes: grow the arena, or
        prune when the cap would be passed."""
        n = self.num_nodes
        if n + need > self.max_nodes:
            self.prune(min(3 * self.max_nodes // 4, self.max_nodes - need))
            n = self.num_nodes
        cap = int(self.arena[1])
        if n + need > cap:
            new_cap = min(self.max_nodes, max(2 * cap, _pow2(n + need)))
            old, extra, epoch = self.nodes[:n].copy(), self.extra.copy(), self.arena[4]
            self.arena = _new_arena(new_cap, len(extra))
            self.arena[4] = epoch
            self.extra[:] = extra
            self.nodes[:n] = old  # links intact (same ids): renumber, then rebuild
            self.arena[0] = n
            self._relayout()

    def _relayout(self) -> None:
        """Renumber the nodes in :func:`_best_first_order`."""
        order = _best_first_order(self.arena)
        new_id = np.empty(len(order), dtype=np.int32)
        new_id[order] = np.arange(len(order), dtype=np.int32)
        rows = self.nodes[order]
        rows[1:, PARENT] = new_id[rows[1:, PARENT]]
        self.nodes[:len(rows)] = rows
        self.arena[4] += 1
        _relink(self.arena)

    def prune(self, target: int) -> None:
        """Evict nodes until at most ``max(target, 1)`` remain (see class doc), then
        renumber the survivors (:meth:`_relayout`)."""
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
        self._relayout()

    # ------------------------------------------------------------ queries
    def _node(self, seq) -> int:
        node = ROOT
        for t in seq:
            node = find_child(self.arena, node, int(t))
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
