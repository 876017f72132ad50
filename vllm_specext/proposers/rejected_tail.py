"""The rejected draft's tail: a fallback draft for steps where a proposer finds nothing.

When verification rejects draft token ``d[a]`` and the target model emits its own token
``t`` there (the bonus token), the draft's prediction for what follows is still on the
table: if ``t`` *replaced* ``d[a]`` (a one-token substitution, e.g. a synonym or a
different digit), the text goes on as ``d[a+1:]``. Proposers that match the context
against earlier text often find nothing right after such a correction, because the
context now ends in a token sequence that never occurred before; the tail is drafted
then. The first tail token is right about one time in ten, so the tail is cut short:
the proposers' key ``rejected_tail`` (default 2) is its most tokens. Teacher-forced
replay at k = 8 (Spec-Bench, MT-Bench, CNN/DM, OpenHands; ``vllm-specext replay
--param rejected_tail=...``), against no tail: 2 tokens raised tau by +0.4% to +0.7%
for ``suffix`` and ``memory_decoding`` with the replay's modelled speedup unchanged
(-0.15% to +0.1%); the whole tail +0.4% to +1.0% tau, but 0.6-1.0 more wasted draft
tokens per step and -1.0% to -1.9% modelled speedup. Using the tail instead of a weak
draft of the proposer's own (first-token vote share < 0.5) lowered tau by 4% on
Spec-Bench, so it is only a fallback.

Rule (:func:`move_tail`), with ``d`` the last draft proposed for a request (the whole
draft, also when adaptive speculation showed the engine a prefix of it) and ``c`` the
``n`` tokens committed since (accepted + bonus): when ``c[:n-1] == d[:n-1]`` the tail
is ``d[n:]``, whether ``c[n-1]`` equals ``d[n-1]`` (the draft so far was right) or replaced
it; when ``c`` diverged from ``d`` earlier (e.g. a resync) there is no tail.

A tail draft is capped like any draft (and at ``rejected_tail`` tokens); a tree draft
(offline replay) leaves no tail. It is reported as kind :data:`TAIL_KIND` so that
adaptive speculation tracks its acceptance apart from the proposer's own kinds. Both
proposers apply the rule inside their numba kernels (a Python-level version cost
``suffix`` about 1 µs per step on the project's VM), each keeping its last draft and the
context length it was drafted at.
"""
from __future__ import annotations

import numba as nb

#: draft kind (:attr:`~vllm_specext.proposers.base.Proposer.last_kinds`) of a tail draft:
#: above every proposer's own kinds and the last one the adaptive controller's default
#: ``num_kinds`` (32) tells apart
TAIL_KIND = 31


@nb.njit(cache=True, inline="always")
def move_tail(d, d0, nd, ctx, start, end, most):
    """The rule of the module docstring, in place: the last draft is ``d[d0:d0 + nd]``
    (int32), the tokens committed since are ``ctx[start:end]``; the tail's first (at most
    ``most``) tokens are moved to ``d[d0:]``. Callers run it only in a step whose own draft
    came out empty.

    Returns:
        The length of the tail's draft, at most ``most`` tokens (0: none).
    """
    n = end - start
    if n <= 0 or nd <= n or most <= 0:
        return 0
    for i in range(n - 1):
        if d[d0 + i] != ctx[start + i]:
            return 0
    m = min(nd - n, most)
    for i in range(m):
        d[d0 + i] = d[d0 + n + i]
    return m
