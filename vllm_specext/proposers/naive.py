"""``naive``: the speculative path with no drafts (FastDeploy's correctness and
overhead baseline). Every step verifies zero draft tokens and emits one token."""
from __future__ import annotations

from vllm_specext.proposers.base import Proposer


class NaiveProposer(Proposer):
    """Always drafts nothing (``[]``); measures the cost of the speculative path."""

    method = "naive"

    def _propose_one(self, req_id: str, max_tokens: int) -> list[int]:
        return []
