"""Adaptive speculation in the real engine: on text where only the first draft token is
usually right (counting), adaptation cuts the drafted tokens without losing accepted ones
or changing the output."""
from __future__ import annotations

import pytest

from vllm_specext.engine_run import generate_in_subprocess

pytestmark = pytest.mark.engine

PROMPT = "Count from 1 to 200, separated by commas: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"


def _run(adaptive: bool) -> dict:
    spec = {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_min": 1,
            "adaptive": adaptive, "adaptive_threshold": 0.05}
    return generate_in_subprocess({"prompts": [PROMPT], "max_tokens": 120, "warmup": False,
                                   "spec": spec})


def test_adaptive_cuts_wasted_drafts():
    fixed, adaptive = _run(False), _run(True)
    assert adaptive["token_ids"] == fixed["token_ids"]
    assert adaptive["num_draft_tokens"] < 0.6 * fixed["num_draft_tokens"]
    assert adaptive["num_accepted_tokens"] >= 0.9 * fixed["num_accepted_tokens"]
