"""``ngram``: prompt lookup decoding (Saxena 2023; vLLM ``ngram``) over an incremental index.

Drafts the continuation of the most recent earlier occurrence of the longest suffix
n-gram (``prompt_lookup_min <= n <= prompt_lookup_max``) of the request's prompt and
output. Unlike vLLM's ``NgramProposer`` (KMP rescan of the context every step, and the
earliest occurrence), the n-grams are kept in a per-request hash table
(:mod:`vllm_specext.proposers.ngram_index`), so a step costs O(new tokens) per request,
independent of the context length, and a batch is one numba call.

A draft's kind for adaptive speculation (``last_kinds``) is the length of the suffix
n-gram it continues, bucketed by :func:`ngram_kind` (shortest, in between, longest).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vllm_specext.proposers.base import Proposer, TokenBuffer
from vllm_specext.proposers.ngram_index import NgramIndex


class PromptLookup:
    """Prompt lookup over a proposer's requests: one :class:`NgramIndex` stream per
    request, aliasing the proposer's :class:`TokenBuffer` (used by ``ngram``,
    ``mtp_ngram`` and ``lookahead``).

    Args:
        min_n, max_n: shortest and longest suffix n-gram to match
            (``1 <= min_n <= max_n <= 64``).

    Raises:
        ValueError: bad n-gram bounds.
    """

    def __init__(self, min_n: int, max_n: int):
        self.index = NgramIndex(min_n, max_n)
        self.slots: dict[str, int] = {}  # request -> its stream in self.index

    def start(self, req_id: str, buf: TokenBuffer) -> None:
        """Start indexing ``req_id``'s tokens ``buf``."""
        self.slots[req_id] = self.index.add(buf.storage, len(buf))

    def sync(self, req_id: str, buf: TokenBuffer) -> None:
        """``buf`` grew (O(1); the new tokens are indexed at the next lookup)."""
        self.index.set_tokens(self.slots[req_id], buf.storage, len(buf))

    def stop(self, req_id: str) -> None:
        """Forget ``req_id``."""
        self.index.remove(self.slots.pop(req_id))

    def draft(self, req_ids: Sequence[str],
              caps: Sequence[int]) -> dict[int, tuple[np.ndarray, int]]:
        """Drafts of a batch in one numba call: ``{row: (int32 (caps[row],), n)}`` for the
        rows whose context suffix occurred before, ``n`` the length of the suffix n-gram
        the draft continues (``min_n..max_n``); rows with cap <= 0 or an unknown request
        are skipped."""
        rows = [i for i, rid in enumerate(req_ids) if caps[i] > 0 and rid in self.slots]
        if not rows:
            return {}
        matched = np.zeros(len(rows), dtype=np.int64)
        drafts, lens = self.index.propose([self.slots[req_ids[i]] for i in rows],
                                          [caps[i] for i in rows], matched=matched)
        return {i: (drafts[j, :lens[j]], int(matched[j])) for j, i in enumerate(rows)
                if lens[j]}

    @property
    def nbytes(self) -> int:
        """Bytes of every stream's table and hash state."""
        return sum(self.index.nbytes(s) for s in self.slots.values())


def ngram_kind(n: int, min_n: int, max_n: int) -> int:
    """Draft kind (:attr:`~vllm_specext.proposers.base.Proposer.last_kinds`) of an
    ``ngram`` draft that continues a suffix n-gram of ``n`` tokens
    (``min_n <= n <= max_n``): 1 when only the shortest n-gram occurred before
    (``n == min_n``), 3 for the longest (``n == max_n > min_n``), 2 in between; 0 for
    ``n <= 0`` (no draft).

    Three kinds rather than one per ``n``: on the e2e workloads' real outputs (2..5-grams,
    k = 8) a draft's first token is accepted about 50% of the time after a 2-gram match
    and about 90% after a 5-gram one, while 3- and 4-gram matches are rare (under 10% of
    the drafts); one kind each splits their few observations for no measurable gain."""
    if n <= 0:
        return 0
    return 1 if n <= min_n else (3 if n >= max_n else 2)


class NgramProposer(Proposer):
    """Prompt lookup over :class:`NgramIndex`.

    Args:
        num_speculative_tokens: k, the most draft tokens per request per step (>= 1).
        prompt_lookup_min, prompt_lookup_max: shortest and longest suffix n-gram to
            match (``1 <= min <= max <= 64``).

    Raises:
        ValueError: k < 1 or bad n-gram bounds.

    A draft is either empty (no match) or exactly ``min(k, max_tokens)`` tokens:
    a continuation that reaches the end of the context repeats the matched period.
    """

    method = "ngram"

    def __init__(self, num_speculative_tokens: int, prompt_lookup_min: int = 2,
                 prompt_lookup_max: int = 5):
        super().__init__(num_speculative_tokens)
        self.lookup = PromptLookup(prompt_lookup_min, prompt_lookup_max)

    def _on_start(self, req_id: str) -> None:
        self.lookup.start(req_id, self.tokens[req_id])

    def _on_update(self, req_id: str, old_len: int) -> None:
        self.lookup.sync(req_id, self.tokens[req_id])

    def _on_stop(self, req_id: str, finished: bool) -> None:
        self.lookup.stop(req_id)

    def propose(self, req_ids: Sequence[str],
                max_tokens: Sequence[int] | None = None) -> list[list[int]]:
        """Batched drafting, one numba call for the known requests (see ``Proposer.propose``).

        Sets :attr:`last_kinds`: per row, :func:`ngram_kind` of the length of the suffix
        n-gram its draft continues (0: no draft)."""
        out: list[list[int]] = [[] for _ in req_ids]
        kinds = [0] * len(req_ids)
        index = self.lookup.index
        for i, (draft, n) in self.lookup.draft(req_ids,
                                               self._caps(len(req_ids), max_tokens)).items():
            out[i] = draft.tolist()
            kinds[i] = ngram_kind(n, index.min_n, index.max_n)
        self.last_kinds = kinds
        return out

    def _propose_one(self, req_id: str, max_tokens: int) -> list[int]:
        return self.propose([req_id], [max_tokens])[0]

    def state_nbytes(self) -> int:
        """Token buffers plus every request's n-gram table."""
        return super().state_nbytes() + self.lookup.nbytes
