"""The retrieval-oracle bound: the most a single-chain retrieval proposer could accept.

Definition (computed with hindsight, exactly, no hashing). The replay context of an
output position ``g`` is everything before it in the *stream*: the prompts and outputs
of the earlier requests of the file (warm) followed by this request's prompt and its
output up to ``g``; in ``--cold`` mode only this request's prompt and output so far.
``L[g]`` is the largest ``n <= k_max`` such that the next ``n`` true tokens
``S[g:g+n]`` equal ``S[s:s+n]`` for some earlier start ``s < g`` that lies in the
context, i.e. an LZ77-style copy: copying from ``s`` may run on into the tokens it has
just drafted (``s + n > g``), which is how n-gram and suffix proposers extend a
periodic match. Copies never span two requests (requests are separated by unique
sentinels) and never run past the end of the output.

The oracle then replays the request teacher-forced: at output position ``p`` it drafts
``min(L[p], k)`` tokens, all accepted, plus one bonus token (none when the draft
reaches the end of the output), exactly as :mod:`vllm_specext.replay.simulate` counts
steps. Because ``L[g+1] >= L[g] - 1``, jumping as far as possible at each step is
optimal, so ``output tokens / oracle steps`` bounds the tau of any proposer whose
drafts are copies of its context (prompt lookup, suffix trees, PIA memory tries);
methods that invent tokens (Jacobi/lookahead pools, model heads) can exceed it.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def previous_factor_lengths(stream: np.ndarray, k_max: int) -> np.ndarray:
    """For every position ``g`` of ``stream``, the longest ``n <= k_max`` with
    ``stream[g:g+n] == stream[s:s+n]`` for some ``s < g``.

    Args:
        stream: int64 ``(N,)`` token ids; sentinels must be unique values (negative ids
            work) so that no match crosses them.
        k_max: the largest length of interest (>= 1).

    Returns:
        int32 ``(N,)`` lengths in ``[0, k_max]``.

    Cost: ``k_max`` sorts of ``N`` int64 keys (exact ranks of every n-gram, built by
    doubling one token at a time); about 0.1 s per million tokens per unit of ``k_max``.
    """
    n_tok = len(stream)
    lengths = np.zeros(n_tok, dtype=np.int32)
    if n_tok == 0:
        return lengths
    _, rank1 = np.unique(stream, return_inverse=True)
    rank1 = rank1.astype(np.int64)
    base = int(rank1.max()) + 1
    rank = rank1
    for n in range(1, k_max + 1):
        if n > 1:
            # rank of stream[i:i+n] from rank of stream[i:i+n-1] and token i+n-1
            rank = rank[:-1] * base + rank1[n - 1:]
        # inverse = compact rank of each n-gram (keeps the keys below N**2)
        _, first, rank = np.unique(rank, return_index=True, return_inverse=True)
        alive = (first[rank] < np.arange(len(rank))) & (lengths[: len(rank)] == n - 1)
        if not alive.any():
            break
        lengths[: len(rank)][alive] = n
    return lengths


def oracle_steps(lengths: np.ndarray, start: int, n_out: int, k: int) -> int:
    """Teacher-forced steps for one output of ``n_out`` tokens at ``stream[start:]``.

    Args:
        lengths: the output of :func:`previous_factor_lengths`.
        start: index of the first output token in the stream.
        n_out: output length in tokens.
        k: draft cap per step.

    Returns:
        The number of steps, each emitting ``min(L, k, left) + 1`` tokens (no bonus
        when the draft reaches the end).
    """
    pos = steps = 0
    while pos < n_out:
        draft = min(int(lengths[start + pos]), k, n_out - pos)
        pos += draft + (1 if pos + draft < n_out else 0)
        steps += 1
    return steps


def build_stream(requests: Sequence[tuple[Sequence[int], Sequence[int]]]
                 ) -> tuple[np.ndarray, list[int]]:
    """Concatenate ``(prompt, output)`` pairs as ``prompt + output + sentinel`` each.

    Returns:
        ``(stream, starts)``: int64 ``(N,)`` stream with sentinels ``-1, -2, ...``, and
        the index of each request's first output token.
    """
    parts: list[np.ndarray] = []
    starts: list[int] = []
    offset = 0
    for i, (prompt, output) in enumerate(requests):
        starts.append(offset + len(prompt))
        part = np.empty(len(prompt) + len(output) + 1, dtype=np.int64)
        part[: len(prompt)] = prompt
        part[len(prompt): -1] = output
        part[-1] = -(i + 1)
        parts.append(part)
        offset += len(part)
    stream = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return stream, starts


def oracle_request_steps(requests: Sequence[tuple[Sequence[int], Sequence[int]]],
                         ks: Sequence[int], cold: bool = False) -> dict[int, list[int]]:
    """Oracle steps of each request, in order, for each draft cap in ``ks``.

    Args:
        requests: ``(prompt_ids, output_ids)`` per request in file order.
        ks: draft caps (each >= 1).
        cold: context is the request alone (no earlier requests).

    Returns:
        ``{k: [steps of request 0, steps of request 1, ...]}``.
    """
    k_max = max(ks)
    out: dict[int, list[int]] = {k: [] for k in ks}
    groups = [[r] for r in requests] if cold else [list(requests)]
    for group in groups:
        stream, starts = build_stream(group)
        lengths = previous_factor_lengths(stream, k_max)
        for (_, output), start in zip(group, starts):
            for k in ks:
                out[k].append(oracle_steps(lengths, start, len(output), k))
    return out
