"""Bounded memory: 10,000 synthetic requests through every proposer core (no engine).

Each cross-request structure has a cap (suffix: cached requests; memory_decoding: trie
nodes; lookahead: shared pool entries; ngram and naive keep nothing across requests).
After the requests finish, the proposer's own accounting (``state_nbytes``) must be
within the cap's bytes, and the process RSS may not grow by more than that plus a fixed
allowance for allocator slack, measured after a warm-up that reaches the caps.
"""
from __future__ import annotations

import numpy as np
import psutil
import pytest

from vllm_specext.proposers import build_proposer

REQUESTS = 10_000
WARMUP = 1_000
RSS_SLACK = 48 << 20  # allocator and interpreter noise, bytes

#: method -> (kwargs with a small cap, state bytes allowed once every request finished)
CAPPED = {
    "ngram": ({}, 0),
    "naive": ({}, 0),
    "suffix": ({"suffix_decoding_max_cached_requests": 200}, 200 * 64 * 200),
    "memory_decoding": ({"max_nodes": 4096, "insert_prompt": True}, 4096 * 40 + (1 << 16)),
    "lookahead": ({"shared_pool_size": 2000}, 2000 * 64 + (1 << 20)),
}


def _push(proposer, rng: np.random.Generator, start: int, count: int) -> None:
    for i in range(start, start + count):
        rid = f"r{i % 5}"  # ids are reused, as a server does
        proposer.start_request(rid, rng.integers(0, 50_000, 40).tolist())
        for _ in range(4):
            proposer.propose([rid])
            proposer.update(rid, rng.integers(0, 2_000, 6).tolist())
        proposer.stop_request(rid, finished=i % 9 != 0)  # every 9th aborted


@pytest.mark.parametrize("method", sorted(CAPPED))
def test_state_and_rss_stay_within_the_cap(method):
    kwargs, allowed = CAPPED[method]
    proposer = build_proposer(method, num_speculative_tokens=8, **kwargs)
    rng = np.random.default_rng(0)
    _push(proposer, rng, 0, WARMUP)
    rss_before = psutil.Process().memory_info().rss
    _push(proposer, rng, WARMUP, REQUESTS - WARMUP)
    growth = psutil.Process().memory_info().rss - rss_before
    assert not proposer.active_requests
    assert proposer.state_nbytes() <= allowed
    assert growth <= allowed + RSS_SLACK, f"RSS grew by {growth / 2**20:.1f} MiB"
