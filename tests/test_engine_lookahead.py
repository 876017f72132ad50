"""lookahead in the real engine on the default model (fp32): greedy outputs are
token-identical to no speculation, drafts are accepted, and sampled requests (whose
Jacobi feedback is the verifier's sample) run to completion."""
from __future__ import annotations

import pytest

from vllm_specext.demo import DEMO_CHATS
from vllm_specext.engine_run import generate_in_subprocess

pytestmark = pytest.mark.engine

CHATS = DEMO_CHATS + [
    [{"role": "user", "content": "Copy this list exactly, one item per line: apple, banana, "
      "cherry, date, elderberry, fig, grape, honeydew, kiwi, lemon, mango, nectarine."}],
    [{"role": "user", "content": "Tell me a short story about a cat who learns to swim."}],
]
GREEDY = {"chats": CHATS, "max_tokens": 64, "temperature": 0.0}
SAMPLED = {"chats": CHATS[:3], "max_tokens": 32, "temperature": 0.8, "request_seed": 7}
JOB = {"dtype": "float32", "warmup": False}


@pytest.fixture(scope="module")
def baseline():
    return generate_in_subprocess({**JOB, **GREEDY, "spec": None})


@pytest.mark.parametrize("spec", [
    {"method": "lookahead", "num_speculative_tokens": 8},
    {"plugin_type": "la", "level": 3, "window": 4, "guess_set_size": 3,
     "shared_pool_size": 4096, "adaptive": False},
])
def test_lookahead_greedy_identical_and_sampling_runs(baseline, spec):
    greedy, sampled = generate_in_subprocess(
        {**JOB, "spec": spec, "cells": [GREEDY, SAMPLED]})["cells"]
    assert len(greedy["token_ids"]) == len(CHATS) >= 6
    for i, (got, want) in enumerate(zip(greedy["token_ids"], baseline["token_ids"])):
        assert got == want, f"prompt {i} differs with {spec}"
    k = spec.get("num_speculative_tokens", 4)
    assert greedy["num_accepted_tokens"] > 0
    assert greedy["num_draft_tokens"] <= k * greedy["num_drafts"]
    assert [len(t) > 0 for t in sampled["token_ids"]] == [True] * len(SAMPLED["chats"])
    assert max(len(t) for t in sampled["token_ids"]) <= SAMPLED["max_tokens"]
