"""``suffix``: SuffixDecoding (Oliaro et al., NeurIPS 2025; ArcticInference) in numpy/numba.

Each active request has a suffix tree over its prompt and committed output, and one
global tree holds the outputs of active and finished requests, FIFO-capped
(:mod:`vllm_specext.proposers.suffix_tree`). As in ArcticInference's
``SuffixDecodingCache``, an active request's output enters the global tree as it grows, so
concurrent requests draft from each other. Unlike it, aborted and preempted requests
(``stop_request(finished=False)``) are removed from the global tree, the cap counts
finished outputs only, and reusing a request id never evicts another request's output.

Drafting ("voting"). Arctic drafts from the single match length ``m`` (and tree) whose
greedy path scores best (sum of path probabilities). Here every matched suffix votes:

* voters are the context's suffixes of length m = 1 .. min(len, max_tree_depth) - 1
  found in the request tree (with at least one earlier occurrence) and in the global
  tree (from the request's own output states, then walks from the root until the first
  miss); a voter's support ``s`` is its occurrence count, without the context's own
  occurrence (which has no continuation);
* each voter gives each of its next tokens ``count(child) / (s + ALPHA)`` (its best child
  and up to ``MAX_CHILDREN`` others), times the *local weight* ``lw`` for request-tree
  voters; the token with the most votes is drafted, its share of all votes multiplies
  the path probability, and only the voters that predicted it continue, one token deeper;
* drafting stops at ``min(k, int(longest match * max_spec_factor + offset))`` tokens,
  when the path probability falls below ``min_token_prob``, or when no voter is left;
* where the vote drafts nothing (no voter, a budget of 0, or the first token below
  ``min_token_prob``), the rest of the request's last draft past the token the target
  model replaced is drafted instead (``rejected_tail``;
  :mod:`~vllm_specext.proposers.rejected_tail`);
* the draft's kind for adaptive speculation (``last_kinds``) is its longest match,
  whether that match is the request's own, and how sure the first token's vote was
  (:func:`draft_kind`).

The local weight is one number per proposer, learned online: each update takes one
gradient step on ``log lw`` of the log-probability that the request's last first-token
vote (the mixture ``lw * L + G`` of request-tree and global-tree votes) gave the token
that was committed (:func:`learn_local_weight`). At the end of the traces it is 3-5 on
Spec-Bench, MT-Bench, RAG and CNN/DM (the request's own text predicts best), 1.5-2.4 on
CodeQwen and 0.4 on OpenHands (past outputs predict best).

The tree draft (:meth:`SuffixProposer.propose_tree`, offline replay only) expands the
same vote distributions best-first by path probability.

Indexing is lazy: ``update`` only stores the committed tokens (and takes the local
weight's learning step), and a request's new tokens enter its tree and the global tree when
it is next drafted for (``propose`` with a cap above 0; all such requests are indexed before
any is drafted) or when it finishes. Inside vLLM the adaptive controller asks for drafts of a
request whose drafts keep being withheld only every few steps, so its tokens are indexed
a few at a time, in one call instead of one call per step (per 32-row step on CPU the
trees' update had cost 0.38 ms of the drafter's 1.04 ms, almost all of it per call, not per
token: a tree depth of 6 instead of 24 saved 0.01 ms per call); other requests then draft
from its output as of its last draft.

Measured (``benchmarks/suffix_vs_arctic.py``, k = 8, the six files of
``shared/traces``): with Arctic's own scoring rule this tree reproduced Arctic's tau
(ties aside); voting at the same explicit parameters (before ``rejected_tail``) gave tau
1.003-1.019x Arctic's on every file, and voting is what lets the defaults of
:class:`~vllm_specext.config.SuffixConfig` reach 1.15x on the OpenHands trace (the
scoring rule at the same defaults: 1.10x). The learned local weight, against a fixed
weight of 1, at the defaults: tau +1.0% Spec-Bench, +1.3% RAG, +0.6% CNN/DM, +0.3%
MT-Bench, +0.2% OpenHands, +0.0% CodeQwen (learning rate 0.02-0.2: within 0.04%); a
fixed weight of 2 gives +0.9% on Spec-Bench but -2.6% on OpenHands.

Measured on the Spec-Bench trace and not kept (tau change at the defaults): re-matching
on context + draft where the voters run out (0.0%: drafts stop early in 10% of steps,
and then almost always on ``min_token_prob``), or at every depth (-0.5%); a next-token
table over all past prompts and outputs for steps without a voter (it predicts 90 of
those 4,919 steps); past prompts in the global tree (-0.5%); votes weighted by match
length (m^0.5 .. m^2: first-token accuracy -0.3 .. -0.9 points, deeper tokens -0.1%),
by recency (no gain in first-token accuracy), or by each voter's probability of the
draft so far (+0.05%); one learned weight per (tree, match kind) instead of the one local
weight (+0.15%; OpenHands -0.1%); the chain of a 32-node tree draft with the largest sum
of path probabilities instead of the greedy chain (-1.7%). The limit is the first
token: it is right in 32% of steps; in 17.5% the right one was voted but not on top, in
40% it was not voted, and in 10.5% no vote was kept. An online softmax ranker over
per-(tree, match kind) vote shares reached the same first-token accuracy as the vote
(31.9%), so the votes hold no better ranking: more tau needs tokens no voter offers.
Past prompts offer few: in the steps whose first token was wrong, the top continuation
of the longest context suffix (up to 6 tokens) found in earlier requests' prompts was
the right token in 3.9% of all steps, and a wrong one in 51%.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit

from vllm_specext.proposers.base import Proposer, match_kind
from vllm_specext.proposers.rejected_tail import TAIL_KIND, move_tail
from vllm_specext.proposers.suffix_tree import (BEST, CNT, FCH, LEN, NXT, TOK, ActiveRequest,
                                                GlobalCache, child, load_growth_kernels, match,
                                                token_at)

#: pseudo-count added to a voter's support: a suffix seen once before votes 1/2 for its
#: continuation (0.5 and 2 changed tau by < 0.3% on the traces)
ALPHA = 1.0
#: children a voter enumerates besides its best one (4 or 64: tau within 0.1%)
MAX_CHILDREN = 16
#: step size of the online update of the log local weight (per committed step)
LOCAL_WEIGHT_RATE = 0.05
#: the local weight stays within [e^-2, e^2]
LOG_LOCAL_WEIGHT_BOUND = 2.0
#: most candidate tokens of a first-token vote kept for that update (a vote with more is
#: not learned from; the largest on the Spec-Bench, MT-Bench, RAG and OpenHands traces
#: has 65)
RECORD_SIZE = 128
#: a first draft token with less than this share of its vote is a guess (draft kinds)
CONFIDENT_SHARE = 0.5


def draft_kind(longest: int, local: int, share: float) -> int:
    """Draft kind (:attr:`~vllm_specext.proposers.base.Proposer.last_kinds`) of a vote
    draft, in ``0 .. 16``: 0 without a match, else ``1 + own + 2 * length + 8 * guess``
    with ``length`` the longest match bucketed by
    :func:`~vllm_specext.proposers.base.match_kind` (1, 2-3, 4-7, 8+ tokens -> 0..3),
    ``own`` 1 when that match is in the request's own tree (a copy of its context, as
    prompt lookup drafts), 0 when only past outputs match that far, and ``guess`` 1 when
    the first draft token got less than :data:`CONFIDENT_SHARE` of its vote.

    Adaptive speculation keeps acceptance per kind. In an offline batch-1 simulation of
    the end-to-end benchmark (``benchmarks/adaptive_replay.py``'s sequence, 4 prompts per
    workload, its costs ``lo``, ``hi`` and ``vhi``), these kinds against the match length
    alone raised modelled tok/s in 13 of 15 cells, the lowest cell's ratio to vLLM's
    n-gram rule from 0.93 to 0.98.
    """
    if longest <= 0:
        return 0
    own = 1 if local >= longest else 0
    guess = 1 if share < CONFIDENT_SHARE else 0
    return 1 + own + 2 * min(3, match_kind(longest) - 1) + 8 * guess

# voter columns: tree (0 request, 1 global), node, tokens of its run used, support
V_TREE, V_NODE, V_USED, V_SUP = range(4)


# --------------------------------------------------------------------------- kernels
@njit(cache=True, inline="always")
def _budget(m, max_tokens, factor, offset):
    b = int(np.float32(m) * np.float32(factor) + np.float32(offset) + 1e-6)
    return max(0, min(max_tokens, b))


@njit(cache=True)
def collect_voters(lnodes, ltok, lseqs, act, n_ctx, gnodes, ghkeys, ghvals, gtok, gseqs,
                   slot, gact, cand):
    """Write the voters of a request whose tokens are ``ltok[:n_ctx]`` to ``cand``.

    Args:
        lnodes, ltok, lseqs, act: the request tree and its suffix states.
        gnodes, ghkeys, ghvals, gtok, gseqs: the global tree; slot: the request's output
            in it (-1: none), gact: that output's suffix states.
        cand: int32 ``(>= 2 * max_tree_depth, 4)``, columns ``V_*``.

    Returns:
        ``(n voters, longest match length, longest match in the request tree)``.
    """
    width = min(n_ctx, act.shape[0])
    nc = 0
    longest = 0
    for m in range(1, width):
        u = act[m]
        if lnodes[u, CNT] > 1:
            cand[nc, V_TREE], cand[nc, V_NODE] = 0, u
            cand[nc, V_USED], cand[nc, V_SUP] = lnodes[u, LEN], lnodes[u, CNT] - 1
            nc += 1
            longest = m
    local = longest
    own = min(gseqs[slot, 1], act.shape[0] - 1) if slot >= 0 else 0
    for m in range(1, width):
        if m <= own:
            u = gact[m]
            used = gnodes[u, LEN]
            sup = gnodes[u, CNT] - 1
        else:
            u, used = match(gnodes, ghkeys, ghvals, gtok, gseqs, ltok, n_ctx - m, n_ctx)
            if u < 0:
                break
            sup = gnodes[u, CNT]
        if sup > 0:
            cand[nc, V_TREE], cand[nc, V_NODE], cand[nc, V_USED], cand[nc, V_SUP] = 1, u, used, sup
            nc += 1
            longest = max(longest, m)
    return nc, longest, local


@njit(cache=True)
def _tally(tkeys, tvals, tlocal, tstamp, stamp, touched, nt, t, w, wl):
    """Add ``w`` to token ``t``'s vote and ``wl`` to its request-tree part (slots of
    older stamps are empty); returns the new number of touched slots."""
    mask = len(tkeys) - 1
    i = (t * 0x9E3779B1) & mask
    while tstamp[i] == stamp and tkeys[i] != t:
        i = (i + 1) & mask
    if tstamp[i] != stamp:
        tstamp[i] = stamp
        tkeys[i] = t
        tvals[i] = 0.0
        tlocal[i] = 0.0
        touched[nt] = i
        nt += 1
    tvals[i] += w
    tlocal[i] += wl
    return nt


@njit(cache=True)
def vote(lnodes, ltok, lseqs, gnodes, gtok, gseqs, cand, lo, hi, lw, tkeys, tvals, tlocal,
         tstamp, stamp, touched):
    """Tally the next-token votes of voters ``cand[lo:hi]`` under a fresh ``stamp``,
    request-tree voters weighted ``lw``.

    Returns:
        ``(n touched, total weight, slot of the top token or -1)``; the tally is
        ``tkeys[touched[:n]]`` / ``tvals[touched[:n]]`` (ties: the first voted), of which
        ``tlocal`` holds the request-tree votes, unweighted.
    """
    nt = 0
    total = 0.0
    for c in range(lo, hi):
        tree, u, used, sup = cand[c, V_TREE], cand[c, V_NODE], cand[c, V_USED], cand[c, V_SUP]
        nodes = lnodes if tree == 0 else gnodes
        wl = 1.0 / (sup + ALPHA) if tree == 0 else 0.0
        w = lw * wl if tree == 0 else 1.0 / (sup + ALPHA)
        if used < nodes[u, LEN]:
            t = token_at(nodes, ltok if tree == 0 else gtok, lseqs if tree == 0 else gseqs,
                         u, used)
            nt = _tally(tkeys, tvals, tlocal, tstamp, stamp, touched, nt, t, sup * w, sup * wl)
            total += sup * w
            continue
        b = nodes[u, BEST]
        if b < 0:
            continue
        c_b = nodes[b, CNT]
        nt = _tally(tkeys, tvals, tlocal, tstamp, stamp, touched, nt, nodes[b, TOK], c_b * w,
                    c_b * wl)
        total += c_b * w
        x = nodes[u, FCH]
        seen = 0
        while x >= 0 and seen < MAX_CHILDREN:
            if x != b:
                c_x = nodes[x, CNT]
                nt = _tally(tkeys, tvals, tlocal, tstamp, stamp, touched, nt, nodes[x, TOK],
                            c_x * w, c_x * wl)
                total += c_x * w
                seen += 1
            x = nodes[x, NXT]
    best = -1
    for j in range(nt):
        if best < 0 or tvals[touched[j]] > tvals[best]:
            best = touched[j]
    return nt, total, best


@njit(cache=True)
def advance(lnodes, lhkeys, lhvals, ltok, lseqs, gnodes, ghkeys, ghvals, gtok, gseqs,
            cand, lo, hi, t, dst):
    """Write the voters of ``cand[lo:hi]`` that continue with token ``t``, one token
    further, to ``cand[dst:]`` (``dst <= lo`` or ``dst >= hi``); returns how many."""
    n = 0
    for c in range(lo, hi):
        tree, u, used, sup = cand[c, V_TREE], cand[c, V_NODE], cand[c, V_USED], cand[c, V_SUP]
        nodes = lnodes if tree == 0 else gnodes
        if used < nodes[u, LEN]:
            if token_at(nodes, ltok if tree == 0 else gtok, lseqs if tree == 0 else gseqs,
                        u, used) != t:
                continue
            used += 1
        else:
            u = child(lhkeys, lhvals, u, t) if tree == 0 else child(ghkeys, ghvals, u, t)
            if u < 0:
                continue
            used = 1
            sup = nodes[u, CNT]
        d = dst + n
        cand[d, V_TREE], cand[d, V_NODE], cand[d, V_USED], cand[d, V_SUP] = tree, u, used, sup
        n += 1
    return n


@njit(cache=True)
def record_vote(cand, nc, nt, lw, tkeys, tvals, tlocal, touched, rec):
    """Keep a first-token vote (voters ``cand[:nc]``, tally of ``nt`` tokens) for
    :func:`learn_local_weight`: ``rec[0, :nt]`` the tokens, ``rec[1, :nt]`` /
    ``rec[2, :nt]`` their request-tree / global-tree votes (unweighted), and in the last
    column ``nt`` and each tree's total support mass (sum of ``s / (s + ALPHA)`` over
    its voters). ``rec`` is float64 ``(3, size + 1)`` (token ids are exact in it); a vote
    of more than ``size`` tokens is not kept."""
    last = rec.shape[1] - 1
    rec[0, last] = -1.0
    if nt > last:
        return
    for j in range(nt):
        i = touched[j]
        rec[0, j] = tkeys[i]
        rec[1, j] = tlocal[i]
        rec[2, j] = max(tvals[i] - lw * tlocal[i], 0.0)
    rec[1, last] = 0.0
    rec[2, last] = 0.0
    for c in range(nc):
        sup = cand[c, V_SUP]
        rec[1 + cand[c, V_TREE], last] += sup / (sup + ALPHA)
    rec[0, last] = nt


@njit(cache=True)
def learn_local_weight(rec, t, rate, state):
    """One online gradient step on the log local weight ``state[0]``, now that token
    ``t`` followed the context of the vote kept in ``rec`` (:func:`record_vote`; used
    once, then cleared).

    The first-token vote is the mixture ``lw * L + G`` of the request-tree and
    global-tree votes; the gradient of ``log P(t)`` in ``log lw`` is
    ``lw L(t) / (lw L(t) + G(t)) - lw |L| / (lw |L| + |G|)``. Nothing changes when ``t``
    got no vote or a tree had no voter. ``state[0]`` stays within
    ``[-LOG_LOCAL_WEIGHT_BOUND, LOG_LOCAL_WEIGHT_BOUND]``.
    """
    last = rec.shape[1] - 1
    n = int(rec[0, last])
    rec[0, last] = -1.0
    tl, tg = rec[1, last], rec[2, last]
    if n <= 0 or tl <= 0.0 or tg <= 0.0:
        return
    for j in range(n):
        if rec[0, j] == t:
            lw = np.exp(state[0])
            vl = lw * rec[1, j]
            grad = vl / (vl + rec[2, j]) - lw * tl / (lw * tl + tg)
            state[0] = min(max(state[0] + rate * grad, -LOG_LOCAL_WEIGHT_BOUND),
                           LOG_LOCAL_WEIGHT_BOUND)
            return


@njit(cache=True)
def draft_chain(lnodes, lhkeys, lhvals, ltok, lseqs, act, n_ctx,
                gnodes, ghkeys, ghvals, gtok, gseqs, slot, gact,
                max_tokens, factor, offset, min_prob, log_lw, cand, tkeys, tvals, tlocal,
                tstamp, stamp, touched, out, rec, last, tail_tokens):
    """Single-chain vote draft (module docstring) of at most ``max_tokens`` into ``out``.

    Tree arguments as :func:`collect_voters` (plus the request tree's children table);
    ``log_lw[0]``: log weight of request-tree voters; ``tkeys``/``tvals``/``tlocal``/``tstamp``/
    ``touched``: tally scratch of one power-of-two size, ``stamp``: the last stamp used;
    ``rec``: receives the first-token vote (:func:`record_vote`); ``last``: int32
    ``(k + 2,)``, the request's last draft (context length then, length, tokens),
    replaced by this one; ``tail_tokens``: draft up to this many tokens of that draft's
    tail when the vote drafts nothing (:mod:`~vllm_specext.proposers.rejected_tail`;
    0: never).

    Returns:
        ``(n tokens, last stamp used, longest match in tokens, longest match in the
        request tree, the first draft token's share of its vote, whether the draft is
        the tail)`` (without a voter the share is 0.0).
    """
    nc, longest, local = collect_voters(lnodes, ltok, lseqs, act, n_ctx, gnodes, ghkeys,
                                        ghvals, gtok, gseqs, slot, gact, cand)
    budget = _budget(longest, max_tokens, factor, offset)
    lw = np.exp(log_lw[0])
    rec[0, rec.shape[1] - 1] = -1.0
    prob = 1.0
    share = 0.0
    n = 0
    while n < budget and nc > 0:
        stamp += 1
        nt, total, best = vote(lnodes, ltok, lseqs, gnodes, gtok, gseqs, cand, 0, nc, lw,
                               tkeys, tvals, tlocal, tstamp, stamp, touched)
        if n == 0:
            record_vote(cand, nc, nt, lw, tkeys, tvals, tlocal, touched, rec)
        if best < 0:
            break
        prob *= tvals[best] / total
        if n == 0:
            share = prob
        if prob < min_prob:
            break
        t = tkeys[best]
        out[n] = t
        n += 1
        nc = advance(lnodes, lhkeys, lhvals, ltok, lseqs, gnodes, ghkeys, ghvals, gtok, gseqs,
                     cand, 0, nc, t, 0)
    tailed = False
    if n == 0:  # the vote found nothing: the last draft's rejected tail, if it left one
        n = min(move_tail(last, 2, last[1], ltok, last[0], n_ctx, tail_tokens), max_tokens)
        out[:n] = last[2:2 + n]
        tailed = n > 0
    else:
        last[2:2 + n] = out[:n]
    last[0], last[1] = n_ctx, n
    return n, stamp, longest, local, share, tailed


@njit(cache=True)
def draft_tree(lnodes, lhkeys, lhvals, ltok, lseqs, act, n_ctx,
               gnodes, ghkeys, ghvals, gtok, gseqs, slot, gact,
               max_depth, max_nodes, factor, offset, min_prob, log_lw, tkeys, tvals, tlocal,
               tstamp, stamp, touched, out, par, rec):
    """Best-first vote tree: emit the open branch of highest path probability, then
    open its children (the tokens its surviving voters predict, at most as many as
    tokens are left), at most ``max_nodes`` tokens, none deeper than
    ``min(max_depth, int(longest match * factor + offset))``.

    Other arguments as :func:`draft_chain`.

    Returns:
        ``(n tokens, last stamp used)``; ``par[i]`` is token i's parent index (-1: the
        context).
    """
    pool = np.empty((2 * act.shape[0] + 16, 4), dtype=np.int32)
    nc, longest, _ = collect_voters(lnodes, ltok, lseqs, act, n_ctx, gnodes, ghkeys, ghvals,
                                    gtok, gseqs, slot, gact, pool)
    depth_cap = _budget(longest, max_depth, factor, offset)
    lw = np.exp(log_lw[0])
    rec[0, rec.shape[1] - 1] = -1.0
    used = nc
    cap = 64  # heap of open branches: probability, voters pool[lo:hi], depth, parent, token
    hp = np.empty(cap, np.float64)
    items = np.empty((cap, 5), np.int32)
    size = 0
    n = 0
    lo, hi, depth, parent, prob = 0, nc, 0, -1, 1.0
    while True:
        if depth < depth_cap and hi > lo:  # open the children of the last emitted token
            stamp += 1
            nt, total, _ = vote(lnodes, ltok, lseqs, gnodes, gtok, gseqs, pool, lo, hi, lw,
                                tkeys, tvals, tlocal, tstamp, stamp, touched)
            if n == 0:
                record_vote(pool, nc, nt, lw, tkeys, tvals, tlocal, touched, rec)
            order = np.argsort(-tvals[touched[:nt]], kind="mergesort")
            for j in order[:max_nodes - n]:
                slot_j = touched[j]
                p = prob * tvals[slot_j] / total
                if p < min_prob:
                    break
                t = tkeys[slot_j]
                if used + (hi - lo) > len(pool):
                    grown = np.empty((2 * len(pool) + hi - lo, 4), dtype=np.int32)
                    grown[:used] = pool[:used]
                    pool = grown
                k = advance(lnodes, lhkeys, lhvals, ltok, lseqs, gnodes, ghkeys, ghvals, gtok,
                            gseqs, pool, lo, hi, t, used)
                if size == cap:
                    cap *= 2
                    hp2 = np.empty(cap, np.float64)
                    items2 = np.empty((cap, 5), np.int32)
                    hp2[:size] = hp[:size]
                    items2[:size] = items[:size]
                    hp, items = hp2, items2
                j2 = size  # sift up
                size += 1
                while j2 > 0 and hp[(j2 - 1) // 2] < p:
                    h = (j2 - 1) // 2
                    hp[j2] = hp[h]
                    items[j2] = items[h]
                    j2 = h
                hp[j2] = p
                items[j2, 0], items[j2, 1], items[j2, 2] = used, used + k, depth + 1
                items[j2, 3], items[j2, 4] = parent, t
                used += k
        if n >= max_nodes or size == 0:
            break
        prob = hp[0]  # pop the most probable open branch and emit its token
        lo, hi, depth, parent, t = items[0, 0], items[0, 1], items[0, 2], items[0, 3], items[0, 4]
        size -= 1
        hp[0] = hp[size]
        items[0] = items[size]
        j = 0
        while True:
            c = 2 * j + 1
            if c >= size:
                break
            if c + 1 < size and hp[c + 1] > hp[c]:
                c += 1
            if hp[c] <= hp[j]:
                break
            hp[j], hp[c] = hp[c], hp[j]
            for f in range(5):
                items[j, f], items[c, f] = items[c, f], items[j, f]
            j = c
        out[n] = t
        par[n] = parent
        parent = n
        n += 1
    return n, stamp


# --------------------------------------------------------------------------- proposer
class SuffixProposer(Proposer):
    """Suffix-tree drafter over each request's tokens and a global cache of outputs.

    Defaults are those of :class:`~vllm_specext.config.SuffixConfig` (with their
    measurements); vLLM's are 24 / 10000 / 1.0 / 0.1. The weight of request-tree
    voters (:attr:`local_weight`) starts at 1 and is learned from every update that
    follows a draft (module docstring); it is shared by all requests.

    Args:
        num_speculative_tokens: k, the most draft tokens per step.
        suffix_decoding_max_tree_depth: longest stored suffix; bounds match + draft length.
        suffix_decoding_max_cached_requests: finished outputs kept in the global tree
            (FIFO; -1 unbounded, 0 disables the global tree).
        suffix_decoding_max_spec_factor: a longest match of m tokens drafts at most
            ``int(m * factor + offset)`` tokens.
        suffix_decoding_min_token_prob: stop drafting once the path probability (product
            of the drafted tokens' vote shares) falls below this.
        suffix_decoding_max_spec_offset: the offset above (Arctic's ``max_spec_offset``).
        rejected_tail: where the vote drafts nothing, draft up to this many tokens of
            the last draft's tail (:mod:`~vllm_specext.proposers.rejected_tail`; kind
            ``TAIL_KIND``; 0: off).

    Raises:
        ValueError: k < 1, depth < 1, or max_cached_requests < -1.
    """

    method = "suffix"

    def __init__(self, num_speculative_tokens: int, suffix_decoding_max_tree_depth: int = 24,
                 suffix_decoding_max_cached_requests: int = 10000,
                 suffix_decoding_max_spec_factor: float = 8.0,
                 suffix_decoding_min_token_prob: float = 0.05,
                 suffix_decoding_max_spec_offset: float = 0.0, rejected_tail: int = 2):
        super().__init__(num_speculative_tokens)
        self.rejected_tail = max(0, int(rejected_tail))
        self.max_depth = int(suffix_decoding_max_tree_depth)
        self.max_spec_factor = float(suffix_decoding_max_spec_factor)
        self.max_spec_offset = float(suffix_decoding_max_spec_offset)
        self.min_token_prob = float(suffix_decoding_min_token_prob)
        self.global_cache = GlobalCache(self.max_depth, suffix_decoding_max_cached_requests)
        self._reqs: dict[str, ActiveRequest] = {}
        self._cand = np.zeros((2 * self.max_depth, 4), dtype=np.int32)
        size = 1 << (4 * self.max_depth * (MAX_CHILDREN + 1)).bit_length()
        self._tkeys = np.zeros(size, dtype=np.int32)
        self._tvals = np.zeros(size, dtype=np.float64)
        self._tlocal = np.zeros(size, dtype=np.float64)
        self._tstamp = np.zeros(size, dtype=np.int64)
        self._touched = np.zeros(size, dtype=np.int32)
        self._stamp = 0
        self._log_lw = np.zeros(1)  # log of the local weight, learned online
        self._votes: dict[str, np.ndarray] = {}  # first-token vote per request
        self._last: dict[str, np.ndarray] = {}  # last draft per request (draft_chain)
        self._unindexed: dict[str, int] = {}  # request -> first committed token not indexed
        self._out = np.empty(self.num_speculative_tokens, dtype=np.int32)

    # ----------------------------------------------------------------- life cycle
    def _on_start(self, req_id: str) -> None:
        buf = self.tokens[req_id]
        req = ActiveRequest(self.max_depth, self.global_cache, len(buf))
        req.extend(buf.storage, len(buf))
        self._reqs[req_id] = req
        self._votes[req_id] = np.full((3, RECORD_SIZE + 1), -1.0)
        self._last[req_id] = np.zeros(self.num_speculative_tokens + 2, dtype=np.int32)

    def _on_update(self, req_id: str, old_len: int) -> None:
        rec = self._votes[req_id]
        if rec[0, -1] > 0:  # the last draft's first-token vote, not used yet
            learn_local_weight(rec, self.tokens[req_id].storage[old_len], LOCAL_WEIGHT_RATE,
                               self._log_lw)
        self._unindexed.setdefault(req_id, old_len)

    def index_pending(self, req_ids: Sequence[str] | None = None) -> None:
        """Index the committed tokens of ``req_ids`` (None: every active request) that are
        not in the trees yet (``propose`` does it for every request it drafts for before
        drafting any, ``propose_tree`` for its request, a normal finish for its request);
        ids with nothing pending, or not active, are skipped."""
        for rid in list(self._unindexed) if req_ids is None else req_ids:
            self._index(rid)

    def _index(self, req_id: str) -> None:
        """Index ``req_id``'s pending tokens in its tree and its output in the global tree."""
        if self._unindexed.pop(req_id, None) is not None:
            buf = self.tokens[req_id]
            self._reqs[req_id].extend(buf.storage, len(buf))

    def warm_up_kernels(self) -> None:
        """Load the trees' growth and compaction kernels
        (:func:`~vllm_specext.proposers.suffix_tree.load_growth_kernels`)."""
        load_growth_kernels()

    def _on_stop(self, req_id: str, finished: bool) -> None:
        if finished and self._reqs[req_id].slot >= 0:  # the global cache keeps it whole
            self._index(req_id)
        self._unindexed.pop(req_id, None)
        self._reqs.pop(req_id).close(finished)
        del self._votes[req_id], self._last[req_id]

    # ----------------------------------------------------------------- drafting
    @property
    def local_weight(self) -> float:
        """The current weight of request-tree voters (global-tree voters weigh 1)."""
        return float(np.exp(self._log_lw[0]))

    def _trees(self, req_id: str) -> tuple:
        req, buf, g = self._reqs[req_id], self.tokens[req_id], self.global_cache
        t, gt = req.tree, g.tree
        return (t.nodes, t.hkeys, t.hvals, buf.storage, req.seqs, req.act, len(buf),
                gt.nodes, gt.hkeys, gt.hvals, g.arena, g.seqs, req.slot, req.gact)

    def propose(self, req_ids: Sequence[str],
                max_tokens: Sequence[int] | None = None) -> list[list[int]]:
        """See :meth:`Proposer.propose`. The pending tokens of every request drafted for
        (a cap above 0) are indexed first, so that each draft sees the others' tokens up
        to this step in the global tree."""
        for rid, cap in zip(req_ids, self._caps(len(req_ids), max_tokens)):
            if cap > 0:
                self._index(rid)
        return super().propose(req_ids, max_tokens)

    def _propose_one(self, req_id: str, max_tokens: int) -> list[int]:
        n, self._stamp, longest, local, share, tailed = draft_chain(
            *self._trees(req_id), max_tokens, self.max_spec_factor, self.max_spec_offset,
            self.min_token_prob, self._log_lw, self._cand, self._tkeys, self._tvals,
            self._tlocal, self._tstamp, self._stamp, self._touched, self._out,
            self._votes[req_id], self._last[req_id], self.rejected_tail)
        self._kind = TAIL_KIND if tailed else draft_kind(longest, local, share)
        return self._out[:n].tolist()

    def propose_tree(self, req_id: str, budget: int = 64,
                     max_depth: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Multi-branch draft for offline tree verification (not in vLLM): the vote
        distributions expanded best-first by path probability.

        Args:
            req_id: an active request.
            budget: most tree nodes (draft tokens), >= 0.
            max_depth: longest branch (default: k); the per-match cap also applies.

        Returns:
            ``(tokens, parents)``, int32 ``(n,)`` each, n <= budget; ``parents[i]`` is
            the index of token i's parent (< i), -1 if it follows the context.

        Raises:
            KeyError: ``req_id`` is not active.
        """
        self._index(req_id)
        depth = self.num_speculative_tokens if max_depth is None else int(max_depth)
        budget = max(int(budget), 0)
        out = np.empty(budget, dtype=np.int32)
        par = np.empty(budget, dtype=np.int32)
        n, self._stamp = draft_tree(
            *self._trees(req_id), depth, budget, self.max_spec_factor, self.max_spec_offset,
            self.min_token_prob, self._log_lw, self._tkeys, self._tvals, self._tlocal,
            self._tstamp, self._stamp, self._touched, out, par, self._votes[req_id])
        self._last[req_id][1] = 0  # a tree draft leaves no rejected tail
        return out[:n], par[:n]

    # ----------------------------------------------------------------- accounting
    def state_nbytes(self) -> int:
        """Token buffers, request trees and the global cache, in bytes."""
        return (super().state_nbytes() + sum(r.nbytes for r in self._reqs.values())
                + sum(v.nbytes for v in self._votes.values())
                + sum(d.nbytes for d in self._last.values()) + self.global_cache.nbytes)
