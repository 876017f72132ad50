"""Incremental n-gram index for prompt lookup decoding (no per-step context rescans).

Prompt lookup (Saxena 2023, ``apoorvumang/prompt-lookup-decoding``; vLLM's ``ngram``
method) drafts the tokens that followed an earlier occurrence of the context's suffix
n-gram. vLLM rescans the whole context every step (KMP, O(L) per request). Here each
stream keeps a hash table from n-gram to *the position right after its most recent
earlier occurrence*, updated as tokens are committed:

* update: O(new tokens x (max_n - min_n + 1)). One rolling polynomial hash per n
  (mod 2**64) is advanced per token; when token ``t`` arrives, the n-grams that end at
  ``t - 1`` are inserted with value ``t``. Inserting one step late means the current
  suffix never matches itself.
* lookup: at most max_n - min_n + 1 probes. The (min_n)-gram suffix goes first (if it
  never occurred, no longer suffix did), then n = max_n down; a hit is verified against
  the real tokens (hash collisions give a miss, never a wrong draft).

The draft continues from the match position ``s``. When the continuation runs into the
end of the stream (length ``M``), the match and the suffix are the same n-gram shifted
by ``p = M - s``, i.e. the stream's tail has period ``p``; the draft extends that
pattern: ``draft[i] = V[s + i % p]``. This equals applying the lookup rule again after
each drafted token, so a repeated pattern is drafted to full length.

The table is open addressing with linear probing in one uint64 array per stream (a
32-bit tag of the key -- the rolling hash mixed with ``n`` -- and a 31-bit value share a
word, so a probe is one cache miss; 0 marks an empty slot), doubled when the load would
pass 1/2. :class:`NgramIndex` holds the tables of many streams and
serves a batch of lookups in one numba call. The table primitives
(:func:`ngram_key`, :func:`table_get`, :func:`table_put`, :func:`table_grow`) are
public so that other proposers can key their own pools by n-gram.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit, types
from numba.typed import List

#: longest n-gram the index supports
MAX_NGRAM = 64

_MASK64 = (1 << 64) - 1
_BASE_INT = 0x9E3779B97F4A7C15  # odd multiplier of the polynomial hash
_BASE = np.uint64(_BASE_INT)
#: _POW[n] = _BASE ** n mod 2**64
_POW = np.array([pow(_BASE_INT, n, 1 << 64) for n in range(MAX_NGRAM + 1)], dtype=np.uint64)
_N_SALT = np.uint64(0xD6E8FEB86659FD93)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_ZERO = np.uint64(0)
_TOP = np.uint64(1 << 63)
_VALUE_MASK = np.uint64((1 << 31) - 1)
_TAG_MASK = np.uint64(_MASK64 ^ ((1 << 31) - 1))
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
_EMPTY_I32 = np.zeros(0, dtype=np.int32)
_EMPTY_TABLE = np.zeros(0, dtype=np.uint64)
_MIN_TABLE = 16
_BULK = 64  # catch-ups longer than this (prompts) size the table once up front


# ------------------------------------------------------------------ hashing
@njit(cache=True, inline="always")
def _tok(x) -> np.uint64:
    """A token id (any int) as the uint64 digit of the polynomial hash."""
    return np.uint64(np.int64(x))


@njit(cache=True, inline="always")
def _mix(h: np.uint64, n: int) -> np.uint64:
    """Table key of an n-gram from its polynomial hash ``h`` and length ``n``."""
    z = h ^ (np.uint64(n) * _N_SALT)
    z = (z ^ (z >> _S30)) * _MIX1  # splitmix64 finalizer
    z = (z ^ (z >> _S27)) * _MIX2
    return z ^ (z >> _S31)


@njit(cache=True)
def ngram_key(tokens: np.ndarray, start: int, n: int) -> np.uint64:
    """Table key of ``tokens[start:start+n]`` (the key :class:`NgramIndex` uses).

    Args:
        tokens: 1-D integer array of token ids.
        start, n: the n-gram's first position and length (``1 <= n <= MAX_NGRAM``).

    Returns:
        A uint64; equal n-grams get equal keys.
    """
    h = _ZERO
    for i in range(start, start + n):
        h = h * _BASE + _tok(tokens[i])
    return _mix(h, n)


# ------------------------------------------------------------------ hash table
# One uint64 word per slot (one cache miss per probe, 8 bytes): bits 31..63 are the
# key's tag (its bits 31..62, bit 63 set so that a used word is never 0), bits 0..30 the
# value. The home slot is taken from the tag, so the table can be rehashed from the
# words alone. Two n-grams whose tags agree (32 bits) share one entry; the lookup's
# token check turns that into a miss (about entries / 2**32 of the n-grams).
@njit(cache=True, inline="always")
def _tag(key: np.uint64) -> np.uint64:
    return (key | _TOP) & _TAG_MASK


@njit(cache=True, inline="always")
def _home(tag: np.uint64, mask: int) -> int:
    return np.int64((tag >> _S31) & np.uint64(mask))


@njit(cache=True, inline="always")
def _probe(table: np.ndarray, key: np.uint64) -> int:
    """Index of ``key``'s word in ``table``, or of the empty slot where it would go."""
    mask = table.size - 1
    tag = _tag(key)
    i = _home(tag, mask)
    while table[i] != _ZERO and (table[i] & _TAG_MASK) != tag:
        i = (i + 1) & mask
    return i


@njit(cache=True)
def table_get(table: np.ndarray, key: np.uint64) -> int:
    """Value stored under ``key``, or -1.

    Args:
        table: uint64 ``(cap,)``, cap a power of two, 0 = empty, load <= 1/2.
        key: uint64 from :func:`ngram_key` (from Python pass ``np.uint64(key)``: numba
            returns keys as Python ints).
    """
    i = _probe(table, key)
    return np.int64(table[i] & _VALUE_MASK) if table[i] != _ZERO else -1


@njit(cache=True)
def table_put(table: np.ndarray, key: np.uint64, val: int) -> int:
    """Set ``key`` -> ``val`` (``0 <= val < 2**31``) in place, overwriting.

    Returns 1 if the key is new, else 0. The caller keeps the load at most 1/2 by
    calling :func:`table_grow` first when ``2 * (count + 1) > table.size``.
    """
    i = _probe(table, key)
    new = table[i] == _ZERO
    table[i] = _tag(key) | np.uint64(val)
    return 1 if new else 0


@njit(cache=True)
def table_grow(table: np.ndarray, min_cap: int = 0) -> np.ndarray:
    """Rehash into a new table of twice the capacity (at least ``min_cap``, >= 16).

    Returns:
        uint64 ``(cap,)``, cap a power of two.
    """
    cap = max(2 * table.size, _MIN_TABLE)
    while cap < min_cap:
        cap *= 2
    mask = cap - 1
    grown = np.zeros(cap, dtype=np.uint64)
    for i in range(table.size):
        w = table[i]
        if w != _ZERO:
            j = _home(w & _TAG_MASK, mask)
            while grown[j] != _ZERO:
                j = (j + 1) & mask
            grown[j] = w
    return grown


# ------------------------------------------------------------------ index kernels
@njit(cache=True, inline="always")
def _at(tok: np.ndarray, length: int, extra: np.ndarray, i: int):
    """Token ``i`` of the virtual stream ``tok[:length] ++ extra``."""
    return tok[i] if i < length else extra[i - length]


@njit(cache=True)
def _catch_up(tok, table, h, start, length, count, min_n, max_n):
    """Index tokens ``tok[start:length]`` into ``table`` and the rolling hashes ``h``.

    Returns ``(table, count)``: the table (a new array if it had to grow) and its entries.
    """
    bound = count + (length - start) * (max_n - min_n + 1)  # entries after this call, at most
    if length - start > _BULK and 2 * bound > table.size:
        table = table_grow(table, 2 * bound)  # one rehash instead of repeated doubling
    for t in range(start, length):
        x = _tok(tok[t])
        for j in range(max_n - min_n + 1):
            n = min_n + j
            if t >= n:
                if 2 * (count + 1) > table.size:
                    table = table_grow(table, 0)
                count += table_put(table, _mix(h[j], n), t)
                h[j] = h[j] * _BASE + x - _tok(tok[t - n]) * _POW[n]
            else:
                h[j] = h[j] * _BASE + x
    return table, count


@njit(cache=True)
def _draft_from(tok, length, extra, s, n, cap, out) -> bool:
    """If ``V[s-n:s]`` equals the suffix n-gram of ``V = tok[:length] ++ extra``, write the
    periodic continuation ``out[i] = V[s + i % (len(V) - s)]``, ``i < cap``; return the check."""
    total = length + extra.size
    for i in range(n):  # hash collisions must not yield a wrong draft
        if _at(tok, length, extra, s - n + i) != _at(tok, length, extra, total - n + i):
            return False
    period = total - s
    for i in range(cap):
        out[i] = _at(tok, length, extra, s + i % period)
    return True


@njit(cache=True)
def _lookup(tok, length, table, h0, extra, min_n, max_n, cap, out) -> int:
    """Draft ``cap`` tokens into ``out`` for stream ``tok[:length] ++ extra``; returns the
    matched suffix length ``n`` (``min_n <= n <= max_n``), or 0 for no draft."""
    total = length + extra.size
    if min_n > total or table.size == 0:
        return 0
    h = h0.copy() if extra.size else h0
    for e in range(extra.size):  # roll the suffix hashes over the uncommitted tokens
        t = length + e
        x = _tok(extra[e])
        for j in range(max_n - min_n + 1):
            n = min_n + j
            old = _tok(_at(tok, length, extra, t - n)) if t >= n else _ZERO
            h[j] = h[j] * _BASE + x - old * _POW[n]
    # an n-gram occurs only where its suffix (min_n)-gram does: probe that first
    s_min = table_get(table, _mix(h[0], min_n))
    if s_min < 0:
        return 0
    for j in range(max_n - min_n, 0, -1):  # then longest first
        n = min_n + j
        if n <= total:
            s = table_get(table, _mix(h[j], n))
            if s >= 0 and _draft_from(tok, length, extra, s, n, cap, out):
                return n
    return min_n if _draft_from(tok, length, extra, s_min, min_n, cap, out) else 0


@njit(cache=True)
def _propose_batch(toks, tables, lens, pos, count, hashes, slots, caps,
                   extra, extra_off, min_n, max_n, out, out_n):
    """Catch up and look up every stream of the batch (one numba call per batch); row
    ``b``'s matched n-gram length goes to ``out_n[b]`` (0: no draft; else ``out[b]`` holds
    ``caps[b]`` drafted tokens)."""
    for b in range(slots.size):
        s = slots[b]
        tok = toks[s]
        table = tables[s]
        if pos[s] < lens[s]:
            grown, count[s] = _catch_up(tok, table, hashes[s], pos[s], lens[s], count[s],
                                        min_n, max_n)
            pos[s] = lens[s]
            if grown.size != table.size:
                tables[s] = grown
                table = grown
        out_n[b] = 0
        if caps[b] > 0:
            out_n[b] = _lookup(tok, lens[s], table, hashes[s],
                               extra[extra_off[b]:extra_off[b + 1]], min_n, max_n,
                               caps[b], out[b])


# ------------------------------------------------------------------ multi-stream index
class NgramIndex:
    """Incremental n-gram indexes of many append-only token streams, one slot each.

    Each stream's tokens stay owned by the caller (e.g. a :class:`TokenBuffer`'s
    ``storage``): the index keeps a reference and reads ``tokens[:length]``, which must
    not change afterwards except by appending. New tokens are indexed lazily, inside
    the next :meth:`propose` that includes the stream, so :meth:`set_tokens` is O(1).

    Lookup rule: the longest ``n`` in ``[min_n, max_n]`` whose suffix n-gram occurred
    earlier (ending at or before position ``length - 2``), using its most recent
    occurrence; the draft is the continuation, periodically extended (module docstring).

    Args:
        min_n, max_n: shortest and longest suffix n-gram to match,
            ``1 <= min_n <= max_n <= MAX_NGRAM``.

    Raises:
        ValueError: bad ``min_n``/``max_n``.

    Streams must stay shorter than 2**31 tokens (positions are 31-bit table values).
    Cost (numba, one thread): about 50-120 ns per indexed token (4 n-gram sizes), and
    well under 1 us per stream per lookup, independent of the stream length
    (``benchmarks/ngram_cost.py``).

    Memory: per stream, a uint64 table of 2-4 slots per distinct n-gram (at most
    ``max_n - min_n + 1`` n-grams per token), i.e. 16-32 bytes per n-gram.
    """

    def __init__(self, min_n: int, max_n: int):
        if not 1 <= min_n <= max_n <= MAX_NGRAM:
            raise ValueError(f"need 1 <= min_n <= max_n <= {MAX_NGRAM}, got "
                             f"min_n={min_n}, max_n={max_n}")
        self.min_n, self.max_n = int(min_n), int(max_n)
        self._toks = List.empty_list(types.int32[::1])
        self._tables = List.empty_list(types.uint64[::1])
        self._tok_ref: list[np.ndarray | None] = []
        self._free: list[int] = []
        self._lens = np.zeros(0, dtype=np.int64)    # committed length per slot
        self._pos = np.zeros(0, dtype=np.int64)     # tokens already indexed per slot
        self._count = np.zeros(0, dtype=np.int64)   # table entries per slot
        self._hashes = np.zeros((0, max_n - min_n + 1), dtype=np.uint64)  # rolling hashes

    # ---------------------------------------------------------------- streams
    def add(self, tokens: np.ndarray, length: int) -> int:
        """Start a stream over ``tokens[:length]`` (see :meth:`set_tokens`); returns its slot."""
        if self._free:
            slot = self._free.pop()
        else:
            slot = len(self._tok_ref)
            self._tok_ref.append(None)
            self._toks.append(_EMPTY_I32)
            self._tables.append(_EMPTY_TABLE)
            if slot >= self._lens.size:
                grow = max(16, self._lens.size)
                self._lens = np.concatenate([self._lens, np.zeros(grow, np.int64)])
                self._pos = np.concatenate([self._pos, np.zeros(grow, np.int64)])
                self._count = np.concatenate([self._count, np.zeros(grow, np.int64)])
                self._hashes = np.concatenate(
                    [self._hashes, np.zeros((grow, self._hashes.shape[1]), np.uint64)])
        self._pos[slot] = self._count[slot] = 0
        self._hashes[slot] = 0
        self._tables[slot] = np.zeros(_MIN_TABLE, dtype=np.uint64)
        self.set_tokens(slot, tokens, length)
        return slot

    def set_tokens(self, slot: int, tokens: np.ndarray, length: int) -> None:
        """Tell the index that stream ``slot`` is now ``tokens[:length]`` (appended to).

        ``tokens`` may be a new array (e.g. after the caller's buffer grew) whose first
        tokens equal the old ones. O(1); the new tokens are indexed on the next lookup.

        Raises:
            ValueError: ``tokens`` is not a C-contiguous int32 vector of >= ``length``.
        """
        if tokens is not self._tok_ref[slot]:
            if (not isinstance(tokens, np.ndarray) or tokens.dtype != np.int32
                    or tokens.ndim != 1 or not tokens.flags.c_contiguous
                    or len(tokens) < length):
                raise ValueError("tokens must be a C-contiguous 1-D int32 array with "
                                 ">= length entries")
            self._toks[slot] = tokens
            self._tok_ref[slot] = tokens
        self._lens[slot] = length

    def remove(self, slot: int) -> None:
        """Forget stream ``slot`` and free its table; the slot may be reused by :meth:`add`."""
        self._toks[slot] = _EMPTY_I32
        self._tables[slot] = _EMPTY_TABLE
        self._tok_ref[slot] = None
        self._lens[slot] = 0
        self._free.append(slot)

    def nbytes(self, slot: int) -> int:
        """Bytes of stream ``slot``'s table and hash state (not its tokens)."""
        return self._tables[slot].nbytes + self._hashes.shape[1] * 8 + 24

    # ---------------------------------------------------------------- lookup
    def propose(self, slots: Sequence[int] | np.ndarray, max_tokens: Sequence[int] | np.ndarray,
                extra: np.ndarray | None = None, extra_offsets: np.ndarray | None = None,
                matched: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Index pending tokens and draft for a batch of streams in one numba call.

        Args:
            slots: ``(B,)`` slots from :meth:`add`.
            max_tokens: ``(B,)`` draft length caps (<= 0: no draft).
            extra: optional int32 ``(E,)`` uncommitted tokens appended after each
                stream for the lookup only (e.g. MTP drafts): stream ``b`` is looked up
                as ``tokens[:length] ++ extra[extra_offsets[b]:extra_offsets[b+1]]``.
                They are matched against and drafted from, but never indexed.
            extra_offsets: int64 ``(B + 1,)``, required with ``extra``.
            matched: optional int64 ``(B,)`` output: filled with the length ``n`` of the
                suffix n-gram each stream's draft continues (``min_n..max_n``; 0 where
                there is no draft).

        Returns:
            ``(drafts, lengths)``: int32 ``(B, max(max_tokens))`` and int64 ``(B,)``;
            stream ``b``'s draft is ``drafts[b, :lengths[b]]`` (length 0 or its cap).
        """
        slots = np.asarray(slots, dtype=np.int64)
        caps = np.asarray(max_tokens, dtype=np.int64)
        nb = slots.size
        if extra is None:
            extra, extra_offsets = _EMPTY_I32, np.zeros(nb + 1, dtype=np.int64)
        extra = np.ascontiguousarray(extra, dtype=np.int32)
        extra_offsets = np.asarray(extra_offsets, dtype=np.int64)
        out = np.empty((nb, max(int(caps.max()) if nb else 0, 1)), dtype=np.int32)
        if matched is None:
            matched = np.zeros(nb, dtype=np.int64)
        elif matched.dtype != np.int64 or matched.shape != (nb,):
            raise ValueError(f"matched must be an int64 array of shape ({nb},)")
        if nb:
            _propose_batch(self._toks, self._tables, self._lens, self._pos, self._count,
                           self._hashes, slots, caps, extra, extra_offsets,
                           self.min_n, self.max_n, out, matched)
        return out, np.where(matched > 0, caps, 0)

    def lookup(self, slot: int, max_tokens: int, extra: Sequence[int] = ()) -> np.ndarray:
        """Draft for one stream, optionally with uncommitted ``extra`` tokens appended.

        Returns:
            int32 ``(0,)`` or ``(max_tokens,)`` (see :meth:`propose`).
        """
        ext = np.asarray(extra, dtype=np.int32)
        out, n = self.propose([slot], [max_tokens], ext, np.array([0, ext.size], np.int64))
        return out[0, : n[0]]
