"""Teacher-forced replay loop and its metrics, on hand-made requests with known answers."""
from __future__ import annotations

import pytest

from vllm_specext.proposers import build_proposer
from vllm_specext.proposers.base import Proposer
import numpy as np

from vllm_specext.replay.oracle import oracle_steps
from vllm_specext.replay.simulate import (CostModel, Request, accept_lengths, replay,
                                          replay_interleaved, summarize)


class ScriptedProposer(Proposer):
    """Drafts a fixed list keyed by the request's context length; logs every call."""

    method = "scripted"

    def __init__(self, num_speculative_tokens: int, script: dict[int, list[int]]):
        super().__init__(num_speculative_tokens)
        self.script = script
        self.updates: list[list[int]] = []
        self.stopped: list[tuple[str, bool]] = []

    def _propose_one(self, req_id: str, max_tokens: int) -> list[int]:
        return list(self.script.get(len(self.tokens[req_id]), []))

    def update(self, req_id, new_token_ids):
        self.updates.append(list(new_token_ids))
        super().update(req_id, new_token_ids)

    def stop_request(self, req_id, finished=True):
        self.stopped.append((req_id, finished))
        super().stop_request(req_id, finished)


# prompt [100], truth 1..10, k = 4. By context length:
#  1: draft [1,2,9,9] -> 2 accepted + bonus 3        (3 tokens)
#  4: no draft        -> bonus 4                     (1 token)
#  5: draft [5,6,7,8] -> 4 accepted + bonus 9        (5 tokens)
# 10: draft [10,11,12] -> 1 accepted, end of output, no bonus (1 token)
# 4 steps, 10 tokens: tau 2.5; drafted 11, accepted 7; 3 drafted steps.
SCRIPT = {1: [1, 2, 9, 9], 5: [5, 6, 7, 8], 10: [10, 11, 12]}
REQ = Request("r0", "cat", [100], list(range(1, 11)))


def _run(cold=False, requests=(REQ,)):
    made: list[ScriptedProposer] = []

    def factory():
        made.append(ScriptedProposer(4, SCRIPT))
        return made[-1]

    return replay(list(requests), factory, k=4, cold=cold), made


def test_hand_computed_request():
    (res,), made = _run()
    p = made[-1]  # made[0] is the warm-up proposer
    assert p.updates == [[1, 2, 3], [4], [5, 6, 7, 8, 9], [10]]
    assert p.stopped == [("r0", True)]
    assert (res.output_tokens, res.steps, res.drafted_steps) == (10, 4, 3)
    assert (res.drafted, res.accepted) == (11, 7)
    assert list(res.accept_hist) == [0, 1, 1, 0, 1]
    assert list(res.ctx_len) == [1, 4, 5, 10]
    assert len(res.step_us) == 4 and res.state_bytes > 0


def test_metrics_by_hand():
    (res,), _ = _run()
    m = summarize([res], CostModel(step_ms=10.0, ms_per_extra_token=1.0), oracle_steps=[2])
    assert m["tau"] == pytest.approx(2.5)
    assert m["acceptance_rate"] == pytest.approx(7 / 11)
    assert m["mean_acceptance_length"] == pytest.approx(1 + 7 / 3)
    assert m["acceptance_by_position"] == pytest.approx([1.0, 2 / 3, 1 / 3, 1 / 3])
    assert m["wasted_draft_tokens"] == 4
    assert m["wasted_per_step"] == pytest.approx(1.0)
    assert m["oracle_tau"] == pytest.approx(5.0)
    assert m["tau_over_oracle"] == pytest.approx(0.5)
    total_us = float(res.step_us.sum())
    assert m["proposer_us_per_token"] == pytest.approx(total_us / 10)
    # baseline 10 tokens x 10 ms; speculative: 4 steps x 10 ms + 11 drafts x 1 ms + proposer
    assert m["modelled_speedup"] == pytest.approx(100 / (40 + 11 + total_us / 1e3))
    assert m["proposer_us_median"] <= m["proposer_us_p99"]


def test_summary_sums_requests():
    r2 = Request("r1", "cat", [100], list(range(1, 11)))
    results, _ = _run(requests=(REQ, r2))
    m = summarize(results, CostModel())
    assert (m["requests"], m["output_tokens"], m["steps"]) == (2, 20, 8)
    assert m["tau"] == pytest.approx(2.5)


def test_warm_shares_one_proposer_cold_does_not():
    r2 = Request("r1", "cat", [100], [1])
    _, made = _run(cold=False, requests=(REQ, r2))
    assert len(made) == 2  # warm-up + one shared proposer
    assert made[1].stopped == [("r0", True), ("r1", True)]
    _, made = _run(cold=True, requests=(REQ, r2))
    assert len(made) == 3  # warm-up + one per request
    assert [p.stopped for p in made[1:]] == [[("r0", True)], [("r1", True)]]


def test_draft_longer_than_k_is_an_error():
    def factory():
        return ScriptedProposer(4, {1: [1, 2, 3, 4, 5]})

    with pytest.raises(RuntimeError, match="drafted 5 > k=4"):
        replay([REQ], factory, k=4)


def test_naive_proposer_from_registry():
    results = replay([REQ], lambda: build_proposer("naive", num_speculative_tokens=4), k=4)
    m = summarize(results, CostModel())
    assert m["tau"] == 1.0 and m["steps"] == 10
    assert m["acceptance_rate"] is None and m["mean_acceptance_length"] is None
    assert m["acceptance_by_position"] == [None] * 4
    assert m["wasted_draft_tokens"] == 0


def test_empty_output_takes_no_step():
    results = replay([Request("e", "c", [1, 2], [])],
                     lambda: ScriptedProposer(4, SCRIPT), k=4)
    assert results[0].steps == 0
    assert summarize(results, CostModel())["tau"] is None


class TreeProposer(ScriptedProposer):
    """A fixed draft tree on the first step: root -> 1 -> {3 -> 8, 2 -> 7}, root -> 9."""

    TOKENS = [1, 9, 3, 2, 7, 8]
    PARENTS = [-1, -1, 0, 0, 3, 2]

    def propose_tree(self, req_id, budget=64):
        import numpy as np

        n = min(budget, len(self.TOKENS)) if len(self.tokens[req_id]) == 1 else 0
        return (np.array(self.TOKENS[:n], dtype=np.int32),
                np.array(self.PARENTS[:n], dtype=np.int32))


def test_tree_draft_accepts_longest_matching_path():
    # truth 1 2 7 4: path 1 -> 2 -> 7 (nodes 0, 3, 4) accepted + bonus 4: one step
    req = Request("t", "c", [100], [1, 2, 7, 4])
    (res,) = replay([req], lambda: TreeProposer(4, {}), k=4, tree_budget=8)
    assert (res.steps, res.drafted, res.accepted) == (1, 6, 3)
    # budget 3 keeps nodes 0..2 (1, 9, 3): only "1" matches, then bonuses 2, 7, 4
    (res,) = replay([req], lambda: TreeProposer(4, {}), k=4, tree_budget=3)
    assert (res.steps, res.drafted, res.accepted) == (3, 3, 1)


def test_tree_budget_needs_propose_tree():
    with pytest.raises(TypeError, match="propose_tree"):
        replay([REQ], lambda: ScriptedProposer(4, SCRIPT), k=4, tree_budget=8)


def test_accept_lengths_probe_every_position():
    made: list[ScriptedProposer] = []

    def factory():
        made.append(ScriptedProposer(4, SCRIPT))
        return made[-1]

    (lengths,) = accept_lengths([REQ], factory, k=4)
    # context length 1 + g; drafts at 1, 5, 10 (see SCRIPT), none elsewhere
    assert lengths.tolist() == [2, 0, 0, 0, 4, 0, 0, 0, 0, 1]
    assert made[0].updates == [[t] for t in range(1, 11)]
    # a draftless step emits the bonus only: the scripted replay's 4 steps, recovered
    assert oracle_steps(lengths, 0, len(REQ.output), 4) == 4


def test_accept_lengths_rejects_a_draft_longer_than_k():
    with pytest.raises(RuntimeError, match="k=2"):
        accept_lengths([REQ], lambda: ScriptedProposer(2, SCRIPT), k=2)


def test_accept_lengths_of_a_context_only_proposer_give_its_replay_steps():
    """The ngram proposer's draft depends only on the context, so the selection oracle
    over it alone takes exactly the steps of its replay."""
    rng = np.random.default_rng(0)
    reqs = [Request(f"r{i}", "c", rng.integers(0, 6, 40).tolist(),
                    rng.integers(0, 6, 60).tolist()) for i in range(4)]

    def make():
        return build_proposer("ngram", num_speculative_tokens=4)

    steps = [r.steps for r in replay(reqs, make, k=4)]
    probed = accept_lengths(reqs, make, k=4)
    assert [oracle_steps(a, 0, len(r.output), 4) for a, r in zip(probed, reqs)] == steps


def test_interleaved_replay_matches_separate_replays():
    rng = np.random.default_rng(1)
    reqs = [Request(f"r{i}", "c", rng.integers(0, 5, 30).tolist(),
                    rng.integers(0, 5, 40).tolist()) for i in range(5)]
    makers = {m: (lambda m=m: build_proposer(m, num_speculative_tokens=4))
              for m in ("ngram", "suffix", "memory_decoding")}
    both = replay_interleaved(reqs, makers, k=4)
    for m, make in makers.items():
        alone = replay(reqs, make, k=4)
        assert [(r.steps, r.drafted, r.accepted) for r in both[m]] == \
            [(r.steps, r.drafted, r.accepted) for r in alone]
