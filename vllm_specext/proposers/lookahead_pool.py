"""The n-gram pool of lookahead decoding (Fu et al., ICML 2024; ``hao-ai-lab/LookaheadDecoding``
``lade/decoding.py``, its ``token_map``), keyed by n-grams of 1..``max_key`` tokens.

Each key (a short n-gram) holds up to G *continuations* of ``width`` tokens (lade: the key
is one token and a continuation is the other N-1 tokens of an N-gram), most recently
inserted first. Inserting a continuation that the key already holds moves it to the front;
a key that already holds G continuations drops its oldest (lade's LRU guess set).

Storage (numpy arrays; the Python side grows them before each kernel call, so the numba
kernels never allocate):

* ``table``: uint64 ``(cap,)``, the open-addressing table of
  :mod:`~vllm_specext.proposers.ngram_index` (:func:`ngram_key`, :func:`table_get`,
  :func:`table_put`, :func:`table_grow`) from a key to the first slot of its list;
* ``links``: int32 ``(slots, 2)``, per slot (entry, next slot or -1); each key's list holds
  at most G slots; slots dropped by the G cap go to a free list;
* ``ents``: int32 ``(entries, width)``, continuation tokens. The continuation that follows
  one context position is stored once and linked from each of its keys (lengths
  1..max_key), so an entry can outlive the slots that pointed to it; entries are not
  reclaimed (they are bounded by the tokens and n-grams inserted).

Two keys whose 32-bit table tags agree share a list (about ``keys / 2**32`` of lookups):
the draft is then wrong and rejected by the verifier, never emitted.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit

from vllm_specext.proposers.ngram_index import ngram_key, table_get, table_grow, table_put

# meta counters of a pool
_KEYS, _SLOTS, _ENTS, _FREE = 0, 1, 2, 3


@njit(cache=True, inline="always")
def _same(ents, a, b) -> bool:
    for i in range(ents.shape[1]):
        if ents[a, i] != ents[b, i]:
            return False
    return True


@njit(cache=True)
def _new_slot(links, meta, e, nxt) -> int:
    s = meta[_FREE]
    if s >= 0:
        meta[_FREE] = links[s, 1]
    else:
        s = meta[_SLOTS]
        meta[_SLOTS] += 1
    links[s, 0] = e
    links[s, 1] = nxt
    return s


@njit(cache=True)
def _link(table, links, ents, meta, key, e, g) -> int:
    """Put entry ``e`` at the front of ``key``'s list (at most ``g`` slots). Returns 1 if it
    was linked, 0 if the list already held an equal continuation (which moves to the front)."""
    head = table_get(table, key)
    prev = -1
    cur = head
    count = 0
    while cur >= 0:
        if _same(ents, links[cur, 0], e):
            if prev >= 0:  # refresh: move to the front
                links[prev, 1] = links[cur, 1]
                links[cur, 1] = head
                table_put(table, key, cur)
            return 0
        count += 1
        prev = cur
        cur = links[cur, 1]
    s = _new_slot(links, meta, e, head)
    meta[_KEYS] += table_put(table, key, s)
    if count >= g:  # the list now holds g + 1 slots: free the oldest
        cur = s
        for _ in range(g - 1):
            cur = links[cur, 1]
        last = links[cur, 1]
        links[cur, 1] = -1
        links[last, 1] = meta[_FREE]
        meta[_FREE] = last
    return 1


@njit(cache=True)
def _add_context(table, links, ents, meta, tok, start, end, max_key, g) -> int:
    """Insert, for each position p in [start, end - width], the continuation
    ``tok[p:p+width]`` under the keys ``tok[p-m:p]``, m = 1..min(max_key, p).
    Returns the first position not inserted yet."""
    w = ents.shape[1]
    p = max(start, 1)
    while p + w <= end:
        e = meta[_ENTS]
        ents[e, :] = tok[p:p + w]
        meta[_ENTS] += 1
        used = 0
        for m in range(1, min(max_key, p) + 1):
            used += _link(table, links, ents, meta, ngram_key(tok, p - m, m), e, g)
        if used == 0:  # every key already held it: reuse the entry row
            meta[_ENTS] -= 1
        p += 1
    return p


@njit(cache=True)
def _add_grams(table, links, ents, meta, grams, g) -> None:
    """Insert each row of ``grams`` ``(n, 1 + width)``: continuation ``row[1:]`` under the
    one-token key ``row[:1]`` (lade's n-gram)."""
    for r in range(grams.shape[0]):
        e = meta[_ENTS]
        ents[e, :] = grams[r, 1:]
        meta[_ENTS] += 1
        if _link(table, links, ents, meta, ngram_key(grams[r], 0, 1), e, g) == 0:
            meta[_ENTS] -= 1


@njit(cache=True)
def draft_chain(pools, buf, n_ctx, max_key, cap, info) -> int:
    """Draft by chained pool lookups on ``buf``.

    Args:
        pools: tuple of ``(table, links, ents)``, searched in this order for each key length.
        buf: int32 ``(>= n_ctx + cap,)``; ``buf[:n_ctx]`` are the context's last tokens
            (``n_ctx >= 1``); the draft is written to ``buf[n_ctx:n_ctx + n]``.
        max_key: longest key tried (then shorter ones down to 1 token).
        cap: most draft tokens.
        info: int64 ``(2,)`` out: key length and pool index of the first lookup (0, -1
            when nothing matched).

    Returns:
        n, the draft length (0..cap). Each lookup takes the most recent continuation of
        the longest key (of ``buf[:n_ctx + drafted]``) found in any pool, then the next
        lookup continues from the end of what was drafted.
    """
    n = 0
    info[0] = 0
    info[1] = -1
    while n < cap:
        end = n_ctx + n
        slot = -1
        src = -1
        for m in range(min(max_key, end), 0, -1):
            key = ngram_key(buf, end - m, m)
            for i in range(len(pools)):
                if pools[i][0].size:
                    slot = table_get(pools[i][0], key)
                    if slot >= 0:
                        src = i
                        break
            if slot >= 0:
                if n == 0:
                    info[0] = m
                    info[1] = src
                break
        if slot < 0:
            break
        links, ents = pools[src][1], pools[src][2]
        e = links[slot, 0]
        take = min(ents.shape[1], cap - n)
        buf[end:end + take] = ents[e, :take]
        n += take
    return n


def _grown(arr: np.ndarray, rows: int) -> np.ndarray:
    """``arr`` with at least ``rows`` rows (doubling), old rows copied."""
    if rows <= arr.shape[0]:
        return arr
    new = np.empty((max(rows, 2 * arr.shape[0]),) + arr.shape[1:], dtype=arr.dtype)
    new[: arr.shape[0]] = arr
    return new


class NgramPool:
    """Key n-gram (1..``max_key`` tokens) -> up to G continuations of ``width`` tokens.

    Args:
        width: tokens per continuation (lade: N - 1), 1..64.
        max_key: longest key n-gram, 1..64.
        guess_set_size: G, most continuations per key (>= 1).

    Raises:
        ValueError: out-of-range arguments.

    Memory: per inserted context position one entry (``4 * width`` bytes) plus, per new
    (key, continuation) link, an 8-byte slot and 16-32 bytes of table; see :attr:`nbytes`.
    """

    def __init__(self, width: int, max_key: int, guess_set_size: int):
        if not (1 <= width <= 64 and 1 <= max_key <= 64 and guess_set_size >= 1):
            raise ValueError(f"need 1 <= width, max_key <= 64 and guess_set_size >= 1, got "
                             f"{width}, {max_key}, {guess_set_size}")
        self.width, self.max_key, self.g = int(width), int(max_key), int(guess_set_size)
        self.table = np.zeros(16, dtype=np.uint64)
        self.links = np.empty((16, 2), dtype=np.int32)
        self.ents = np.empty((16, self.width), dtype=np.int32)
        self.meta = np.array([0, 0, 0, -1], dtype=np.int64)

    def _reserve(self, links: int, entries: int) -> None:
        need = 2 * (int(self.meta[_KEYS]) + links)
        if need > self.table.size:
            self.table = table_grow(self.table, need)
        self.links = _grown(self.links, int(self.meta[_SLOTS]) + links)
        self.ents = _grown(self.ents, int(self.meta[_ENTS]) + entries)

    @property
    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(table, links, ents)`` for :func:`draft_chain` (valid until the next insert)."""
        return self.table, self.links, self.ents

    def add_context(self, tokens: np.ndarray, start: int, end: int) -> int:
        """Insert the n-grams of ``tokens[:end]`` whose continuation starts at a position
        >= ``start`` and ends by ``end`` (keys may reach back before ``start``).

        Args:
            tokens: int32 C-contiguous ``(>= end,)``.

        Returns:
            The first continuation start not inserted yet (pass it as the next ``start``).
        """
        todo = end - max(start, 1) - self.width + 1
        if todo <= 0:
            return start
        self._reserve(todo * self.max_key, todo)
        return int(_add_context(self.table, self.links, self.ents, self.meta, tokens, start,
                                end, self.max_key, self.g))

    def add_grams(self, grams: np.ndarray) -> None:
        """Insert n-grams, int32 ``(n, 1 + width)``: ``row[1:]`` under the key ``row[0]``."""
        if len(grams):
            self._reserve(len(grams), len(grams))
            _add_grams(self.table, self.links, self.ents, self.meta,
                       np.ascontiguousarray(grams, dtype=np.int32), self.g)

    def candidates(self, key: Sequence[int]) -> list[list[int]]:
        """The continuations held by the key n-gram ``key`` (1..max_key tokens), most
        recent first."""
        arr = np.asarray(key, dtype=np.int32)
        s = table_get(self.table, np.uint64(ngram_key(arr, 0, len(arr))))
        out = []
        while s >= 0:
            out.append(self.ents[self.links[s, 0]].tolist())
            s = int(self.links[s, 1])
        return out

    @property
    def num_entries(self) -> int:
        """Continuations stored (including those no key links any more)."""
        return int(self.meta[_ENTS])

    @property
    def nbytes(self) -> int:
        return self.table.nbytes + self.links.nbytes + self.ents.nbytes + self.meta.nbytes
