"""``mtp_ngram`` core: extend model (MTP) drafts with prompt-lookup n-gram matches.

FastDeploy's hybrid MTP decoding (PaddlePaddle/FastDeploy,
``docs/features/speculative_decoding.md``, ``{"method": "mtp", "mtp_strategy":
"with_ngram"}``): the model's multi-token-prediction layers (DeepSeek-V3, arXiv
2412.19437) draft ``num_model_steps`` tokens, then prompt lookup (Saxena 2023) appends
tokens until ``num_speculative_tokens``. The lookup key is the suffix of the context
*followed by the MTP drafts*, so the n-gram continues after the model's guess.

This module is the n-gram half over the shared :class:`NgramIndex` (the MTP drafts are
passed as its uncommitted ``extra`` tokens: matched and drafted from, never indexed).
The MTP half is vLLM's own drafter; :mod:`vllm_specext.integration.mtp_hybrid` joins
the two inside the engine. Offline there are no MTP layers, so
``build_proposer("mtp_ngram")`` refuses (:func:`engine_only`) rather than replaying
plain n-gram under this name.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from vllm_specext.config import SpecExtConfigError
from vllm_specext.proposers.ngram import NgramProposer


class MtpNgramProposer(NgramProposer):
    """N-gram extension of model drafts, one incremental n-gram index per request.

    Args:
        num_speculative_tokens: k, the most draft tokens per request per step (model
            drafts included).
        num_model_steps: m, the model draft tokens per step (``1 <= m <= k``).
        prompt_lookup_min, prompt_lookup_max: shortest and longest suffix n-gram to
            match (``1 <= min <= max <= 64``).

    Raises:
        ValueError: k < 1, m outside ``[1, k]`` or bad n-gram bounds.
    """

    method = "mtp_ngram"

    def __init__(self, num_speculative_tokens: int, num_model_steps: int = 1,
                 prompt_lookup_min: int = 2, prompt_lookup_max: int = 5):
        if not 1 <= num_model_steps <= num_speculative_tokens:
            raise ValueError(f"need 1 <= num_model_steps <= num_speculative_tokens, got "
                             f"{num_model_steps} and {num_speculative_tokens}")
        super().__init__(num_speculative_tokens, prompt_lookup_min, prompt_lookup_max)
        self.num_model_steps = int(num_model_steps)

    def sync(self, req_id: str, tokens: np.ndarray) -> None:
        """Make ``req_id``'s stream equal to ``tokens`` (its committed tokens so far).

        Appends the new tail when ``tokens`` extends the known stream (checked on its
        last known token), otherwise restarts the request from ``tokens`` (first sight,
        preemption with a different history, request-id reuse). O(new tokens).

        Args:
            tokens: int ``(n,)`` committed token ids (prompt and output).
        """
        buf = self.tokens.get(req_id)
        n = len(tokens)
        if buf is not None:
            old = len(buf)
            if old <= n and (old == 0 or buf.view()[old - 1] == tokens[old - 1]):
                if old < n:
                    self.update(req_id, tokens[old:n])
                return
        self.start_request(req_id, tokens)

    def propose(self, req_ids: Sequence[str], max_tokens: Sequence[int] | None = None,
                model_drafts: Sequence[Sequence[int]] | None = None) -> list[list[int]]:
        """Model drafts extended by n-gram continuations, one numba call per batch.

        Row ``i`` gets ``model_drafts[i][:cap]`` followed, when that is shorter than
        ``cap = min(k, max_tokens[i])``, by the n-gram continuation of the request's
        context ``++ model_drafts[i]`` (all or nothing, up to ``cap`` in total).

        Args:
            req_ids: request ids (unknown ids get only their model drafts).
            max_tokens: optional per-row caps.
            model_drafts: per-row model (MTP) draft token ids; ``None``: none.

        Returns:
            One list of int token ids per row, each of length 0..k.
        """
        n = len(req_ids)
        caps = self._caps(n, max_tokens)
        heads = [[] for _ in range(n)] if model_drafts is None else model_drafts
        out = [[int(t) for t in heads[i][:max(caps[i], 0)]] for i in range(n)]
        rows = [i for i in range(n) if caps[i] > len(out[i]) and req_ids[i] in self.lookup.slots]
        if rows:
            offsets = np.zeros(len(rows) + 1, dtype=np.int64)
            offsets[1:] = np.cumsum([len(out[i]) for i in rows])
            extra = np.fromiter((t for i in rows for t in out[i]), dtype=np.int32,
                                count=int(offsets[-1]))
            drafts, lens = self.lookup.index.propose(
                [self.lookup.slots[req_ids[i]] for i in rows],
                [caps[i] - len(out[i]) for i in rows], extra, offsets)
            for j, i in enumerate(rows):
                out[i] += drafts[j, :lens[j]].tolist()
        return out


def engine_only(**config: Any) -> MtpNgramProposer:
    """``build_proposer("mtp_ngram")``: always raises (the MTP half needs the engine).

    Raises:
        SpecExtConfigError: always; names what to use instead.
    """
    raise SpecExtConfigError(
        "speculative method 'mtp_ngram' drafts with the model's MTP layers and runs only "
        "inside vLLM (speculative_config={'method': 'mtp_ngram', ...}); offline, use "
        "'ngram' for its n-gram part, or vllm_specext.proposers.mtp_ngram.MtpNgramProposer "
        "with explicit model drafts")
