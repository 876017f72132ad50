"""Proposer cores: plain numpy/numba over token ids, no vLLM imports.

Use :func:`build_proposer` to make one from the same keys as ``--speculative-config``.
"""
from __future__ import annotations

import importlib
from typing import Any

from vllm_specext.config import validate_config
from vllm_specext.proposers.base import Proposer, TokenBuffer

#: method name -> "module:Class" of its proposer core
PROPOSER_CLASSES: dict[str, str] = {
    "ngram": "vllm_specext.proposers.ngram:NgramProposer",
    "naive": "vllm_specext.proposers.naive:NaiveProposer",
    "suffix": "vllm_specext.proposers.suffix:SuffixProposer",
    "mtp_ngram": "vllm_specext.proposers.mtp_ngram:engine_only",  # needs the engine
    "memory_decoding": "vllm_specext.proposers.memory_decoding:MemoryDecodingProposer",
    "lookahead": "vllm_specext.proposers.lookahead:LookaheadProposer",
}


def build_proposer(method: str, **config: Any) -> Proposer:
    """Build a proposer core from speculative-config keys.

    Args:
        method: one of ``ngram``, ``suffix``, ``memory_decoding``, ``lookahead``,
            ``mtp_ngram``, ``naive``.
        **config: the other ``speculative_config`` keys (e.g. ``num_speculative_tokens``,
            ``prompt_lookup_min``); verify keys are accepted and ignored here.

    Returns:
        A fresh :class:`Proposer` with no active requests.

    Raises:
        vllm_specext.config.SpecExtConfigError: invalid or unimplemented config.
    """
    cfg = validate_config({"method": method, **config})
    module, cls = PROPOSER_CLASSES[cfg.method].split(":")
    return getattr(importlib.import_module(module), cls)(**cfg.proposer_kwargs())


__all__ = ["Proposer", "TokenBuffer", "build_proposer", "PROPOSER_CLASSES"]
