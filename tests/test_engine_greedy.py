"""End to end, real engine, real default model (fp32): greedy outputs with speculation
are token-identical to outputs without it; drafts are counted in vLLM's metrics."""
from __future__ import annotations

import pytest

from vllm_specext.demo import DEMO_CHATS
from vllm_specext.engine_run import generate_in_subprocess

pytestmark = pytest.mark.engine

REPEAT = [{"role": "user", "content": "Copy this list exactly, one item per line: apple, banana, "
           "cherry, date, elderberry, fig, grape, honeydew, kiwi, lemon, mango, nectarine."}]
CHATS = DEMO_CHATS + [REPEAT]
JOB = {"chats": CHATS, "max_tokens": 64, "dtype": "float32", "temperature": 0.0,
       "warmup": False}


@pytest.fixture(scope="module")
def baseline():
    return generate_in_subprocess({**JOB, "spec": None})


@pytest.mark.parametrize("method,k", [("ngram", 4), ("ngram", 8), ("naive", 4), ("naive", 8),
                                      ("suffix", 8), ("memory_decoding", 8)])
def test_greedy_identical(baseline, method, k):
    res = generate_in_subprocess({**JOB, "spec": {"method": method, "num_speculative_tokens": k}})
    assert len(res["token_ids"]) == len(CHATS) >= 6
    for i, (got, want) in enumerate(zip(res["token_ids"], baseline["token_ids"])):
        assert got == want, f"prompt {i} differs with {method} k={k}"
    # target steps are counted per request: one token each without drafts; with them,
    # accepted tokens past max_tokens are counted by vLLM but not output
    assert baseline["steps"] == baseline["output_tokens"]
    if method != "naive":
        assert res["num_accepted_tokens"] > 0
        assert res["num_draft_tokens"] <= k * res["num_drafts"]
        assert (res["output_tokens"] - res["num_accepted_tokens"] <= res["steps"]
                < res["output_tokens"])
    else:
        assert res["num_drafts"] == 0 and res["num_draft_tokens"] == 0
        assert res["steps"] == res["output_tokens"]
