"""The rejected draft's tail: a fallback draft for steps where a proposer finds nothing.

When verification rejects draft token ``d[a]`` and the target model emits its own token
``t`` there (the bonus token), the draft's prediction for what follows is still on the
table: if ``t`` *replaced* ``d[a]`` (a one-token substitution, e.g. a synonym or a
different digit), the text goes on as ``d[a+1:]``. Proposers that match the context
against earlier text often find nothing right after such a correction, because the
context now ends in a token sequence that never occurred before; drafting the tail
costs nothing then. In teacher-forced replay (k = 8, the six files of
``shared/traces``, steps where the proposer drafted nothing) it raised tau by
+0.4% to +1.0% for ``suffix`` and +0.2% to +0.8% for ``memory_decoding``; using it
instead of a weak draft of the proposer's own (first-token vote share < 0.5) lowered
tau by 4% on Spec-Bench, so it is only a fallback.

Rule (:func:`tail_after`), with ``d`` the last draft proposed for a request (the whole
draft, also when adaptive speculation showed the engine a prefix of it) and ``c`` the
``n`` tokens committed after it (accepted + bonus): when ``c[:n-1] == d[:n-1]`` the tail
is ``d[n:]``, whether ``c[n-1]`` equals ``d[n-1]`` (the draft so far was right) or replaced
it; when ``c`` diverged from ``d`` earlier (e.g. a resync) there is no tail.

A tail draft is capped like any draft and reported as kind :data:`TAIL_KIND` so that
adaptive speculation tracks its acceptance apart from the proposer's own kinds.
``memory_decoding`` applies the same rule inside its fused step kernel.
"""
from __future__ import annotations

from collections.abc import Sequence

#: draft kind (:attr:`~vllm_specext.proposers.base.Proposer.last_kinds`) of a tail draft:
#: above every proposer's own kinds and the last one the adaptive controller's default
#: ``num_kinds`` (32) tells apart
TAIL_KIND = 31


def tail_after(draft: Sequence[int], committed: Sequence[int]) -> list[int]:
    """What ``draft`` still predicts after ``committed`` (module docstring's rule).

    Args:
        draft: the last draft proposed for a request (int token ids).
        committed: the tokens committed after it, in order (accepted + bonus).

    Returns:
        The tail (possibly empty), a new list.
    """
    n = len(committed)
    a = 0
    while a < n and a < len(draft) and draft[a] == committed[a]:
        a += 1
    return list(draft[n:]) if a >= n - 1 and n > 0 else []


class RejectedTails:
    """Per request, the last draft proposed and the tail it leaves once tokens are
    committed (see the module docstring). Plain dicts of short lists: a few hundred
    nanoseconds per request per step."""

    __slots__ = ("_draft", "_tail")

    def __init__(self) -> None:
        self._draft: dict[str, list[int]] = {}
        self._tail: dict[str, list[int]] = {}

    def drafted(self, req_id: str, draft: list[int], cap: int) -> tuple[list[int], bool]:
        """The row's draft after the fallback: ``draft`` itself when non-empty, else the
        request's tail capped at ``cap`` tokens (``cap >= 1``). Remembers the result as
        the request's last draft.

        Returns:
            ``(draft, True when it is the tail)``.
        """
        tail = self._tail.pop(req_id, None)
        used = not draft and bool(tail)
        if used:
            draft = tail[:cap]
        if draft:
            self._draft[req_id] = draft
        else:
            self._draft.pop(req_id, None)
        return draft, used

    def committed(self, req_id: str, tokens: Sequence[int]) -> None:
        """Tokens were committed for ``req_id``: its last draft leaves a tail, or none."""
        draft = self._draft.pop(req_id, None)
        tail = tail_after(draft, tokens) if draft else None
        if tail:
            self._tail[req_id] = tail
        else:
            self._tail.pop(req_id, None)

    def forget(self, req_id: str) -> None:
        """Drop the request's draft and tail (started again, or stopped)."""
        self._draft.pop(req_id, None)
        self._tail.pop(req_id, None)
