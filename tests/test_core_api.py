"""The proposer core API contract (vllm_specext.proposers.base), for every built proposer."""
from __future__ import annotations

import pytest

from vllm_specext.proposers import Proposer, build_proposer
from vllm_specext.proposers.rejected_tail import TAIL_KIND

METHODS = ["ngram", "naive"]
K = 4


@pytest.fixture(params=METHODS)
def proposer(request) -> Proposer:
    return build_proposer(request.param, num_speculative_tokens=K)


def _valid(drafts, req_ids, caps=None):
    assert isinstance(drafts, list) and len(drafts) == len(req_ids)
    for i, d in enumerate(drafts):
        assert isinstance(d, list) and all(isinstance(t, int) for t in d)
        assert len(d) <= K
        if caps is not None:
            assert len(d) <= max(caps[i], 0)


def test_build_returns_fresh_proposer(proposer):
    assert isinstance(proposer, Proposer)
    assert proposer.num_speculative_tokens == K
    assert proposer.active_requests == set()
    assert proposer.method in METHODS


def test_life_cycle(proposer):
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    proposer.start_request("r", prompt)
    assert proposer.active_requests == {"r"}
    committed = len(prompt)
    for step in range(6):
        drafts = proposer.propose(["r"])
        _valid(drafts, ["r"])
        proposer.update("r", drafts[0][:1] + [step])
        committed += len(drafts[0][:1]) + 1
    proposer.update("r", [])  # no-op
    assert len(proposer.tokens["r"]) == committed
    proposer.stop_request("r", finished=True)
    assert proposer.active_requests == set()
    assert proposer.propose(["r"]) == [[]]
    proposer.stop_request("r")  # unknown ids are ignored


def test_unknown_ids_and_caps(proposer):
    proposer.start_request("a", [1, 2, 3, 1, 2, 3, 1, 2])
    ids = ["a", "zzz", "a", "a", "a"]
    caps = [K, K, 0, -3, 2]
    drafts = proposer.propose(ids, caps)
    _valid(drafts, ids, caps)
    assert drafts[1] == [] and drafts[2] == [] and drafts[3] == []
    with pytest.raises(KeyError):
        proposer.update("zzz", [1])


def test_request_id_reuse_resets_state(proposer):
    proposer.start_request("r", [9, 9, 9, 9, 9, 9])
    proposer.update("r", [9, 9])
    proposer.start_request("r", [1, 2, 3])
    assert proposer.tokens["r"].view().tolist() == [1, 2, 3]
    assert proposer.prompt_len["r"] == 3
    assert proposer.propose(["r"]) == [[]]  # nothing of the old 9s is remembered
    fresh = build_proposer(proposer.method, num_speculative_tokens=K)
    fresh.start_request("r", [1, 2, 3])
    for toks in ([1, 2], [3, 1], [2, 3, 1]):
        proposer.update("r", toks)
        fresh.update("r", toks)
        assert proposer.propose(["r"]) == fresh.propose(["r"])


def test_empty_prompt(proposer):
    proposer.start_request("e", [])
    assert proposer.propose(["e"]) == [[]]
    for t in [3, 4, 3, 4, 3]:
        proposer.update("e", [t])
        _valid(proposer.propose(["e"]), ["e"])


@pytest.mark.parametrize("tok", [0, 2**31 - 1])
def test_extreme_token_ids(proposer, tok):
    other = 2**31 - 2 if tok else 1
    proposer.start_request("x", [tok, other, tok, other, tok])
    drafts = proposer.propose(["x"])
    _valid(drafts, ["x"])
    if proposer.method == "ngram":
        assert drafts == [[other, tok, other, tok]]
    proposer.update("x", [other, tok])
    _valid(proposer.propose(["x"]), ["x"])


def test_many_requests_and_state_bytes(proposer):
    base = proposer.state_nbytes()
    for i in range(40):
        proposer.start_request(f"r{i}", list(range(i, i + 50)) * 2)
    ids = [f"r{i}" for i in range(40)]
    _valid(proposer.propose(ids), ids)
    assert proposer.state_nbytes() > base
    for rid in ids:
        proposer.stop_request(rid, finished=False)
    assert proposer.active_requests == set()
    assert proposer.state_nbytes() == base


def test_naive_never_drafts():
    p = build_proposer("naive", num_speculative_tokens=3)
    p.start_request("r", [1, 1, 1, 1])
    assert p.propose(["r"]) == [[]]


@pytest.mark.parametrize("method", ["ngram", "naive", "suffix", "memory_decoding", "lookahead"])
def test_warm_up_leaves_no_request_behind(method):
    from vllm_specext.config import validate_config
    from vllm_specext.proposers.base import warm_up

    p = build_proposer(**validate_config({"method": method, "num_speculative_tokens": K}).model_dump())
    warm_up(p)
    assert p.active_requests == set()
    p.start_request("r", [1, 2, 3, 1, 2, 3])  # still usable afterwards
    _valid(p.propose(["r"]), ["r"])


def test_match_kind_buckets_by_powers_of_two():
    from vllm_specext.proposers.base import match_kind

    assert [match_kind(m) for m in (0, 1, 2, 3, 4, 7, 8, 15, 16, 1000, -3)] == \
        [0, 1, 2, 2, 3, 3, 4, 4, 5, 5, 0]


@pytest.mark.parametrize("method", ["ngram", "suffix", "memory_decoding", "lookahead"])
def test_last_kinds_one_small_int_per_row(method):
    """Proposers that tell draft kinds apart report one kind per row, 0 for no draft."""
    p = build_proposer(method, num_speculative_tokens=K)
    p.start_request("a", [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2])
    p.start_request("b", [7, 8, 9])
    ids = ["a", "b", "missing", "a"]
    drafts = p.propose(ids, [K, K, K, 0])
    _valid(drafts, ids, [K, K, K, 0])
    assert len(p.last_kinds) == len(ids)
    assert all(isinstance(k, int) and 0 <= k <= TAIL_KIND for k in p.last_kinds)
    assert all(k == 0 for d, k in zip(drafts, p.last_kinds) if not d)
    if method in ("ngram", "suffix", "memory_decoding"):
        assert drafts[0] and p.last_kinds[0] > 0  # a copy of the repeated pattern


def test_own_draft_kinds_stay_below_the_tail_kind():
    """The adaptive controller keys acceptance by kind: a proposer's own kinds must not
    reach :data:`TAIL_KIND` (kinds at or above it share its statistics)."""
    from vllm_specext.proposers import memory_decoding, suffix
    assert max(suffix.draft_kind(m, loc, share) for m in range(0, 40) for loc in (0, m)
               for share in (0.1, 0.9)) < TAIL_KIND
    assert max(memory_decoding.draft_kind(kind, order) for kind in (memory_decoding.COPY,
               memory_decoding.TRIE) for order in range(1, 17)) < TAIL_KIND
