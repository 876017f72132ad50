"""``ngram``: prompt lookup decoding (Saxena 2023; vLLM ``ngram``) over an incremental index.

Drafts the continuation of the most recent earlier occurrence of the longest suffix
n-gram (``prompt_lookup_min <= n <= prompt_lookup_max``) of the request's prompt and
output. Unlike vLLM's ``NgramProposer`` (KMP rescan of the context every step, and the
earliest occurrence), the n-grams are kept in a per-request hash table
(:mod:`vllm_specext.proposers.ngram_index`), so a step costs O(new tokens) per request,
independent of the context length, and a batch is one numba call.
"""
from __future__ import annotations

from collections.abc import Sequence

from vllm_specext.proposers.base import Proposer
from vllm_specext.proposers.ngram_index import NgramIndex


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
        self.index = NgramIndex(prompt_lookup_min, prompt_lookup_max)
        self._slot: dict[str, int] = {}

    def _on_start(self, req_id: str) -> None:
        buf = self.tokens[req_id]
        self._slot[req_id] = self.index.add(buf.storage, len(buf))

    def _on_update(self, req_id: str, old_len: int) -> None:
        buf = self.tokens[req_id]
        self.index.set_tokens(self._slot[req_id], buf.storage, len(buf))

    def _on_stop(self, req_id: str, finished: bool) -> None:
        self.index.remove(self._slot.pop(req_id))

    def propose(self, req_ids: Sequence[str],
                max_tokens: Sequence[int] | None = None) -> list[list[int]]:
        """Batched drafting, one numba call for the known requests (see ``Proposer.propose``)."""
        k = self.num_speculative_tokens
        get = self._slot.get
        if max_tokens is None:
            caps = [k] * len(req_ids)
        else:
            caps = [min(k, int(m)) for m in max_tokens]
        rows = [i for i, rid in enumerate(req_ids) if caps[i] > 0 and rid in self._slot]
        out: list[list[int]] = [[] for _ in req_ids]
        if rows:
            drafts, lens = self.index.propose([get(req_ids[i]) for i in rows],
                                              [caps[i] for i in rows])
            for i, draft, n in zip(rows, drafts.tolist(), lens.tolist()):
                if n:
                    out[i] = draft[:n]
        return out

    def _propose_one(self, req_id: str, max_tokens: int) -> list[int]:
        return self.propose([req_id], [max_tokens])[0]

    def state_nbytes(self) -> int:
        """Token buffers plus every request's n-gram table."""
        return super().state_nbytes() + sum(self.index.nbytes(s) for s in self._slot.values())
