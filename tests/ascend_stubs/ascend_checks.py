"""vllm_specext against vllm-ascend's real ``NPUModelRunner``, ``AscendNgramProposer`` and
``AscendRejectionSampler`` classes (and the 310P runner and sampler, the MTP branch of the
NPU propose path, the V2 speculator factory), on CPU tensors.

Run only in a subprocess by ``tests/test_ascend_integration.py`` (the NPU stand-ins of
:mod:`npu_stubs` change the interpreter for good); ``SPECEXT_VLLM_ASCEND_SRC`` names the
vllm-ascend checkout. Runner objects are made with ``object.__new__`` and the attributes
the methods under test read; the methods themselves (``_set_up_drafter``,
``propose_draft_token_ids``, ``AscendRejectionSampler.forward``, vllm-ascend's
``rejection_sample`` and its worker patch) are vllm-ascend's own code.
"""
from __future__ import annotations

import ast
import inspect
import os
import runpy
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from unittest.mock import MagicMock

import numpy as np
import pytest
import torch

SRC = Path(os.environ["SPECEXT_VLLM_ASCEND_SRC"])
sys.path.insert(0, str(Path(__file__).resolve().parent))
import npu_stubs  # noqa: E402

npu_stubs.install(SRC)

import vllm.v1.sample.rejection_sampler as vllm_rs  # noqa: E402
import vllm_ascend.worker.model_runner_v1 as mr  # noqa: E402
from vllm.config import SpeculativeConfig, VllmConfig  # noqa: E402
from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.v1.sample.logits_processor import LogitsProcessors  # noqa: E402
from vllm.v1.sample.metadata import SamplingMetadata  # noqa: E402
from vllm.v1.spec_decode.metadata import SpecDecodeMetadata  # noqa: E402
from vllm_ascend._310p.model_runner_310p import NPUModelRunner310  # noqa: E402
from vllm_ascend._310p.sample.rejection_sampler import AscendRejectionSampler310  # noqa: E402
from vllm_ascend._310p.sample.sampler import AscendSampler310  # noqa: E402
from vllm_ascend.ascend_config import init_ascend_config  # noqa: E402
from vllm_ascend.sample.rejection_sampler import AscendRejectionSampler  # noqa: E402
from vllm_ascend.sample.sampler import AscendSampler  # noqa: E402
from vllm_ascend.spec_decode.eagle_proposer import AscendEagleProposer  # noqa: E402
from vllm_ascend.spec_decode.ngram_proposer import AscendNgramProposer  # noqa: E402

from vllm_specext.config import SpecExtConfigError  # noqa: E402
from vllm_specext.integration import ascend, mtp_hybrid  # noqa: E402
from vllm_specext.integration.adapter import SpecExtProposer  # noqa: E402
from vllm_specext.integration.engine_config import normalise, patch_engine_args  # noqa: E402
from vllm_specext.integration.runner import _after_init  # noqa: E402
from vllm_specext.proposers import PROPOSER_CLASSES  # noqa: E402

NPUModelRunner = mr.NPUModelRunner
MAX_LEN = 64
ROWS = 4
VOCAB = 256

# vllm-ascend's worker patch (rebinds vLLM's rejection_sample & co. to vllm-ascend's),
# run from its file: its package __init__ imports every model patch.
runpy.run_path(str(SRC / "vllm_ascend/patch/worker/patch_rejection_sampler.py"))
# the worker's patch order (runner.patch_worker_base): vLLM's runner, mtp_ngram's, Ascend's
mtp_hybrid.patch_runner()
ascend.patch_npu_model_runner(NPUModelRunner)


@pytest.fixture(autouse=True)
def single_rank(monkeypatch):
    """One pipeline stage, one rank (no torch.distributed groups in these tests)."""
    monkeypatch.setattr(mr, "get_pp_group", lambda: SimpleNamespace(
        is_last_rank=True, world_size=1, rank_in_group=0))


def vllm_config(ascend_extra=None, **spec):
    """What a runner's ``vllm_config`` holds for the user dict ``spec``: our front door's
    output (``normalise``) and vLLM's ``SpeculativeConfig``; ``ascend_extra``: vllm-ascend's
    own ``additional_config`` keys (also given to ``init_ascend_config``)."""
    spec = {"method": "ngram", "num_speculative_tokens": 4, "adaptive": False, **spec}
    vllm_spec, specext = normalise(spec)
    extra = {**(ascend_extra or {}), "vllm_specext": specext}
    init_ascend_config(VllmConfig(additional_config=dict(ascend_extra or {})))
    return SimpleNamespace(speculative_config=SpeculativeConfig(**vllm_spec),
                           additional_config=extra,
                           model_config=SimpleNamespace(max_model_len=MAX_LEN))


def npu_runner(config):
    """A bare ``NPUModelRunner`` with what ``_set_up_drafter`` and the propose path read."""
    runner = object.__new__(NPUModelRunner)
    runner.vllm_config = config
    runner.speculative_config = config.speculative_config
    runner.device = torch.device("cpu")
    runner.max_num_reqs = ROWS
    runner.sampler = AscendSampler()
    runner.num_spec_tokens = config.speculative_config.num_speculative_tokens
    runner.input_batch = SimpleNamespace(
        req_ids=[], req_id_to_index={}, num_reqs=0, num_prompt_tokens=np.zeros(ROWS, np.int32),
        num_tokens_no_spec=np.zeros(ROWS, np.int32),
        token_ids_cpu=np.zeros((ROWS, MAX_LEN), np.int32))
    runner.requests = {}
    return runner


def built_like_npu(config):
    """The NPU init order: vLLM's part (custom_class drafter, vLLM sampler, our runner
    hook), then vllm-ascend's ``_set_up_drafter``, wrapped by our ``__init__`` patch."""
    class Probe(NPUModelRunner):
        def __init__(self, vllm_config, device=None):
            runner = npu_runner(vllm_config)
            self.__dict__.update(runner.__dict__)
            self.drafter = SpecExtProposer(vllm_config)  # vLLM's create_custom_proposer
            self.rejection_sampler = vllm_rs.RejectionSampler(self.sampler)
            _after_init(self)  # vllm_specext's GPUModelRunner.__init__ hook
            self._set_up_drafter()

    ascend.patch_npu_model_runner(Probe)
    return Probe(config, torch.device("cpu"))


def commit(runner, row, rid, tokens, prompt_len=None):
    """vLLM bookkeeping: append ``tokens`` to ``row``; return them as the step's sample."""
    batch = runner.input_batch
    if rid not in batch.req_ids:
        batch.req_id_to_index[rid] = len(batch.req_ids)
        batch.req_ids.append(rid)
        batch.num_reqs = len(batch.req_ids)
        batch.num_prompt_tokens[row] = prompt_len
    n = batch.num_tokens_no_spec[row]
    batch.token_ids_cpu[row, n:n + len(tokens)] = tokens
    batch.num_tokens_no_spec[row] = n + len(tokens)
    return list(tokens)


def npu_propose(runner, sampled, budget):
    """``NPUModelRunner.propose_draft_token_ids`` called as its ``sample_tokens`` does."""
    sched = SimpleNamespace(num_spec_tokens_to_schedule=budget, total_num_scheduled_tokens=0)
    return NPUModelRunner.propose_draft_token_ids(
        runner, sampled, None, sched, None, None, None, 0, None, None, None, None)


# ------------------------------------------------------------------------ drafting
def test_dispatch_reaches_our_proposer():
    runner = npu_runner(vllm_config())
    runner._set_up_drafter()  # vllm-ascend's own method
    drafter = runner.drafter
    assert isinstance(drafter, SpecExtProposer) and isinstance(drafter, AscendNgramProposer)
    assert drafter.runner is runner and drafter.method == "ngram"
    assert not hasattr(drafter, "valid_ngram_draft")  # NgramProposer.__init__ did not run
    assert type(drafter).propose is SpecExtProposer.propose  # the adapter takes the budget
    assert type(runner.rejection_sampler) is AscendRejectionSampler


def test_other_methods_go_to_vllm_ascend_factory():
    runner = npu_runner(vllm_config())
    runner.speculative_config = SimpleNamespace(method="no-such-method")
    runner.vllm_config.speculative_config = runner.speculative_config
    with pytest.raises(ValueError, match="Unknown speculative decoding method"):
        runner._get_drafter()


def test_patch_is_idempotent():
    wrapped = NPUModelRunner.__dict__["_get_drafter"]
    ascend.patch_npu_model_runner(NPUModelRunner)
    assert NPUModelRunner.__dict__["_get_drafter"] is wrapped


@pytest.mark.parametrize("method", [m for m in PROPOSER_CLASSES if m != "mtp_ngram"])
def test_propose_through_npu_runner_matches_custom_class_call(method):
    config = vllm_config(method=method)
    runner = npu_runner(config)
    runner._set_up_drafter()
    reference = SpecExtProposer(config)  # the same method, called as vLLM's custom_class
    reference.bind_runner(runner)
    batch = runner.input_batch
    prompt = [7, 8, 9, 10, 11] * 5
    sampled = [commit(runner, 0, "a", prompt, len(prompt)),
               commit(runner, 1, "b", [1, 2, 3, 1, 2], 5)]
    drafted = 0
    for token in (7, 8, 9, 10):
        ours = npu_propose(runner, sampled, 4)
        assert ours == reference.propose(sampled, batch.num_tokens_no_spec, batch.token_ids_cpu)
        assert len(ours) == 2 and all(len(d) <= 4 for d in ours)
        drafted += len(ours[0])
        sampled = [commit(runner, 0, "a", [token]), []]  # row 1: partial prefill
    assert ours[1] == []
    assert drafted > 0 or method == "naive"  # naive: the no-draft baseline


def test_draft_budget_of_the_scheduler_is_honoured():
    runner = npu_runner(vllm_config(num_speculative_tokens=6))
    runner._set_up_drafter()
    prompt = [3, 4, 5, 6, 7, 8, 9] * 4
    sampled = [commit(runner, 0, "a", prompt, len(prompt))]
    sampled = [commit(runner, 0, "a", [3])]
    full = SpecExtProposer(runner.vllm_config)
    full.bind_runner(runner)
    want = full.propose(sampled, runner.input_batch.num_tokens_no_spec,
                        runner.input_batch.token_ids_cpu)[0]
    assert len(want) == 6
    assert npu_propose(runner, sampled, 2) == [want[:2]]


def _drafter_calls(method_name: str, attr: str) -> list[ast.Call]:
    """The ``self.drafter.<attr>(...)`` calls in NPUModelRunner.<method_name>'s source."""
    source = textwrap.dedent(inspect.getsource(getattr(NPUModelRunner, method_name)))
    return [node for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == attr and ast.unparse(node.func.value) == "self.drafter"]


@pytest.mark.parametrize("method_name, attr", [("_dummy_run", "dummy_run"),
                                              ("load_model", "load_model")])
def test_dummy_run_and_load_model_accept_npu_calls(method_name, attr):
    runner = npu_runner(vllm_config())
    runner._set_up_drafter()
    calls = _drafter_calls(method_name, attr)
    assert calls, f"NPUModelRunner.{method_name} no longer calls drafter.{attr}"
    for call in calls:
        args = [object()] * len(call.args)
        kwargs = {kw.arg: object() for kw in call.keywords}
        assert getattr(runner.drafter, attr)(*args, **kwargs) is None
    with mr.get_tp_context(runner.drafter):  # load_model's context for the drafter
        pass


def test_old_call_shape_is_refused(monkeypatch):
    def propose(self, sampled_token_ids, num_tokens_no_spec=None, token_ids_cpu=None):
        raise AssertionError

    monkeypatch.setattr(AscendNgramProposer, "propose", propose)
    ascend.ascend_proposer_class.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="vllm-ascend >= 0.24"):
            ascend.ascend_proposer_class()
    finally:
        ascend.ascend_proposer_class.cache_clear()


# ------------------------------------------------------------------------ verification
def sampling_metadata(temperature):
    batch = len(temperature)
    temp = torch.tensor(temperature, dtype=torch.float32)
    all_greedy, all_random = bool((temp == 0).all()), bool((temp > 0).all())
    return SamplingMetadata(
        temperature=None if all_greedy else temp, all_greedy=all_greedy,
        all_random=all_random, top_p=None, top_k=None, generators={},
        max_num_logprobs=None, no_penalties=True, prompt_token_ids=None,
        frequency_penalties=torch.zeros(batch), presence_penalties=torch.zeros(batch),
        repetition_penalties=torch.ones(batch), output_token_ids=[[] for _ in range(batch)],
        allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors())


def spec_inputs(drafts, seed=0):
    """(SpecDecodeMetadata, logits [T + B, V]) in vLLM's layout; drafts mostly the argmax."""
    nums = [len(d) for d in drafts]
    target, bonus, row = [], [], 0
    for n in nums:
        target += range(row, row + n)
        bonus.append(row + n)
        row += n + 1
    meta = SpecDecodeMetadata(
        draft_token_ids=torch.tensor(sum(drafts, []), dtype=torch.int32),
        num_draft_tokens=nums,
        cu_num_draft_tokens=torch.tensor(nums).cumsum(0).to(torch.int32),
        cu_num_sampled_tokens=torch.tensor([n + 1 for n in nums]).cumsum(0).to(torch.int32),
        target_logits_indices=torch.tensor(target, dtype=torch.int32),
        bonus_logits_indices=torch.tensor(bonus, dtype=torch.int32),
        logits_indices=torch.arange(row, dtype=torch.int32))
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(row, VOCAB, generator=g)
    for r, tok in zip(target, sum(drafts, [])):
        logits[r, tok] = 8.0
    return meta, logits


DRAFTS = [[5, 6, 7], [], [9, 10, 11, 12], [3]]


def ascend_output(meta, logits, temps):
    """vllm-ascend's own verification (a fresh, unhooked AscendRejectionSampler)."""
    sampler = AscendRejectionSampler(AscendSampler())
    return sampler(meta, None, logits.clone(), sampling_metadata(temps)).sampled_token_ids


def test_verify_hook_moves_to_the_ascend_sampler():
    runner = built_like_npu(vllm_config(verify_strategy="target_match"))
    sampler = runner.rejection_sampler
    assert type(sampler) is AscendRejectionSampler  # vllm-ascend's, not replaced by ours
    hook = runner.specext_verify_hook
    assert hook.spec.strategy == "target_match"
    assert "forward" in sampler.__dict__  # the hook gates this sampler's forward
    assert isinstance(runner.drafter, AscendNgramProposer) and runner.drafter.runner is runner
    if hasattr(AscendRejectionSampler, "prepare_sampling"):  # reduce-sample, up to 0.29
        sampler.prepare_sampling(None)  # vllm-ascend's API on its sampler still works


@pytest.mark.parametrize("strategy", ["greedy", "target_match"])
def test_greedy_batch_token_identical_to_vllm_ascend(strategy):
    meta, logits = spec_inputs(DRAFTS)
    logits[2, 7] = -50.0  # request 0 rejects its third draft
    temps = [0.0] * len(DRAFTS)
    theirs = ascend_output(meta, logits, temps)
    runner = built_like_npu(vllm_config(verify_strategy=strategy))
    hook = runner.specext_verify_hook
    hook.keep_target_tokens = True
    out = runner.rejection_sampler(meta, None, logits.clone(), sampling_metadata(temps))
    assert torch.equal(out.sampled_token_ids, theirs)
    assert hook.last_step is not None  # our kernel produced it
    assert torch.equal(hook.last_step.output_token_ids, out.sampled_token_ids)


@pytest.mark.parametrize("policy, expect", [
    ("reject_all", lambda n: 1), ("accept_all", lambda n: n + 1)])
def test_accept_policies_run_on_the_ascend_path(policy, expect):
    meta, logits = spec_inputs(DRAFTS)
    runner = built_like_npu(vllm_config(accept_policy=policy))
    temps = [0.0, 1.0, 0.0, 1.0]
    out = runner.rejection_sampler(meta, None, logits, sampling_metadata(temps))
    rows = out.sampled_token_ids.tolist()
    for drafts, row in zip(DRAFTS, rows):
        emitted = [t for t in row if t != -1]
        assert len(emitted) == expect(len(drafts))
        assert emitted[:-1] == drafts[:len(emitted) - 1]


def test_random_rows_through_ascend_forward_keep_the_invariant():
    meta, logits = spec_inputs(DRAFTS, seed=3)
    runner = built_like_npu(vllm_config(verify_strategy="target_match"))
    runner.specext_verify_hook.keep_target_tokens = True
    torch.manual_seed(0)
    out = runner.rejection_sampler(meta, None, logits, sampling_metadata([1.0] * 4))
    rows = out.sampled_token_ids
    assert rows.dtype == torch.int32 and rows.shape == (4, 5)
    assert torch.equal(runner.specext_verify_hook.last_step.output_token_ids, rows)
    for drafts, row in zip(DRAFTS, rows.tolist()):
        emitted = [t for t in row if t != -1]
        assert 1 <= len(emitted) <= len(drafts) + 1
        assert emitted[:-1] == drafts[:len(emitted) - 1]
        assert row[len(emitted):] == [-1] * (len(row) - len(emitted))


def test_ascend_verify_modes_conflict_is_an_error():
    with pytest.raises(SpecExtConfigError, match="enable_block_verify"):
        built_like_npu(vllm_config({"rejection_sampler_config": {"enable_block_verify": True}},
                                   verify_strategy="greedy"))


def test_patch_ascend_follows_the_platform(monkeypatch):
    import vllm.platforms
    from vllm_ascend.platform import NPUPlatform

    assert ascend.patch_ascend() is False  # the CPU platform
    monkeypatch.setattr(vllm.platforms, "_current_platform", object.__new__(NPUPlatform))
    assert ascend.patch_ascend() is True
    assert getattr(NPUModelRunner.__dict__["_get_drafter"], "_specext_wrapped", False)


# ------------------------------------------------------------------------ 310P
def built_like_310p(config):
    """``NPUModelRunner310``'s init order: ``NPUModelRunner``'s (as :func:`built_like_npu`),
    then its own sampler pair; then ``load_model`` (inherited, our wrapper) calls
    :func:`ascend.finish_runner` before loading weights."""
    runner = built_like_npu(config)
    runner.sampler = AscendSampler310()
    runner.rejection_sampler = AscendRejectionSampler310(runner.sampler)
    ascend.finish_runner(runner)
    return runner


def test_310p_runner_inherits_our_hooks():
    for name, flag in (("_get_drafter", "_specext_wrapped"),
                       ("propose_draft_token_ids", "_specext_mtp_wrapped")):
        assert getattr(getattr(NPUModelRunner310, name), flag, False), name
    load_model = NPUModelRunner310.load_model  # re-runs finish_runner after 310P's __init__
    assert load_model is NPUModelRunner.load_model
    assert load_model.__code__.co_filename == ascend.__file__


@pytest.mark.parametrize("strategy", ["greedy", "target_match"])
def test_310p_sampler_greedy_token_identical(strategy):
    meta, logits = spec_inputs(DRAFTS)
    logits[2, 7] = -50.0
    temps = [0.0] * len(DRAFTS)
    theirs = AscendRejectionSampler310(AscendSampler310())(
        meta, None, logits.clone(), sampling_metadata(temps)).sampled_token_ids
    runner = built_like_310p(vllm_config(verify_strategy=strategy))
    sampler, hook = runner.rejection_sampler, runner.specext_verify_hook
    assert type(sampler) is AscendRejectionSampler310 and "forward" in sampler.__dict__
    hook.keep_target_tokens = True
    out = sampler(meta, None, logits.clone(), sampling_metadata(temps))
    assert torch.equal(out.sampled_token_ids, theirs)
    assert torch.equal(hook.last_step.output_token_ids, out.sampled_token_ids)  # our kernel


@pytest.mark.parametrize("policy, expect", [
    ("reject_all", lambda n: 1), ("accept_all", lambda n: n + 1)])
def test_310p_sampler_runs_our_policies_on_random_rows(policy, expect):
    meta, logits = spec_inputs(DRAFTS, seed=5)
    runner = built_like_310p(vllm_config(accept_policy=policy))
    out = runner.rejection_sampler(meta, None, logits, sampling_metadata([1.0, 0.0, 1.0, 1.0]))
    for drafts, row in zip(DRAFTS, out.sampled_token_ids.tolist()):
        emitted = [t for t in row if t != -1]
        assert len(emitted) == expect(len(drafts))
        assert emitted[:-1] == drafts[:len(emitted) - 1]


# ------------------------------------------------------------------------ mtp_ngram
MTP_K, MTP_M = 5, 2
PROMPT_A = [1, 2, 3, 4, 5, 6, 7, 8] * 3  # repeats: the n-gram extension continues it
PROMPT_B = [20, 21, 22, 23, 24, 25]      # no repeat: the MTP drafts stay as they are
MTP_SCRIPT = [[1, 2, 9, 9, 9], [26, 27, 28, 29, 30]]  # what the stand-in MTP head drafts


def mtp_ngram_config():
    specext = normalise({"method": "mtp_ngram", "num_model_steps": MTP_M,
                         "num_speculative_tokens": MTP_K})[1]
    spec = SimpleNamespace(method="mtp", num_speculative_tokens=MTP_K,
                           disable_padded_drafter_batch=False, use_eagle=lambda: True,
                           uses_draft_model=lambda: False,
                           uses_extract_hidden_states=lambda: False)
    return SimpleNamespace(speculative_config=spec, additional_config={"vllm_specext": specext},
                           model_config=SimpleNamespace(max_model_len=MAX_LEN))


def mtp_runner(cls=NPUModelRunner):
    """An NPU runner with vllm-ascend's MTP drafter class whose model parts are stood in
    for: ``_propose`` drafts the first ``num_speculative_tokens`` of :data:`MTP_SCRIPT`
    per row and records that budget in ``runner.mtp_budgets``."""
    runner = object.__new__(cls)
    runner.__dict__.update(npu_runner(mtp_ngram_config()).__dict__)
    runner.__dict__.update(
        model=SimpleNamespace(), dcp_size=1, uses_mrope=False, positions=torch.arange(16),
        input_ids=SimpleNamespace(gpu=torch.zeros(16, dtype=torch.int64)),
        use_aux_hidden_state_outputs=False, valid_sampled_token_count_event=None,
        discard_request_indices=SimpleNamespace(gpu=torch.zeros(0, dtype=torch.int64)),
        num_discarded_requests=0, use_async_scheduling=False, mtp_budgets=[],
        draft_token_ids_event=MagicMock(), draft_token_ids_copy_stream=MagicMock(),
        draft_token_ids_cpu=torch.zeros(ROWS, MTP_K, dtype=torch.int64))
    drafter = object.__new__(AscendEagleProposer)  # what get_spec_decode_method gives "mtp"

    def _propose(num_speculative_tokens, next_token_ids, **kwargs):
        runner.mtp_budgets.append(num_speculative_tokens)
        rows = len(next_token_ids)
        return torch.tensor([r[:num_speculative_tokens] for r in MTP_SCRIPT[:rows]])

    drafter._propose = _propose
    drafter.prepare_next_token_ids_padded = lambda sampled, *a: (
        sampled[:, 0], torch.ones(len(sampled), dtype=torch.int64))
    drafter.take_last_draft_probs = lambda: None
    runner.drafter = drafter
    mtp_hybrid._attach(runner)  # what our GPUModelRunner.__init__ hook does
    return runner


def mtp_step(runner, budget):
    """One step as ``sample_tokens`` runs it for a padded-batch MTP drafter: propose
    (before bookkeeping), copy the drafts to the host, then the engine's
    ``take_draft_token_ids``."""
    sampled = torch.tensor([[8, -1], [25, -1]])
    sched = SimpleNamespace(num_spec_tokens_to_schedule=budget, total_num_scheduled_tokens=2,
                            num_scheduled_tokens={"a": 1, "b": 1})
    drafts = NPUModelRunner.propose_draft_token_ids(
        runner, sampled, None, sched, None, SimpleNamespace(), None, 2,
        torch.zeros(2, 4), None, None, None)
    assert sched.num_spec_tokens_to_schedule == budget  # restored for the rest of the step
    runner._draft_token_ids = drafts
    NPUModelRunner._copy_draft_token_ids_to_cpu(runner, sched)
    return drafts, NPUModelRunner.take_draft_token_ids(runner)


@pytest.mark.parametrize("budget", [MTP_K, 3, 1])
def test_mtp_ngram_through_the_npu_propose_path(budget):
    assert "num_speculative_tokens" in inspect.signature(AscendEagleProposer._propose).parameters
    runner = mtp_runner()
    commit(runner, 0, "a", PROMPT_A, len(PROMPT_A))
    commit(runner, 1, "b", PROMPT_B, len(PROMPT_B))
    drafts, out = mtp_step(runner, budget)
    assert runner.mtp_budgets == [min(MTP_M, budget)]  # the MTP head drafts m tokens
    assert out.req_ids == ["a", "b"]
    reference = mtp_hybrid.MtpNgramHybrid(runner.vllm_config.additional_config["vllm_specext"],
                                          MAX_LEN)  # the GPU runner's extension
    reference.model_tokens(budget)
    assert out.draft_token_ids == reference.extend(runner.input_batch, ["a", "b"],
                                                   drafts.tolist())
    want_a = [1, 2, 3, 4, 5][:budget]  # MTP's "1 2", then the prompt's "3 4 5"
    assert out.draft_token_ids == [want_a, [26, 27][:budget]]


def test_mtp_ngram_then_vllm_ascend_dynamic_k_cut():
    runner = mtp_runner()
    commit(runner, 0, "a", PROMPT_A, len(PROMPT_A))
    commit(runner, 1, "b", PROMPT_B, len(PROMPT_B))
    runner.drafter.dynamic_spec = SimpleNamespace(num_verify_tokens=[3, 1])
    _, out = mtp_step(runner, MTP_K)
    assert out.draft_token_ids == [[1, 2, 3], [26]]


def test_mtp_ngram_finished_requests_leave_the_index():
    runner = mtp_runner()
    commit(runner, 0, "a", PROMPT_A, len(PROMPT_A))
    commit(runner, 1, "b", PROMPT_B, len(PROMPT_B))
    mtp_step(runner, MTP_K)
    state = runner.specext_mtp_ngram
    assert "a" in state.core.tokens
    # vllm-ascend's _update_states calls vLLM's, where mtp_hybrid forgets finished requests
    assert "super()._update_states" in inspect.getsource(NPUModelRunner._update_states)
    state.finish({"a"})
    assert "a" not in state.core.tokens


def test_mtp_ngram_refused_on_a_runner_whose_propose_is_not_hooked():
    class Custom(NPUModelRunner):
        def propose_draft_token_ids(self, *args):
            return None

    ascend.patch_npu_model_runner(Custom)  # no scheduler_output parameter: left unwrapped
    with pytest.raises(RuntimeError, match="propose_draft_token_ids is not hooked"):
        mtp_runner(Custom)


# ------------------------------------------------------------------------ config time
@pytest.fixture
def ascend_platform(monkeypatch):
    """vllm-ascend's platform is current, our front door is installed, and ``EngineArgs``
    loads no general plugins (vllm-ascend's need the NPU runtime)."""
    import vllm.platforms
    import vllm.plugins
    from vllm_ascend.platform import NPUPlatform

    monkeypatch.setattr(vllm.platforms, "_current_platform", object.__new__(NPUPlatform))
    monkeypatch.setattr(vllm.plugins, "plugins_loaded", True)
    patch_engine_args()


def test_v2_runner_cannot_build_our_drafter():
    """vllm-ascend's V2 runner builds its drafter only through ``init_speculator``, which
    knows its own model-based speculators; hence the config-time refusal below."""
    from vllm_ascend.worker.v2.spec_decode import init_speculator

    spec = SimpleNamespace(method="custom_class", use_dspark=lambda: False,
                           use_dflash=lambda: False, use_eagle=lambda: False)
    with pytest.raises(NotImplementedError, match="custom_class"):
        init_speculator(SimpleNamespace(speculative_config=spec), torch.device("cpu"))


@pytest.mark.parametrize("spec", [
    {"method": "ngram", "num_speculative_tokens": 4},
    {"method": "mtp_ngram", "num_model_steps": 1, "num_speculative_tokens": 3},
    {"method": "eagle", "model": "d", "num_speculative_tokens": 2, "verify_strategy": "greedy"}])
def test_v2_runner_refused_at_config_time(ascend_platform, monkeypatch, spec):
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    with pytest.raises(SpecExtConfigError, match="V2 NPU model runner.*unset VLLM_USE_V2"):
        EngineArgs(model="m", speculative_config=dict(spec)).create_speculative_config(None, None)


def test_mtp_ngram_with_pipeline_parallelism_refused(ascend_platform):
    spec = {"method": "mtp_ngram", "num_model_steps": 1, "num_speculative_tokens": 3}
    args = EngineArgs(model="m", pipeline_parallel_size=2, speculative_config=spec)
    with pytest.raises(SpecExtConfigError, match="pipeline_parallel_size=1"):
        args.create_speculative_config(None, None)
    ascend.check_engine_args(SimpleNamespace(pipeline_parallel_size=1), normalise(spec)[1])
