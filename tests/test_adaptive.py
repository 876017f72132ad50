"""Unit tests of adaptive speculation: acceptance history -> draft length; cost model."""
from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vllm_specext.adaptive import (
    DraftLengthController,
    StepCostModel,
    last_finisher_shares,
    shown_drafts,
)


def test_always_rejected_goes_to_zero_within_bounded_steps():
    c = DraftLengthController(k=8)
    threshold = 0.05
    for step in range(20):
        draft = c.trim(["r"], [[1] * 8], threshold)[0]
        if not draft:
            break
        c.observe("r", [2])  # first draft token rejected, target emitted 2
    assert draft == [] and step <= 10


def test_recovers_when_shadow_drafts_start_matching():
    c = DraftLengthController(k=8)
    for _ in range(10):
        c.trim(["r"], [[1] * 8], 0.05)
        c.observe("r", [2])
    assert c.length("r", 0.05) == 0
    for step in range(30):  # no draft shown, but the unshown draft keeps being right
        shown = c.trim(["r"], [[7, 7, 7, 7, 7, 7, 7, 7]], 0.05)[0]
        if shown:
            break
        c.observe("r", [7])
    assert shown and step < 15


def test_always_accepted_drafts_full_k():
    c = DraftLengthController(k=8)
    for _ in range(10):
        d = c.trim(["r"], [list(range(8))], 0.05)[0]
        c.observe("r", d + [99])
    assert c.length("r", 0.05) == 8


def test_length_follows_geometric_rule():
    c = DraftLengthController(k=16, prior_alpha=0.5)
    assert c.length("new", 0.1) == 3           # 0.5**3 = .125 > .1 >= .5**4
    assert c.length("new", 0.0) == 16
    assert c.length("new", 0.6) == 0


def test_copies_keep_long_drafts_after_first_token_misses():
    c = DraftLengthController(k=8)
    for i in range(40):  # half the drafts miss at once, the other half copy 8 tokens
        d = c.trim(["r"], [list(range(8))], 0.05)[0]
        c.observe("r", d + [99] if i % 2 else [99])
    a1, a2 = c.acceptance("r")
    assert 0.3 < a1 < 0.7 and a2 > 0.85
    assert c.length("r", 0.05) == 8  # one geometric rate (~0.8) would stop at depth 5
    assert c.expected_accepted("r", 8) == pytest.approx(a1 * (1 - a2 ** 8) / (1 - a2))


def test_forget_resets_to_all_request_acceptance():
    c = DraftLengthController(k=8)
    assert c.acceptance("r") == pytest.approx((0.5, 0.5))  # nothing observed: the prior
    c.trim(["r"], [[1] * 8], 0.05)
    c.observe("r", [2])
    unknown = c.acceptance("other")
    assert c.acceptance("r")[0] < unknown[0] < 0.5
    c.forget("r")
    assert c.acceptance("r") == pytest.approx(unknown)


def test_acceptance_is_tracked_per_draft_kind():
    """One request alternating drafts that are always accepted (kind 2) with guesses that
    never are (kind 0): the guesses stop being shown, the good drafts keep their length."""
    c = DraftLengthController(k=8)
    for i in range(60):
        good = i % 2 == 0
        draft = list(range(8))
        c.trim(["r"], [draft], 0.1, kinds=[2 if good else 0])
        c.observe("r", draft + [99] if good else [99])
    assert c.length("r", 0.1, kind=2) == 8 and c.length("r", 0.1, kind=0) == 0
    assert c.trim(["r"], [list(range(8))], 0.1, kinds=[0]) == [[]]
    assert c.expected_accepted("r", 8, kind=2) > 6 > c.expected_accepted("r", 8, kind=0)
    one = DraftLengthController(k=8)  # the same history without kinds: one blurred rate
    for i in range(60):
        one.trim(["r"], [list(range(8))], 0.1)
        one.observe("r", list(range(8)) + [99] if i % 2 == 0 else [99])
    assert one.trim(["r"], [list(range(8))], 0.1) == [list(range(8))]  # guesses shown too
    c.forget("r")
    assert c.length("r", 0.1, kind=0) == c.length("new", 0.1, kind=0)
    assert c.acceptance("x", kind=99) == c.acceptance("x", kind=c.num_kinds - 1)


def test_noisy_request_is_shrunk_towards_all_requests():
    c = DraftLengthController(k=8)
    for i in range(200):  # 50 requests that accept 20% of first tokens
        rid = f"bg{i % 50}"
        c.trim([rid], [[1] * 8], 0.05)
        c.observe(rid, [1, 9] if i % 5 == 0 else [9])
    c.trim(["lucky"], [[1] * 8], 0.9)  # not shown: a shadow draft
    c.observe("lucky", [1])  # one shadow hit
    assert 0.2 < c.acceptance("lucky")[0] < 0.6  # not 1.0 from a single observation


def test_alpha_reaching_one_keeps_full_drafts():
    c = DraftLengthController(k=8)
    for _ in range(60):  # alpha converges to exactly 1.0 in floating point
        d = c.trim(["r"], [list(range(8))], 0.05)[0]
        c.observe("r", d + [99])
    assert min(c.acceptance("r")) > 0.97 and c.length("r", 0.05) == 8


def test_expected_accepted_and_withhold_keep_shadow_drafts():
    c = DraftLengthController(k=4, prior_alpha=0.5)
    assert c.expected_accepted("r", 3) == pytest.approx(0.5 + 0.25 + 0.125)
    shown = c.trim(["r"], [[1, 2, 3, 4]], 0.1)
    assert shown == [[1, 2, 3]]
    assert c.withhold(["r"]) == [[]]
    before = c.acceptance("r")[0]
    c.observe("r", [1])  # no draft shown: one committed token, a shadow hit
    assert c.acceptance("r")[0] > before


def test_withheld_drafts_are_scored_over_the_steps_that_follow():
    """A step without a shown draft commits one token; the withheld draft's further
    positions are compared with the tokens of the next steps, so alpha2 is measured
    (and can recover) while drafts are withheld."""
    c = DraftLengthController(k=4, prior_alpha=0.5)
    truth = list(range(200))
    for g in range(60):  # each withheld draft is right for 3 tokens, then wrong
        assert c.trim(["r"], [truth[g + 1:g + 4] + [-1]], 1.0) == [[]]
        c.observe("r", [truth[g + 1]])
    a1, a2 = c.acceptance("r")
    assert a1 > 0.95 and 0.55 < a2 < 0.75  # further positions: 2 hits of 3 trials
    assert c.expected_accepted("r", 4) > 2.3
    c.forget("r")
    assert "r" not in c._scoring


def test_a_shown_draft_accepted_in_full_is_scored_beyond_what_was_shown():
    c = DraftLengthController(k=8, prior_alpha=0.5)
    assert c.trim(["r"], [[1, 2, 3, 4, 5, 6, 7, 8]], 0.2) == [[1, 2]]  # 0.5, 0.25 > 0.2
    c.observe("r", [1, 2, 3])  # both accepted, and the bonus token is the draft's third
    c.observe("r", [4, 5, 6, 7, 8])  # the next step commits the rest of the full draft
    # 7 further positions, all hits (scoring only this step's tokens: 2 hits, alpha2 0.88)
    assert c.acceptance("r")[1] > 0.95


def _step(c, rid, draft, threshold, committed):
    """One engine step as the adapter drives it: ask for a draft only when the controller
    wants one, trim it, then score it against the committed tokens."""
    asked = c.proposes(rid)
    shown = c.trim([rid], [draft if asked else []], threshold)[0]
    c.observe(rid, committed)
    return asked, shown


def test_idle_request_is_drafted_for_only_every_probe_steps_and_recovers():
    c = DraftLengthController(k=8, idle_steps=8, probe_every=4)
    asked = [_step(c, "r", [1] * 8, 0.99, [2])[0] for _ in range(24)]  # never shown
    assert asked[:8] == [True] * 8
    assert [i for i, a in enumerate(asked) if a][8:] == [8, 12, 16, 20]
    for step in range(80):  # acceptance returns: probes' shadow drafts start matching
        _, shown = _step(c, "r", [7] * 8, 0.3, [7])
        if shown:
            break
    assert shown and step < 60
    assert all(_step(c, "r", [7] * 8, 0.3, [7] * 9)[0] for _ in range(5))  # shown: every step
    c.forget("r")
    assert c.proposes("r")


def test_a_proposer_that_finds_nothing_is_asked_every_step():
    """Not idle: an n-gram that lost its match must be drafted as soon as it returns."""
    c = DraftLengthController(k=8, idle_steps=2, probe_every=4)
    assert all(_step(c, "r", [], 0.99, [2])[0] for _ in range(10))
    assert [_step(c, "r", [1] * 8, 0.99, [2])[0] for _ in range(4)] == [True, True, True, False]


def test_finding_nothing_neither_ends_nor_counts_towards_an_idle_run():
    """A request whose drafts are withheld goes idle although the proposer finds nothing
    every other step, and once it probes, a probe that finds nothing waits for the next."""
    c = DraftLengthController(k=8, idle_steps=4, probe_every=4)
    drafts = [[1] * 8, []] * 3 + [[1] * 8]  # withheld, nothing, withheld, ...
    assert all(_step(c, "r", d, 0.99, [2])[0] for d in drafts)  # 4 withheld steps
    asked = [_step(c, "r", [] if i % 8 == 0 else [1] * 8, 0.99, [2])[0] for i in range(12)]
    assert [i for i, a in enumerate(asked) if a] == [0, 4, 8]


def test_cost_model_follows_a_measured_step_time_curve():
    m = StepCostModel()
    rng = random.Random(0)

    def true_time(n):  # nearly flat while memory-bound, then 0.6 ms per token
        return 0.030 + 0.0001 * min(n, 16) + 0.0006 * max(0, n - 16)

    for _ in range(2000):
        n = rng.randint(1, 300)
        m.observe(n, true_time(n) + rng.gauss(0, 0.0005), speculative=n > 32)
    for n in (1, 8, 16, 32, 64, 150, 280):
        assert m.step_time(n, speculative=n > 32) == pytest.approx(true_time(n), rel=0.04)
    # 32 decoding rows, 64 draft tokens on offer: a draft token must be emitted with
    # p > 32 * price / T(32), the price being the time per token from 33 to 96 (0.6 ms)
    assert m.threshold(32, 64) == pytest.approx(32 * 0.0006 / true_time(32), rel=0.1)
    assert m.threshold(32, 0) == 0.0


def test_drafts_are_priced_at_the_token_count_they_run_at():
    """A batch's shrinking tail (1-32 tokens) costs 1.4 ms per token; 32 rows plus drafts
    cost 0.6 ms per extra token: the tail's slope must not price the drafts."""
    m = StepCostModel()
    for i in range(600):
        rows = 1 + i % 32
        m.observe(rows, 0.020 + 0.0014 * rows)
        if rows == 32:
            for d in (16, 48, 96):
                m.observe(32 + d, 0.020 + 0.0014 * 32 + 0.0006 * d, speculative=True)
    t32 = 0.020 + 0.0014 * 32
    assert m.draft_cost(32, 48) == pytest.approx(0.0006 * 48, rel=0.02)
    # 64 draft tokens, E accepted: pays iff E * T(32) > 32 * 38.4 ms, i.e. E > 19
    assert m.pays_off(32, expected_accepted=20, draft_tokens=64)
    assert not m.pays_off(32, expected_accepted=18, draft_tokens=64)
    assert m.threshold(32, 64) == pytest.approx(32 * 0.0006 / t32, rel=0.05)  # not 0.0014


def test_cost_model_explores_beyond_what_it_measured_then_trusts_the_measurement():
    m = StepCostModel(stale_steps=200, explore=0.5)
    for i in range(300):  # only plain steps of 1-32 tokens, 1.4 ms per token
        m.observe(1 + i % 32, 0.020 + 0.0014 * (1 + i % 32))
    # above 32 tokens nothing is measured: draft tokens priced at half the top slope
    assert m.draft_cost(32, 32) == pytest.approx(0.5 * 0.0014 * 32, rel=0.05)
    assert m.pays_off(32, expected_accepted=24, draft_tokens=32)  # 24 * 64.8 > 32 * 22.4
    for _ in range(5):  # tried: 32 draft tokens cost 2.8 ms each
        m.observe(64, 0.020 + 0.0014 * 32 + 0.0028 * 32, speculative=True)
    assert not m.pays_off(32, expected_accepted=24, draft_tokens=32)  # needs 44
    for i in range(200):  # the measurement goes stale: tried again
        m.observe(1 + i % 32, 0.020 + 0.0014 * (1 + i % 32))
    assert m.pays_off(32, expected_accepted=24, draft_tokens=32)


def test_cost_model_before_and_after_its_first_steps():
    m = StepCostModel(prior_slope_ratio=0.01, explore=0.5)
    assert not m.fitted and m.threshold(4, 8) == 0.0 and m.pays_off(8, 0.1, 1)  # draft
    assert not m.pays_off(8, 5.0, 0)  # nothing to verify
    for _ in range(50):
        m.observe(1, 0.05)  # only batch-1 plain steps: the slope beyond is the prior's
    assert m.step_time(1) == pytest.approx(0.05)
    assert m.draft_cost(1, 8) == pytest.approx(0.5 * 0.0005 * 8)
    m.observe(0, 9.0)  # an empty step is not a measurement
    assert m.step_time(1) == pytest.approx(0.05)


def test_pays_off_weighs_expected_tokens_against_the_speculative_steps_own_cost():
    m = StepCostModel()
    for i in range(400):  # plain 8 tokens: 28 ms; drafted: 20 ms + 1 ms/token + 2 ms
        spec = i % 2 == 1
        n = 8 + (1 + i % 7 if spec else 0)
        m.observe(n, 0.020 + 0.001 * n + (0.002 if spec else 0.0), spec)
    # 8 rows, T(8) = 28 ms; one draft token costs 1 + 2 ms: needs E > 8 * 3 / 28 = 0.86
    assert not m.pays_off(8, expected_accepted=0.8, draft_tokens=1)
    assert m.pays_off(8, expected_accepted=0.9, draft_tokens=1)
    # per token, the fixed 2 ms is not charged to each of 6 draft tokens (1 ms each), only
    # to a lone one
    assert m.threshold(8, 6) == pytest.approx(8 * 0.001 / 0.028, rel=0.02)
    assert m.threshold(8, 1) == pytest.approx(8 * 0.003 / 0.028, rel=0.02)


def test_margin_raises_the_bar_for_drafting():
    plain, careful = StepCostModel(), StepCostModel(margin=1.5)
    for m in (plain, careful):
        for i in range(400):
            spec = i % 2 == 1
            n = 8 + (1 + i % 7 if spec else 0)
            m.observe(n, 0.020 + 0.001 * n + (0.002 if spec else 0.0), spec)
    assert careful.threshold(8, 4) == pytest.approx(1.5 * plain.threshold(8, 4))
    assert plain.pays_off(8, 1.0, 1) and not careful.pays_off(8, 1.0, 1)  # needs 1.29


def test_plain_and_verified_steps_of_the_same_size_stay_apart():
    """4 rows + 4 drafts and 8 plain rows both schedule 8 tokens; a verified step costs
    2 ms more. The draft cost of 8 rows + 8 drafts is V(16) - P(8) = 10 ms."""
    m = StepCostModel()
    for i in range(600):
        rows = 4 + i % 9
        m.observe(rows, 0.020 + 0.001 * rows)
        m.observe(rows + 1 + i % 12, 0.022 + 0.001 * (rows + 1 + i % 12), speculative=True)
    assert m.step_time(8) == pytest.approx(0.028, rel=0.01)
    assert m.step_time(8, speculative=True) == pytest.approx(0.030, rel=0.01)
    assert m.draft_cost(8, 8) == pytest.approx(0.010, rel=0.03)


def test_a_stalled_step_does_not_price_a_batch_size():
    """A 0.4 s pause (e.g. a garbage collection) in one step: the first measurement of a
    size is the median of its first steps, later ones are clamped."""
    m = StepCostModel()
    for i in range(300):
        m.observe(1 + i % 32, 0.020 + 0.0014 * (1 + i % 32))
    m.observe(64, 0.415, speculative=True)  # the first verified step at 64 tokens stalls
    m.observe(64, 0.020 + 0.0014 * 32 + 0.0006 * 32, speculative=True)
    m.observe(64, 0.020 + 0.0014 * 32 + 0.0006 * 32, speculative=True)
    assert m.draft_cost(32, 32) == pytest.approx(0.0006 * 32, rel=0.02)
    before = m.threshold(4, 4)
    m.observe(1, 0.415)  # a stall in a plain batch-1 step, ~10 steps into its group:
    assert m.step_time(1) < 0.0214 * 1.1  # clamped to 2x, weight 1/10
    assert m.threshold(4, 4) == pytest.approx(before, rel=0.05)


def test_cost_model_rejects_counts_below_one():
    with pytest.raises(ValueError, match="stale_steps"):
        StepCostModel(stale_steps=0)


def test_a_slow_first_plain_measurement_is_capped_by_verified_steps_as_large():
    """Plain 8-token steps measured slow once (an engine's first steps), then the batch
    always drafts, so P(8) is never measured again: verified steps of 8 tokens bound it."""
    m = StepCostModel()
    for _ in range(3):
        m.observe(8, 0.150)
    for i in range(300):
        n = 4 + i % 60
        m.observe(n, 0.040 + 0.0029 * max(0, n - 9), speculative=True)
    assert m.step_time(8) == pytest.approx(0.040, rel=0.02)
    assert m.draft_cost(8, 16) == pytest.approx(0.0029 * 15, rel=0.1)


def test_a_time_that_moved_restarts_its_group():
    """Three steps in a row more than 2x off the group's mean, on one side, restart it
    from their median (clamping alone would take dozens of steps to follow)."""
    m = StepCostModel(buckets_per_octave=1)
    for _ in range(3):  # verified 9-token steps measured slow at first (one-time costs)
        m.observe(9, 1.0, speculative=True)
    for _ in range(20):
        m.observe(1, 0.1)
    assert m.step_time(9, speculative=True) == pytest.approx(1.0)
    m.observe(9, 0.15, speculative=True)  # clamped to 0.5: t = 0.875
    m.observe(9, 0.2, speculative=True)  # clamped to 0.4375: t = 0.79
    m.observe(9, 0.5, speculative=True)  # inside [t/2, 2t]: the run of outliers breaks
    assert m.step_time(9, speculative=True) > 0.5
    for t in (0.15, 0.14, 0.16):
        m.observe(9, t, speculative=True)
    assert m.step_time(9, speculative=True) == pytest.approx(0.15)


def test_a_plain_price_follows_a_new_level_within_a_few_steps():
    """Plain steps that became 1.6x faster (a cell of shorter contexts after one of
    longer ones; too little for a restart) move P(32) there within 15 steps, so an
    exploration at 40 tokens timed in the new level is not read as free; one stalled
    plain step moves it not at all (median of the last 3)."""
    m = StepCostModel()
    for _ in range(60):
        m.observe(32, 0.140)
    for _ in range(15):
        m.observe(32, 0.088)
    assert m.step_time(32) < 0.088 * 1.05
    m.observe(32, 0.400)  # a stall (e.g. a garbage collection)
    assert m.step_time(32) < 0.088 * 1.05
    fresh = StepCostModel()
    for t in (0.1, 0.1, 0.1, 0.4):  # the same right after a group starts
        fresh.observe(32, t)
    assert fresh.step_time(32) == pytest.approx(0.1)
    for _ in range(3):
        m.observe(40, 0.104, speculative=True)
    assert m.draft_cost(32, 8) == pytest.approx(0.104 - m.step_time(32), rel=0.01)
    assert m.draft_cost(32, 8) > 0.012


def test_a_verified_curve_timed_while_the_machine_was_slow_follows_its_steps():
    """P(32) and V(33..49) timed while the machine ran 2x slower (engines starting
    together); then every step drafts at the normal speed. Verified steps of three sizes,
    one each per size, move the whole verified curve there (no group sees the three
    steps in a row its own restart needs), and P(32), now above V of more tokens timed
    later, is due to be timed again."""
    m = StepCostModel()
    for _ in range(5):
        m.observe(32, 2 * 0.100, rows=32)
        for d in (1, 9, 17):
            m.observe(32 + d, 2 * (0.110 + 0.002 * d), speculative=True, rows=32)
    assert not m.plain_due(32)
    for d in (1, 9, 17):
        m.observe(32 + d, 0.110 + 0.002 * d, speculative=True, rows=32)
    assert m.step_time(41, speculative=True) == pytest.approx(0.128, rel=0.02)
    # the first of them went into its group before the median moved: a few % low
    assert m.step_time(33, speculative=True) == pytest.approx(0.112, rel=0.1)
    assert m.plain_due(32)


def test_one_group_whose_time_moved_does_not_move_the_others():
    """A one-time cost in one group (verified 9-token steps timed slow at first) moves
    only that group: the machine's speed is the median over the groups observed."""
    m = StepCostModel(buckets_per_octave=1)
    for _ in range(10):
        for n in (1, 2, 4):
            m.observe(n, 0.1 + 0.001 * n)
        m.observe(9, 1.0, speculative=True)
    for _ in range(3):
        m.observe(9, 0.15, speculative=True)
        for n in (1, 2, 4):
            m.observe(n, 0.1 + 0.001 * n)
    assert m.step_time(2) == pytest.approx(0.102, rel=0.01)
    assert m.step_time(9, speculative=True) == pytest.approx(0.15, rel=0.01)


def test_exploring_after_many_plain_steps_shows_one_full_draft():
    """Slow first verified steps price drafting out; after ``explore_every`` plain steps
    one request's full draft is shown anyway, so the cost is measured again."""
    m = StepCostModel(margin=1.5, explore_every=5)
    c = DraftLengthController(k=4)
    for _ in range(3):
        m.observe(2, 0.1)
    for _ in range(3):
        m.observe(2 + 4, 3.0, speculative=True)  # 2 rows + 4 drafts: 30x a plain step
    ids, drafts, kinds = ["a", "b"], [[1, 2, 3, 4], [5, 6]], [0, 0]
    for step in range(5):
        assert not m.exploring
        assert shown_drafts(c, m, ids, drafts, kinds, 2) == [[], []]
        m.observe(2, 0.1)
    assert m.exploring
    assert shown_drafts(c, m, ids, drafts, kinds, 2) == [[1, 2, 3, 4], []]
    assert not m.exploring  # counted again from here, timed or not (e.g. a prefill chunk)
    c.observe("a", [1, 2, 3, 4, 9])
    m.observe(6, 0.11, speculative=True)
    assert not m.exploring


def test_explorations_that_change_nothing_come_ever_more_rarely():
    """Where verifying drafts keeps not paying, the gap between explorations doubles
    (32, 64, ... up to ``explore_backoff`` x 32 steps); a step that verifies drafts of its
    own brings it back to ``explore_every``."""
    m = StepCostModel(margin=1.5, explore_every=4, explore_backoff=4)
    c = DraftLengthController(k=4)
    for _ in range(3):
        m.observe(2, 0.1)
        m.observe(6, 3.0, speculative=True)
    ids, drafts, kinds = ["a", "b"], [[1, 2, 3, 4], [5, 6]], [0, 0]

    def steps_to_exploration() -> int:
        n = 0
        while not any(shown_drafts(c, m, ids, drafts, kinds, 2)):
            m.observe(2, 0.1)
            n += 1
        m.observe(6, 3.0, speculative=True)  # the explored step: as slow as before
        return n

    assert [steps_to_exploration() for _ in range(5)] == [4, 8, 16, 16, 16]
    m.observe(3, 0.1, speculative=True)  # drafts verified on their own
    assert steps_to_exploration() == 4


def test_an_unmeasured_size_is_explored_until_it_counts():
    """Batch 8 after a slow start-up: verified 9-token steps timed at 1.2 s, plain 8-row
    steps at 55 ms. One exploration at 16 tokens (80 ms) does not count yet; the next
    steps explore it too until 3 are timed, then the start-up group leaves the curve and
    drafts that are always right are shown again."""
    m = StepCostModel(margin=1.5)
    c = DraftLengthController(k=8)
    for _ in range(3):
        m.observe(9, 1.2, speculative=True)
        m.observe(1, 0.05)
    ids = [f"r{i}" for i in range(8)]
    pos = 0  # every request's tokens are 0, 1, 2, ... and its draft the next 8
    explored = n = 0
    for _ in range(40):
        drafts = [list(range(pos + 1, pos + 9)) for _ in ids]
        shown = shown_drafts(c, m, ids, drafts, [0] * 8, 8)
        n = sum(map(len, shown))
        if n > 8:
            break
        explored += n == 8
        m.observe(8 + n, 0.080 if n else 0.055, speculative=bool(n))
        for rid, d in zip(ids, shown):
            c.observe(rid, list(range(pos + 1, pos + 2 + len(d))))
        pos += 1  # the exploring row runs ahead; the others' drafts still match
    assert explored == 3
    assert n > 8


def test_an_exploration_series_ends_when_drafting_pays_or_nothing_is_shown():
    """Explorations that continue until their size counts stop once a step verifies drafts
    of its own (nothing is left pending for later); an exploration that the step-size
    limit cuts to nothing is not counted as one."""
    m = StepCostModel(explore_every=4)
    for _ in range(3):
        m.observe(2, 0.1)
        m.observe(9, 0.3, speculative=True)
    for _ in range(4):
        m.observe(2, 0.1)
    assert m.exploring
    m.explored(18, backoff=True)  # a size never timed: the next steps would explore too
    m.observe(18, 0.2, speculative=True)
    assert m.exploring
    m.observe(5, 0.15, speculative=True)  # a step verifying drafts of its own
    assert not m.exploring
    m = StepCostModel(explore_every=4)
    c = DraftLengthController(k=8)
    for _ in range(3):
        m.observe(4, 0.1)
        m.observe(5, 2.0, speculative=True)
    assert m.token_limit() == 10
    ids = [f"r{i}" for i in range(10)]
    for _ in range(4):
        m.observe(4, 0.1)
    assert m.exploring  # rows above the limit: the exploration is cut to nothing
    assert not any(shown_drafts(c, m, ids, [[1, 2]] * 10, [0] * 10, 10))
    assert m.exploring  # not counted: still due


def test_a_start_up_price_of_full_drafts_leaves_the_curve():
    """Batch 8's first steps verified every request's full draft (72 tokens) at 2.5 s
    (start-up); later explorations time 16-token steps at 80 ms. No later step reaches 72
    tokens, but its time per token (35 ms) is over 2x the 16-token one's (5 ms): it
    leaves the curve, and 72 tokens are priced from what was measured since."""
    m = StepCostModel(margin=1.5)
    for _ in range(3):
        m.observe(72, 2.5, speculative=True)
    for _ in range(3):
        m.observe(8, 0.055)
    assert m.step_time(72, speculative=True) == pytest.approx(2.5)
    for _ in range(3):
        m.observe(16, 0.080, speculative=True)
    assert m.step_time(72, speculative=True) < 0.2


def test_a_step_grows_at_most_twice_past_what_was_measured():
    """Only 8-row plain and 16-token verified steps are measured, all cheap: drafts that
    would make a 72-token step are cut to 32 tokens in all, each keeping its first
    tokens, longest cut first; once 32-token steps count, to 64."""
    m = StepCostModel()
    for _ in range(3):
        m.observe(8, 0.055)
        m.observe(16, 0.060, speculative=True)
    assert m.token_limit() == 32
    c = DraftLengthController(k=8, prior_alpha=0.95)
    ids = [f"r{i}" for i in range(8)]
    drafts = [list(range(8)) for _ in range(7)] + [[0, 1]]
    shown = shown_drafts(c, m, ids, drafts, [0] * 8, 8)
    assert [len(d) for d in shown] == [3] * 7 + [2]
    assert all(d == full[:len(d)] for d, full in zip(shown, drafts))
    for _ in range(3):
        m.observe(32, 0.065, speculative=True)
    assert [len(d) for d in shown_drafts(c, m, ids, drafts, [0] * 8, 8)] == [7] * 7 + [2]


def _verified_only(**kwargs) -> StepCostModel:
    m = StepCostModel(margin=1.5, **kwargs)
    for _ in range(3):
        m.observe(9, 1.5, speculative=True)
    return m


def test_a_plain_step_is_timed_when_only_verified_steps_were():
    """A proposer that drafts at every step never runs a plain step: without one the cost
    model borrowed ``P`` from ``V`` and priced drafting at zero for good. A step that would
    verify drafts runs plain instead, until ``min_samples`` plain steps are timed; then
    drafting is priced and a poor guess is withheld by its length rule."""
    m = _verified_only()
    c = DraftLengthController(k=8, prior_alpha=0.05)  # guesses: rarely accepted
    guess = [list(range(8))]
    assert m.fitted and m.plain_due(1)
    assert m.draft_cost(1, 8) == 0.0  # the borrowed P: drafting looks free
    for step in range(3):
        assert m.plain_due(1)
        assert shown_drafts(c, m, ["a"], guess, [0], 1) == [[]]
        c.observe("a", [99])
        m.observe(1, 1.0)  # the probe step, timed: plain
    assert not m.plain_due(1) and m.draft_cost(1, 8) == pytest.approx(0.5)
    assert shown_drafts(c, m, ["a"], guess, [0], 1) == [[]]
    assert not m.plain_due(1)


def test_plain_probes_pause_when_untimed_and_resume_later():
    """Probe steps that carry a prefill chunk are not timed: after ``2 * min_samples`` of
    them drafts are shown again (priced as before), and ``explore_every`` timed decode
    steps later the probes resume."""
    m = _verified_only(explore_every=5)
    c = DraftLengthController(k=8, prior_alpha=0.05)
    guess = [list(range(8))]
    for _ in range(6):
        assert shown_drafts(c, m, ["a"], guess, [0], 1) == [[]]
        c.observe("a", [99])
    assert not m.plain_due(1)
    for _ in range(5):  # drafting at zero price, timed verified steps
        assert shown_drafts(c, m, ["a"], guess, [0], 1) == guess
        c.observe("a", [99])
        m.observe(9, 1.5, speculative=True)
    assert m.plain_due(1)
    assert shown_drafts(c, m, ["a"], guess, [0], 1) == [[]]


def test_no_plain_probe_while_a_row_prefills_or_nothing_would_verify():
    """A step with a row that does not decode is not timed, so it is no probe; a step
    whose drafts are withheld anyway runs plain without one. Drafts that promise much are
    probed too: without ``P`` they only looked worth showing."""
    m = _verified_only()
    weak = DraftLengthController(k=8, prior_alpha=0.05)
    drafts = [list(range(8)), []]
    assert shown_drafts(weak, m, ["a", "b"], drafts, [0, 0], 1) == drafts  # b prefills
    assert shown_drafts(weak, m, ["a"], [[]], [0], 1) == [[]]
    assert m.plain_due(1)  # still to be timed
    strong = DraftLengthController(k=8, prior_alpha=0.9)
    assert shown_drafts(strong, m, ["a"], [list(range(8))], [0], 1) == [[]]


def test_a_plain_price_from_start_up_is_timed_again():
    """Engines started together share the cores: one-token plain steps timed at 1.6 s,
    then every step drafts and verified steps are timed at 0.15 s. The plain price is
    older and slower than a verified step with more tokens, so a step that would draft
    runs plain; after ``min_samples`` of them (a time that moved) drafting is priced."""
    m = StepCostModel(margin=1.5)
    c = DraftLengthController(k=8, prior_alpha=0.9)
    for _ in range(3):
        m.observe(1, 1.6)
    for _ in range(3):
        m.observe(9, 0.15, speculative=True)
    assert m.draft_cost(1, 8) == 0.0 and m.plain_due(1)
    draft = [list(range(8))]
    for _ in range(3):
        assert shown_drafts(c, m, ["a"], draft, [0], 1) == [[]]
        c.observe("a", [99])
        m.observe(1, 0.1)
    assert not m.plain_due(1)
    assert m.draft_cost(1, 8) == pytest.approx(0.05)


def test_a_batch_size_priced_by_a_distant_plain_step_is_timed():
    """``P`` was timed at one token only; 32 rows decode: ``P(32)`` is an extrapolation
    five octaves away, so the step runs plain until ``P`` is timed near 32."""
    m = StepCostModel(margin=1.5)
    for _ in range(3):
        m.observe(1, 0.05)
        m.observe(100, 0.3, speculative=True)
    assert m.plain_due(32) and not m.plain_due(1)
    for _ in range(3):
        m.observe(32, 0.11)
    assert not m.plain_due(32) and not m.plain_due(20)
    assert m.plain_due(8)  # a factor 4 from both plain sizes


def test_a_group_back_after_stale_steps_is_measured_again():
    """A size unobserved for ``stale_steps`` steps leaves the curve; when it comes back
    its old mean is not averaged with the new steps, it restarts from their median."""
    m = StepCostModel(stale_steps=50)
    for _ in range(3):
        m.observe(8, 0.5)
    for _ in range(60):
        m.observe(1, 0.1)
    for _ in range(3):
        m.observe(8, 0.2)
    assert m.step_time(8) == pytest.approx(0.2)


def test_a_probed_batch_size_is_not_pooled_with_its_start_up_price():
    """The e2e batch-32 engine: one-token plain steps timed at 3 s while the other engines
    started, then three probes time 32-token plain steps at 0.15 s. Pooled, ``P(32)`` read
    1.6 s and every draft looked free; the start-up price is left out instead."""
    m = StepCostModel(margin=1.5)
    for _ in range(3):
        m.observe(1, 3.0)
        m.observe(9, 2.5, speculative=True)
    assert m.plain_due(32)
    for _ in range(3):
        m.observe(32, 0.15)
    assert m.step_time(32) == pytest.approx(0.15)


def _run(m: StepCostModel, c: DraftLengthController, rows_per_step: list[int],
         plain_s, verified_s) -> int:
    """Drive ``shown_drafts`` over steps of the given rows, every request drafting 8
    tokens that are all accepted; returns how many steps ran plain."""
    plain = 0
    for rows in rows_per_step:
        ids = [f"r{i}" for i in range(rows)]
        shown = shown_drafts(c, m, ids, [list(range(8))] * rows, [0] * rows, rows)
        d = sum(map(len, shown))
        for rid, draft in zip(ids, shown):
            c.observe(rid, draft + [99] if draft else [0])
        plain += d == 0
        m.observe(rows + d, verified_s(rows + d) if d else plain_s(rows), speculative=d > 0)
    return plain


def test_plain_probes_are_bounded_while_a_batch_shrinks():
    """32 requests finishing one per step while every step drafts: each smaller size is
    an extrapolation of ``P``, but at most ``2 * min_samples`` steps per ``explore_every``
    run plain for it."""
    m = StepCostModel(margin=1.5)
    c = DraftLengthController(k=8, prior_alpha=0.95)
    gpu = (lambda n: 0.05 + 0.0001 * n, lambda n: 0.052 + 0.0001 * n)  # drafting pays
    assert _run(m, c, [32] * 40, *gpu) == 3  # P(32) measured once, then drafts
    assert _run(m, c, list(range(31, 0, -1)), *gpu) <= 2 * m.min_samples


def test_a_plain_path_slower_for_good_is_timed_again_once():
    """A plain step that really costs 1.3x a verified one with more tokens (another code
    path): it is measured anew once, then kept until a verified time moves."""
    m = StepCostModel(margin=1.5)
    c = DraftLengthController(k=8, prior_alpha=0.95)
    costs = (lambda n: 0.013, lambda n: 0.010)
    assert _run(m, c, [1] * 200, *costs) <= 2 * m.min_samples


@given(st.lists(st.floats(0.9, 1.1), min_size=20, max_size=20))
def test_noise_between_flat_steps_probes_no_plain_step(noise):
    """A memory-bound GPU: a 9-token verified step costs what a plain one does. Noise of
    +-10% between steps never makes the plain price look stale."""
    m = StepCostModel()
    for i, x in enumerate(noise):
        m.observe(1, 0.010 * x)
        m.observe(9, 0.0105 * noise[-1 - i], speculative=True)
        assert not m.plain_due(1)


def test_a_size_priced_at_start_up_is_explored_while_short_drafts_verify():
    """An engine's first steps ran slow (other engines starting): 9-token verified steps
    at 0.45 s. Later one-token drafts keep verifying at 0.1 s, so some step verifies every
    ``explore_every`` steps, but 9 tokens are not measured again: after
    ``explore_size_every`` steps that size is explored, its one fresh step replaces the
    stale mean, and the stale 4-token group no longer holds the curve up."""
    m = StepCostModel(margin=1.5, explore_every=8, explore_size_every=8)
    for _ in range(3):
        m.observe(9, 0.45, speculative=True)
        m.observe(4, 0.40, speculative=True)
    c = DraftLengthController(k=8)
    full = [[1, 2, 3, 4, 5, 6, 7, 8]]
    explored = []
    for step in range(40):
        m.observe(1, 0.09)
        m.observe(2, 0.10, speculative=True)
        shown = shown_drafts(c, m, ["a"], [list(d) for d in full], [0], 1)
        c.observe("a", [1, 2])
        if len(shown[0]) == 8:
            explored.append(step)
            m.observe(9, 0.14, speculative=True)
    assert explored and explored[0] < 8
    assert m.step_time(9, speculative=True) == pytest.approx(0.14, rel=0.05)
    assert m.step_time(4, speculative=True) < 0.14


def test_a_stale_verified_group_restarts_from_one_faster_step():
    """A verified group not observed for ``explore_every`` steps takes its next step's
    time when that is more than 2x faster (one is enough: it is measured that rarely);
    a slower one, or a plain group, needs three in a row (interference only slows)."""
    m = StepCostModel(buckets_per_octave=1, explore_every=10)
    for _ in range(3):
        m.observe(9, 1.0, speculative=True)
        m.observe(17, 0.2, speculative=True)
        m.observe(1, 0.1)
    for _ in range(20):
        m.observe(1, 0.1)
    m.observe(9, 0.15, speculative=True)
    assert m.step_time(9, speculative=True) == pytest.approx(0.15)
    m.observe(17, 0.9, speculative=True)  # stale, but slower: clamped, not restarted
    assert m.step_time(17, speculative=True) < 0.3
    for _ in range(20):
        m.observe(9, 0.15, speculative=True)
    m.observe(1, 0.3)  # the plain group is stale too: one slow step does not restart it
    assert m.step_time(1) < 0.12


def test_a_plain_group_back_after_a_while_restarts_from_its_next_steps():
    """A plain group unobserved for ``explore_every`` steps (a batch that drained and
    refilled with other contexts) restarts from the median of its next 3 steps, faster
    or slower, following its running mean until then; observed within the gap, the
    running mean moves it a little per step, unless 3 steps in a row read more than
    ``LEVEL_SHIFT_RATIO`` off it on one side (a new batch's contexts: it restarts)."""
    def back_after_a_gap(times):
        m = StepCostModel(buckets_per_octave=1, explore_every=10)
        for _ in range(3):
            m.observe(32, 0.105, rows=32)
        for _ in range(20):
            m.observe(4, 0.05, rows=4)
        for t in times:
            m.observe(32, t, rows=32)
        return m.step_time(32)

    assert back_after_a_gap([0.122]) == pytest.approx(0.105, rel=0.05)  # one step: a stall?
    assert back_after_a_gap([0.122, 0.090, 0.088]) == pytest.approx(0.090)
    assert back_after_a_gap([0.130, 0.128, 0.300]) == pytest.approx(0.130)
    m = StepCostModel(buckets_per_octave=1, explore_every=10)
    for _ in range(3):
        m.observe(32, 0.105, rows=32)
    for _ in range(3):  # not stale, within 10%: the running mean (weight 0.2) follows
        m.observe(32, 0.097, rows=32)
    assert m.step_time(32) > 0.100
    for _ in range(2):  # more than 10% off, on one side: the time has moved
        m.observe(32, 0.090, rows=32)
    assert m.step_time(32) > 0.097
    m.observe(32, 0.088, rows=32)
    assert m.step_time(32) == pytest.approx(0.090)
    for t in (0.080, 0.100, 0.079):  # off on both sides: noise, no restart
        m.observe(32, t, rows=32)
    assert m.step_time(32) > 0.085
    before = m.step_time(32)
    for _ in range(3):  # slower (interference only slows): the running mean, no restart
        m.observe(32, 1.25 * before, rows=32)
    assert m.step_time(32) < 1.15 * before


def test_a_new_batch_with_shorter_contexts_is_priced_by_its_own_plain_steps():
    """The e2e benchmark's batch-32 ``naive`` engine (decision log, 2026-12-07): the
    warm-up's 32-row plain steps took ~166 ms and its draining tail's 27-31-row ones
    ~166 ms too (long copy prompts); the next cell's 32-row steps took 97-119 ms. Pooled
    with the tail and moved by a running mean, ``P(32)`` read 137-168 ms for 30 steps;
    now the tail is left out and the group restarts from the cell's first 3 steps."""
    m = StepCostModel(margin=1.5)
    for _ in range(5):
        m.observe(32, 0.166, rows=32)
    for rows in (31, 30, 29, 29, 28, 28, 24, 20, 16, 12, 8, 4):
        m.observe(rows, 0.166 * (0.5 + rows / 64), rows=rows)
    for t in (0.112, 0.101, 0.102):
        m.observe(32, t, rows=32)
    assert m.step_time(32) == pytest.approx(0.102)
    for t in (0.111, 0.105, 0.106, 0.107, 0.098):  # noise around the new level
        m.observe(32, t, rows=32)
    assert 0.100 < m.step_time(32) < 0.108


def test_a_stale_out_of_order_size_is_dropped_not_pooled():
    m = StepCostModel(buckets_per_octave=1, explore_every=10)
    for _ in range(3):
        m.observe(4, 0.40, speculative=True)  # measured long ago
    for _ in range(30):
        m.observe(1, 0.1)
        m.observe(9, 0.15, speculative=True)
    assert m.step_time(4, speculative=True) <= 0.15
    assert m.step_time(9, speculative=True) == pytest.approx(0.15)


def test_paired_steps_price_a_small_draft_the_drifting_curves_understate():
    """The e2e batch-8 engine (time-sliced): 9-token verified steps were timed when the
    machine was quiet (60 ms); now plain 8-row steps take 64 ms and one draft token makes
    them 70 ms. ``V(9)``, smoothed over its history, still reads about 60 ms, so
    ``V(9) - P(8)`` is about 0; verified steps next to plain ones of the same rows
    measure the 6 ms directly, and a one-token draft no longer pays."""
    m = StepCostModel(margin=1.5)
    for _ in range(20):
        m.observe(8, 0.058, rows=8)
        m.observe(9, 0.060, speculative=True, rows=8)
    for _ in range(3):
        m.observe(8, 0.064, rows=8)
        m.observe(8, 0.064, rows=8)
        m.observe(9, 0.070, speculative=True, rows=8)
    assert m.step_time(9, True) - m.step_time(8) < 0.001
    # kept relative to the plain step: 70 / 64 - 1 of P(8)
    assert m.paired_cost(8, 1) == pytest.approx((0.070 / 0.064 - 1) * m.step_time(8))
    assert m.draft_cost(8, 1) == m.paired_cost(8, 1)
    assert m.draft_cost(8, 4) >= m.paired_cost(8, 1)  # more draft tokens cost no less
    assert m.paired_cost(8, 0) == 0.0 and m.paired_cost(7, 1) == 0.0  # nothing paired
    # E accepted tokens pay for 6 ms on a 64 ms step of 8 rows iff E > 1.5 * 8 * 6 / 64
    assert not m.pays_off(8, expected_accepted=1.0, draft_tokens=1)
    assert m.pays_off(8, expected_accepted=1.2, draft_tokens=1)


def test_steps_are_paired_only_with_a_close_step_of_the_same_rows():
    m = StepCostModel(pair_gap=2)
    for i in range(10):  # other rows in between: 3 steps apart
        m.observe(8 + i % 2, 0.06 + 0.02 * (i % 2), speculative=bool(i % 2), rows=8)
        for _ in range(2):
            m.observe(4, 0.03, rows=4)
    assert m.paired_cost(8, 1) == 0.0
    for _ in range(3):  # a plain step after a verified one pairs with it, once
        m.observe(9, 0.08, speculative=True, rows=8)
        m.observe(8, 0.07, rows=8)
        m.observe(8, 0.05, rows=8)
        for _ in range(3):
            m.observe(4, 0.03, rows=4)
    assert m.paired_cost(8, 1) == pytest.approx((0.08 / 0.07 - 1) * m.step_time(8))


def test_a_machine_slowed_for_a_while_does_not_inflate_the_paired_cost():
    """Engines starting together: every step 10x slower for a while. The pairs are kept
    relative to the plain step, so the price read afterwards is the quiet machine's."""
    m = StepCostModel()
    for slow in [10.0] * 5 + [1.0] * 2:
        m.observe(8, slow * 0.060, rows=8)
        m.observe(9, slow * 0.066, speculative=True, rows=8)
    for _ in range(6):
        m.observe(8, 0.060, rows=8)
    assert m.paired_cost(8, 1) == pytest.approx(0.006, rel=0.05)


@given(st.lists(st.tuples(st.floats(1, 100), st.floats(0.01, 1.0), st.floats(0.5, 20),
                          st.integers(0, 300)), min_size=1, max_size=12))
def test_isotonic_fit_is_non_decreasing_and_never_empty(points):
    from vllm_specext.adaptive import _isotonic

    points.sort()
    xs, ys = _isotonic(points, 32)
    assert xs and all(b >= a * (1 - 1e-12) for a, b in zip(xs, xs[1:]))
    assert all(b >= a * (1 - 1e-12) for a, b in zip(ys, ys[1:]))


def test_isotonic_drops_an_old_point_only_when_it_is_the_slower_one():
    from vllm_specext.adaptive import _isotonic

    # measured slow long ago at fewer tokens than a newer, faster size: left out
    xs, _ = _isotonic([(4.0, 0.40, 3.0, 10), (9.0, 0.15, 20.0, 100)], 32)
    assert xs == [9.0]
    # much slower than a size of more tokens measured after it: left out at once
    xs, _ = _isotonic([(1.0, 3.2, 3.0, 10), (32.0, 0.15, 3.0, 25)], 32)
    assert xs == [32.0]
    # the plain curve (shift 1.1, close 4): more than 10% slower than a size of more
    # tokens measured over 4 steps later (the previous batch's longer contexts): left out
    xs, ys = _isotonic([(29.0, 0.166, 5.0, 10), (32.0, 0.104, 3.0, 20)], 32, 1.1, 4)
    assert xs == [32.0]
    # ... but pooled when the two were measured within 4 steps (rows alternating between
    # two sizes: noise), when they are within 10%, and on the verified curve (2x)
    for points, shift, close in (([(29.0, 0.115, 3.0, 19), (32.0, 0.102, 3.0, 20)], 1.1, 4),
                                 ([(8.0, 0.105, 3.0, 10), (9.0, 0.10, 3.0, 25)], 1.1, 4),
                                 ([(29.0, 0.166, 5.0, 10), (32.0, 0.104, 3.0, 20)], 2.0, 0)):
        xs, ys = _isotonic(points, 32, shift, close)
        assert len(xs) == 1, points
    # an old fast size next to a newer slow one (interference only slows): pooled
    xs, ys = _isotonic([(2.0, 0.30, 20.0, 100), (9.0, 0.14, 3.0, 50)], 32)
    assert len(xs) == 1 and 0.14 < ys[0] < 0.30


@pytest.mark.parametrize("make, key", [
    (lambda: DraftLengthController(k=0), "k"),
    (lambda: DraftLengthController(k=8, probe_every=0), "probe_every"),
    (lambda: DraftLengthController(k=8, num_kinds=0), "num_kinds"),
    (lambda: DraftLengthController(k=8, decay=1.0), "decay"),
    (lambda: DraftLengthController(k=8, prior_weight=0.0), "prior_weight"),
    (lambda: StepCostModel(smoothing=0.0), "smoothing"),
    (lambda: StepCostModel(plain_smoothing=1.5), "plain_smoothing"),
    (lambda: StepCostModel(margin=0.5), "margin"),
    (lambda: StepCostModel(explore=1.5), "explore"),
    (lambda: StepCostModel(explore_backoff=0), "explore_backoff"),
    (lambda: StepCostModel(pair_window=0), "pair_window"),
])
def test_out_of_range_arguments_are_named(make, key):
    with pytest.raises(ValueError, match=rf"\b{key} must be"):
        make()


def test_last_finisher_shares_go_to_the_largest_budgets_left():
    # a step commits up to k + 1 = 9 tokens: budgets within 9 of the most share
    assert last_finisher_shares([40, 10, 35, 30], k=8) == [0.5, 0.0, 0.5, 0.0]
    assert last_finisher_shares([5, 0, 2], k=8) == pytest.approx([1 / 3] * 3)
    # budgets far beyond what end-of-sequence gives: within 10% of the most, all share
    assert last_finisher_shares([4000, 3700, 3900], k=8) == pytest.approx([1 / 3] * 3)
    assert last_finisher_shares([3000], k=8) == [1.0]
    assert last_finisher_shares([], k=8) == []


def _linear_model():
    """Plain steps 20 ms + 1 ms per row, verified ones the same per token plus 2 ms."""
    m = StepCostModel()
    for i in range(600):
        rows = 1 + i % 8
        m.observe(rows, 0.020 + 0.001 * rows)
        n = rows + 1 + i % 16
        m.observe(n, 0.022 + 0.001 * n, speculative=True)
    return m


def test_token_weights_while_draining():
    """P(8) = 28 ms, a draft token 1 ms: a token saves b = 1 ms of a request that finishes
    before another, b + a = 21 ms of the last one; 28 / 8 = 3.5 ms on average."""
    m = _linear_model()
    assert m.token_weights(8, 8, [1 / 8] * 8) == pytest.approx([1.0] * 8)
    w = m.token_weights(8, 8, [0.5, 0.5] + [0.0] * 6)
    assert w[0] == pytest.approx((0.001 + 0.020 * 0.5) * 8 / 0.028, rel=0.02)
    assert w[2] == pytest.approx(0.001 * 8 / 0.028, rel=0.02)
    assert m.token_weights(1, 8, [1.0]) == pytest.approx([1.0])  # alone: a whole step
    assert StepCostModel().token_weights(4, 8, [0.25] * 4) == [1.0] * 4  # not measured


def test_draining_drafts_only_for_the_requests_that_finish_last():
    m = _linear_model()
    c = DraftLengthController(8)
    ids = [f"r{i}" for i in range(8)]
    for _ in range(6):  # every request's drafts accepted at ~0.6
        for rid in ids:
            c.trim([rid], [[1, 2, 3, 4, 5, 6, 7, 8]], 0.0)
            c.observe(rid, [1, 2, 3, 9])
    drafts = [[1, 2, 3, 4, 5, 6, 7, 8] for _ in ids]
    kinds = [0] * 8
    queued = shown_drafts(c, m, ids, [list(d) for d in drafts], kinds, 8)
    assert all(queued)  # with a queue every row's tokens are worth P(8) / 8
    remaining = [60, 10, 12, 8, 20, 14, 9, 11]  # r0 finishes last
    drained = shown_drafts(c, m, ids, [list(d) for d in drafts], kinds, 8,
                           remaining=remaining)
    assert drained[0] and not any(drained[1:])


def test_a_plain_price_is_capped_by_verified_steps_of_more_tokens():
    # P(32) timed on slower steps (longer contexts) than the verified steps that follow:
    # a plain 32-row step costs no more than a verified 40-token one, below V's first knot too
    model = StepCostModel(margin=1.5)
    for _ in range(3):
        model.observe(32, 0.270, False, rows=32)
    for tokens, seconds in ((40, 0.160), (88, 0.310)):
        for _ in range(3):
            model.observe(tokens, seconds, True, rows=32)
    assert model.step_time(32) == pytest.approx(0.160)
    assert model.threshold(32, 56) > 0.8  # uncapped: 1.5 * 32 * 2.7 ms / 270 ms = 0.48
