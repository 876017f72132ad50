"""Unit tests of vllm_specext.verify (pure torch, no vLLM): output contract, strategies,
policies, losslessness (chi-square) and seeding."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_specext.config import SpecExtConfigError
from vllm_specext.verify import VerifySpec, parse_request_override, verify_drafts
from vllm_specext.verify.ops import argmax_last, sample_rows

NAMES = ["standard", "greedy", "target_match", "top_p", "topp"]
POLICIES = ["normal", "accept_all", "reject_all"]


# ---------------------------------------------------------------------------- helpers
def chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square goodness-of-fit p-value of ``counts`` against ``probs``."""
    n = counts.sum()
    expected = probs.double() * n
    stat = ((counts.double() - expected) ** 2 / expected).sum()
    df = torch.tensor(probs.numel() - 1, dtype=torch.float64)
    return float(torch.special.gammaincc(df / 2, stat / 2))


def batch_of(logits_rows: list[torch.Tensor], drafts: list[int], n: int):
    """``n`` identical requests: drafts ``drafts`` with target rows ``logits_rows``."""
    k = len(drafts)
    logits = torch.stack(logits_rows).repeat(n, 1)
    d = torch.tensor(drafts, dtype=torch.int32).repeat(n)
    cu = torch.arange(1, n + 1, dtype=torch.int32) * k
    return logits, d, cu, [k] * n


# ---------------------------------------------------------------------------- ops
@pytest.mark.parametrize("vocab", [4096, 1000, 151936 // 4])
def test_argmax_last_matches_torch_with_ties(vocab):
    g = torch.Generator().manual_seed(vocab)
    x = torch.randn(9, vocab, generator=g).to(torch.bfloat16).float()  # many ties
    x[1, :] = float("-inf")
    x[2, 5:] = x[2].max() + 1  # ties spanning several chunks
    x[3, vocab - 1] = 1e9
    assert torch.equal(argmax_last(x), x.argmax(-1))


def test_sample_rows_never_picks_zero_weight():
    w = torch.tensor([[0.0, 1.0, 0.0, 2.0, 0.0]] * 4)
    u = torch.tensor([0.0, 0.3333, 0.5, 1.0 - 1e-16], dtype=torch.float64)
    assert sample_rows(w, u).tolist() == [1, 1, 3, 3]


def test_sample_rows_two_level_distribution():
    """The chunked path (V divisible by a chunk width) samples the right distribution."""
    g = torch.Generator().manual_seed(0)
    vocab, n = 256, 50_000  # 8 chunks of 32
    w = torch.rand(vocab, generator=g) ** 4
    w[:40] = 0.0  # a whole zero chunk and part of the next
    w[100:103] = 0.0
    w[-1] = 0.0
    u = torch.rand(n, dtype=torch.float64, generator=g)
    u[:3] = torch.tensor([0.0, 1.0 - 1e-16, 0.5], dtype=torch.float64)
    counts = torch.bincount(sample_rows(w.expand(n, -1).contiguous(), u), minlength=vocab)
    assert counts[w == 0].sum() == 0
    groups = torch.arange(vocab) // 16  # 16 groups; the first three hold little mass
    observed = torch.zeros(16).index_add_(0, groups, counts.float())[3:]
    expected = torch.zeros(16).index_add_(0, groups, w)[3:]
    assert chi2_pvalue(observed, expected / expected.sum()) > 1e-4


@pytest.mark.parametrize("strategy", ["standard", "top_p", "target_match"])
def test_row_tiles_do_not_change_results(monkeypatch, strategy):
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(40, 64, generator=g)
    drafts = torch.randint(-1, 64, (40,), generator=g, dtype=torch.int32)
    q = torch.rand(40, 64, generator=g).softmax(-1)
    nums = [10, 0, 7, 23]

    def run(want_target_tokens):
        torch.manual_seed(0)
        res = verify_drafts(drafts, torch.tensor(nums).cumsum(0), logits,
                            torch.tensor([[1], [2], [3], [4]]), False, num_draft_tokens=nums,
                            strategy=strategy, draft_probs=q,
                            return_target_tokens=want_target_tokens)
        return res.output_token_ids, res.target_token_ids

    whole, whole_out_only = run(True), run(False)
    monkeypatch.setattr("vllm_specext.verify.ops.TILE_BYTES", 3 * 64 * 4)  # 3-row tiles
    tiled = run(True)
    assert torch.equal(whole[0], tiled[0]) and torch.equal(whole[1], tiled[1])
    assert torch.equal(whole[0], whole_out_only[0]), "same tokens with or without targets"


# ---------------------------------------------------------------------------- contract
@st.composite
def batches(draw):
    batch = draw(st.integers(1, 6))
    nums = draw(st.lists(st.integers(0, 5), min_size=batch, max_size=batch))
    vocab = draw(st.integers(2, 24))
    seed = draw(st.integers(0, 2**31 - 1))
    per_row = draw(st.booleans())
    strategy = (draw(st.lists(st.sampled_from(NAMES), min_size=batch, max_size=batch))
                if per_row else draw(st.sampled_from(NAMES)))
    policy = (draw(st.lists(st.sampled_from(POLICIES), min_size=batch, max_size=batch))
              if draw(st.booleans()) else draw(st.sampled_from(POLICIES)))
    greedy = draw(st.sampled_from(["all", "none", "mixed"]))
    extra_width = draw(st.integers(0, 2))
    return dict(batch=batch, nums=nums, vocab=vocab, seed=seed, strategy=strategy,
                policy=policy, greedy=greedy, top_p=draw(st.floats(0.05, 1.0)),
                extra_width=extra_width, want_target=draw(st.booleans()))


def _make(case):
    g = torch.Generator().manual_seed(case["seed"])
    batch, nums, vocab = case["batch"], case["nums"], case["vocab"]
    total = sum(nums)
    logits = torch.randn(total, vocab, generator=g) * 2
    logits[torch.rand(total, vocab, generator=g) < 0.3] = float("-inf")  # top-k style masks
    logits[torch.arange(total), torch.randint(0, vocab, (total,), generator=g)] = 0.0
    argmax = logits.argmax(-1)
    r = torch.rand(total, generator=g)
    drafts = torch.where(r < 0.6, argmax, torch.randint(0, vocab, (total,), generator=g))
    drafts = torch.where(r > 0.93, -1, drafts).to(torch.int32)
    cu = torch.tensor(nums, dtype=torch.int64).cumsum(0).to(torch.int32)
    bonus = torch.randint(0, vocab, (batch, 1), generator=g)
    if case["greedy"] == "all":
        greedy = True
    elif case["greedy"] == "none":
        greedy = False
    else:
        greedy = torch.rand(batch, generator=g) < 0.5
    return logits, drafts, cu, bonus, greedy


@settings(max_examples=120, deadline=None)
@given(batches())
def test_output_contract(case):
    logits, drafts, cu, bonus, greedy = _make(case)
    nums, batch, vocab = case["nums"], case["batch"], case["vocab"]
    width = max(nums, default=0) + case["extra_width"]
    logits_before = logits.clone()
    res = verify_drafts(drafts, cu, logits, bonus, greedy, {}, num_draft_tokens=nums,
                        max_spec_len=width, strategy=case["strategy"],
                        accept_policy=case["policy"], top_p=case["top_p"],
                        return_target_tokens=case["want_target"])
    out = res.output_token_ids
    assert out.dtype == torch.int32 and out.shape == (batch, width + 1)
    assert torch.equal(logits, logits_before), "target logits are reused by vLLM (logprobs)"
    probs = logits.softmax(-1)
    argmax = logits.argmax(-1)
    greedy_rows = [greedy] * batch if isinstance(greedy, bool) else greedy.tolist()
    strategies = case["strategy"] if isinstance(case["strategy"], list) else \
        [case["strategy"]] * batch
    policies = case["policy"] if isinstance(case["policy"], list) else [case["policy"]] * batch
    tt = res.target_token_ids
    assert (tt is not None) == case["want_target"]
    start = 0
    for i, n in enumerate(nums):
        d = drafts[start:start + n].tolist()
        row = out[i].tolist()
        a = int(res.num_accepted[i])
        strat = "top_p" if strategies[i] == "topp" else strategies[i]
        argmax_row = greedy_rows[i] or strat == "greedy"
        assert 0 <= a <= n
        assert row[:a] == d[:a] and all(t >= 0 for t in d[:a]), "only real drafts accepted"
        assert all(t == -1 for t in row[a + 1:]), "-1 padding after the last token"
        last = row[a]
        if a == n:
            assert last == int(bonus[i])
        else:
            assert 0 <= last < vocab and probs[start + a, last] > 0
            if argmax_row:
                assert last == int(argmax[start + a])
        first_invalid = next((j for j, t in enumerate(d) if t < 0), n)
        if policies[i] == "accept_all":
            assert a == first_invalid
        elif policies[i] == "reject_all":
            assert a == 0
        elif strat == "top_p":
            for j in range(min(a + 1, n)):
                p = probs[start + j]
                mass = float(p[p > p[d[j]]].sum()) if d[j] >= 0 else 2.0
                if case["top_p"] >= 1.0:
                    assert (d[j] >= 0 and p[d[j]] > 0) == (j < a)
                elif abs(mass - case["top_p"]) > 1e-5:  # float rounding at the boundary
                    assert (mass < case["top_p"] and p[d[j]] > 0) == (j < a)
        elif argmax_row:
            leading = next((j for j, t in enumerate(d) if t != int(argmax[start + j])), n)
            assert a == leading
        else:
            assert all(probs[start + j, d[j]] > 0 for j in range(a))
        if tt is not None:
            t_row = tt[start:start + n]
            assert all(0 <= t < vocab and probs[start + j, t] > 0
                       for j, t in enumerate(t_row.tolist()))
            if argmax_row:
                assert torch.equal(t_row, argmax[start:start + n])
            if a < n:
                assert int(t_row[a]) == last
            if policies[i] == "normal" and strat != "top_p":
                assert t_row[:a].tolist() == d[:a]
        start += n


def test_empty_batch_emits_bonus_only():
    res = verify_drafts(torch.empty(0, dtype=torch.int32), torch.zeros(3, dtype=torch.int32),
                        torch.empty(0, 7), torch.tensor([[4], [5], [6]]), False,
                        num_draft_tokens=[0, 0, 0], max_spec_len=2,
                        return_target_tokens=True)
    assert res.output_token_ids.tolist() == [[4, -1, -1], [5, -1, -1], [6, -1, -1]]
    assert res.target_token_ids.numel() == 0


# ---------------------------------------------------------------------------- policies
@pytest.mark.parametrize("strategy", NAMES)
@pytest.mark.parametrize("greedy", [True, False])
def test_accept_all_and_reject_all(strategy, greedy):
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(10, 50, generator=g)
    drafts = torch.randint(0, 50, (10,), generator=g, dtype=torch.int32)
    drafts[7] = -1
    nums = [3, 0, 5, 2]  # rows: [0:3], [], [3:8] with -1 at position 4, [8:10]
    cu = torch.tensor(nums).cumsum(0)
    bonus = torch.tensor([[11], [12], [13], [14]])
    kw = dict(num_draft_tokens=nums, strategy=strategy)
    out = verify_drafts(drafts, cu, logits, bonus, greedy, accept_policy="accept_all",
                        **kw).output_token_ids.tolist()
    assert out[0][:4] == drafts[0:3].tolist() + [11]
    assert out[1] == [12, -1, -1, -1, -1, -1]
    assert out[2][:4] == drafts[3:7].tolist() and out[2][4] != -1 and out[2][5] == -1
    assert out[3][:3] == drafts[8:10].tolist() + [14]
    res = verify_drafts(drafts, cu, logits, bonus, greedy, accept_policy="reject_all",
                        return_target_tokens=True, **kw)
    out = res.output_token_ids
    assert (out[:, 1:] == -1).all() and (out[:, 0] >= 0).all()
    assert out[1, 0] == 12
    assert out[[0, 2, 3], 0].tolist() == res.target_token_ids[[0, 3, 8]].tolist()


def test_invalid_drafts_are_never_accepted():
    logits = torch.full((4, 5), -30.0)
    logits[:, 2] = 30.0  # p(2) == 1
    drafts = torch.tensor([2, -1, 2, 2], dtype=torch.int32)
    for strategy in NAMES:
        for greedy in (True, False):
            out = verify_drafts(drafts, torch.tensor([4]), logits, torch.tensor([[3]]), greedy,
                                strategy=strategy).output_token_ids
            assert out.tolist() == [[2, 2, -1, -1, -1]], (strategy, greedy)


def test_top_p_nucleus_and_alias():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]] * 3)
    drafts = torch.tensor([1, 2, 3], dtype=torch.int32)
    for top_p, accepted in [(0.45, 0), (0.7, 1), (0.85, 2), (0.99, 3)]:
        for name in ("top_p", "topp"):
            res = verify_drafts(drafts, torch.tensor([3]), probs.log(), torch.tensor([[0]]),
                                True, strategy=name, top_p=top_p)
            assert int(res.num_accepted[0]) == accepted
            assert res.output_token_ids[0, accepted] == 0  # the argmax, or the bonus


def test_per_row_strategies_in_one_pass():
    """Greedy-verified rows give the same result alone and inside a mixed batch."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(9, 40, generator=g)
    drafts = logits.argmax(-1).to(torch.int32)
    drafts[4] = (drafts[4] + 1) % 40
    nums, cu = [3, 3, 3], torch.tensor([3, 6, 9])
    bonus = torch.tensor([[1], [2], [3]])
    mixed = verify_drafts(drafts, cu, logits, bonus, False,
                          strategy=["greedy", "greedy", "target_match"],
                          accept_policy=["normal", "accept_all", "reject_all"],
                          num_draft_tokens=nums).output_token_ids
    alone = verify_drafts(drafts[:6], cu[:2], logits[:6], bonus[:2], False, strategy="greedy",
                          accept_policy=["normal", "accept_all"], num_draft_tokens=nums[:2])
    assert torch.equal(mixed[:2], alone.output_token_ids)
    assert mixed[0].tolist() == drafts[:3].tolist() + [1]
    assert mixed[1, :2].tolist() == drafts[3:5].tolist()
    assert (mixed[2, 1:] == -1).all()


# ---------------------------------------------------------------------------- losslessness
N_SAMPLES = 40_000


def _position_dists(out: torch.Tensor, drafts: list[int], vocab: int):
    """Counts of the token at position j among rows whose first j tokens equal drafts."""
    counts = []
    prefix_ok = torch.ones(out.shape[0], dtype=torch.bool)
    for j in range(len(drafts) + 1):
        counts.append(torch.bincount(out[prefix_ok, j].long(), minlength=vocab))
        if j < len(drafts):
            prefix_ok &= out[:, j] == drafts[j]
    return counts


@pytest.mark.parametrize("strategy,policy,with_q", [
    ("standard", "normal", False), ("target_match", "normal", False),
    ("standard", "normal", True), ("target_match", "normal", True),
    ("standard", "reject_all", False),
])
def test_sampled_distribution_equals_target(strategy, policy, with_q):
    """At temperature 1, each emitted token follows the target's distribution given the
    prefix (chi-square, alpha 1e-4), and the same counts reject a 2% shifted target."""
    torch.manual_seed(1234)
    vocab = 12
    rows = [torch.randn(vocab) for _ in range(4)]  # positions 0..2 and the bonus position
    probs = [r.softmax(-1) for r in rows]
    drafts = [int(probs[0].argsort()[-3]), int(probs[1].argmax()), int(probs[2].argsort()[-2])]
    logits, d, cu, nums = batch_of(rows[:3], drafts, N_SAMPLES)
    bonus = torch.multinomial(probs[3], N_SAMPLES, replacement=True).unsqueeze(-1)
    q = None
    if with_q:  # drafts drawn from a different distribution q, per request
        q_rows = [torch.randn(vocab).softmax(-1) for _ in range(3)]
        q = torch.stack(q_rows).repeat(N_SAMPLES, 1)
        d = torch.multinomial(q, 1).squeeze(-1).to(torch.int32)
    out = verify_drafts(d, cu, logits, bonus, False, num_draft_tokens=nums, strategy=strategy,
                        accept_policy=policy, draft_probs=q).output_token_ids
    if with_q or policy == "reject_all":
        counts = [torch.bincount(out[:, 0].long(), minlength=vocab)]
    else:
        counts = _position_dists(out, drafts, vocab)
    for j, c in enumerate(counts):
        assert chi2_pvalue(c, probs[j]) > 1e-4, f"position {j}"
    shifted = probs[0].clone()
    hi, lo = int(shifted.argmax()), int(shifted.argmin())
    shifted[hi] -= 0.02
    shifted[lo] += 0.02
    assert chi2_pvalue(counts[0], shifted) < 1e-4, "test too weak to see a 2% shift"


# ---------------------------------------------------------------------------- seeding
def test_seeded_rows_are_reproducible_and_batch_independent():
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(12, 30, generator=g)
    drafts = torch.randint(0, 30, (12,), generator=g, dtype=torch.int32)
    bonus = torch.tensor([[1], [2], [3]])
    nums, cu = [4, 4, 4], torch.tensor([4, 8, 12])

    def run(seed_row_in_batch, other_seed):
        gens = {seed_row_in_batch: torch.Generator().manual_seed(99)}
        torch.manual_seed(other_seed)
        if seed_row_in_batch == 1:
            res = verify_drafts(drafts, cu, logits, bonus, False, gens, num_draft_tokens=nums,
                                return_target_tokens=True)
            return res.output_token_ids[1], res.target_token_ids[4:8]
        res = verify_drafts(drafts[4:8], cu[:1], logits[4:8], bonus[1:2], False, gens,
                            num_draft_tokens=[4], return_target_tokens=True)
        return res.output_token_ids[0], res.target_token_ids

    a, b, c = run(1, 0), run(1, 1), run(0, 2)
    for x, y in ((a, b), (a, c)):
        assert torch.equal(x[0], y[0]) and torch.equal(x[1], y[1])


# ---------------------------------------------------------------------------- names
def test_names_and_errors():
    assert VerifySpec.create("TOPP", "Accept_All", 0.5) == VerifySpec("top_p", "accept_all", 0.5)
    assert VerifySpec.create("top_p").lossy and not VerifySpec.create("target_match").lossy
    with pytest.raises(SpecExtConfigError, match="verify_strategy.*allowed"):
        VerifySpec.create("typical")
    with pytest.raises(SpecExtConfigError, match="accept_policy"):
        VerifySpec.create("greedy", "sometimes")
    with pytest.raises(SpecExtConfigError, match="top_p"):
        VerifySpec.create("top_p", "normal", 0.0)
    default = VerifySpec()
    assert parse_request_override(None, default) is None
    assert parse_request_override({"foo": 1}, default) is None
    assert parse_request_override({"accept_policy": "reject_all"}, default) == \
        VerifySpec("standard", "reject_all")
    with pytest.raises(SpecExtConfigError, match="verify_top_p"):
        parse_request_override({"verify_top_p": 2}, default)
    with pytest.raises(ValueError, match="per-row"):
        verify_drafts(torch.tensor([1]), torch.tensor([1]), torch.randn(1, 4),
                      torch.tensor([[0]]), True, strategy=["greedy", "greedy"])
