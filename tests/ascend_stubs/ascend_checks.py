"""vllm_specext against vllm-ascend's real ``NPUModelRunner``, ``AscendNgramProposer`` and
``AscendRejectionSampler`` classes, on CPU tensors.

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
from vllm.v1.sample.logits_processor import LogitsProcessors  # noqa: E402
from vllm.v1.sample.metadata import SamplingMetadata  # noqa: E402
from vllm.v1.spec_decode.metadata import SpecDecodeMetadata  # noqa: E402
from vllm_ascend.ascend_config import init_ascend_config  # noqa: E402
from vllm_ascend.sample.rejection_sampler import AscendRejectionSampler  # noqa: E402
from vllm_ascend.sample.sampler import AscendSampler  # noqa: E402
from vllm_ascend.spec_decode.ngram_proposer import AscendNgramProposer  # noqa: E402

from vllm_specext.config import SpecExtConfigError  # noqa: E402
from vllm_specext.integration import ascend  # noqa: E402
from vllm_specext.integration.adapter import SpecExtProposer  # noqa: E402
from vllm_specext.integration.engine_config import normalise  # noqa: E402
from vllm_specext.integration.runner import _after_init  # noqa: E402
from vllm_specext.proposers import PROPOSER_CLASSES  # noqa: E402

NPUModelRunner = mr.NPUModelRunner
MAX_LEN = 64
ROWS = 4
VOCAB = 256

# vllm-ascend's worker patch (rebinds vLLM's rejection_sample & co. to vllm-ascend's),
# run from its file: its package __init__ imports every model patch.
runpy.run_path(str(SRC / "vllm_ascend/patch/worker/patch_rejection_sampler.py"))
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
        req_ids=[], num_reqs=0, num_prompt_tokens=np.zeros(ROWS, np.int32),
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


def test_sampler_rebound_after_init_gets_the_hook():
    """Subclasses (e.g. the 310P runner) bind another sampler after NPUModelRunner's
    ``__init__``; the ``load_model`` patch runs :func:`finish_runner` again."""
    runner = built_like_npu(vllm_config(verify_strategy="greedy"))
    rebound = AscendRejectionSampler(AscendSampler())
    runner.rejection_sampler = rebound
    ascend.finish_runner(runner)
    assert "forward" in rebound.__dict__ and runner.specext_verify_hook.spec.strategy == "greedy"


def test_patch_ascend_follows_the_platform(monkeypatch):
    import vllm.platforms
    from vllm_ascend.platform import NPUPlatform

    assert ascend.patch_ascend() is False  # the CPU platform
    monkeypatch.setattr(vllm.platforms, "_current_platform", object.__new__(NPUPlatform))
    assert ascend.patch_ascend() is True
    assert getattr(NPUModelRunner.__dict__["_get_drafter"], "_specext_wrapped", False)
