"""Unit tests of the vLLM adapter with a stand-in runner (no engine)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from vllm_specext.integration.adapter import SpecExtProposer

MAX_LEN = 64


def make(method="ngram", k=4, adaptive=False, **extra):
    cfg = SimpleNamespace(
        additional_config={"vllm_specext": {"method": method, "num_speculative_tokens": k,
                                            "adaptive": adaptive, "adaptive_decay": 0.8,
                                            **extra}},
        model_config=SimpleNamespace(max_model_len=MAX_LEN))
    drafter = SpecExtProposer(cfg)
    batch = SimpleNamespace(req_ids=[], num_prompt_tokens=np.zeros(8, np.int32))
    drafter.bind_runner(SimpleNamespace(input_batch=batch))
    token_ids = np.zeros((8, MAX_LEN), np.int32)
    num_tokens = np.zeros(8, np.int32)
    return drafter, batch, token_ids, num_tokens


def commit(batch, token_ids, num_tokens, row, rid, tokens, prompt_len=None):
    """Mimic vLLM's bookkeeping: write tokens to the row, return what was sampled."""
    if rid not in batch.req_ids:
        batch.req_ids.insert(row, rid)
        batch.num_prompt_tokens[row] = prompt_len
    n = num_tokens[row]
    token_ids[row, n:n + len(tokens)] = tokens
    num_tokens[row] = n + len(tokens)
    return list(tokens)


def test_prefill_then_decode_drafts_from_context():
    d, batch, ids, n = make()
    prompt = [5, 6, 7, 8, 5, 6, 7]
    commit(batch, ids, n, 0, "a", prompt, prompt_len=len(prompt))
    assert d.propose([[]], n, ids) == [[]]           # partial prefill: no draft
    s = commit(batch, ids, n, 0, "a", [8])
    assert d.propose([s], n, ids) == [[5, 6, 7, 8]]  # "5 6 7 8" seen before
    assert len(d.proposer.tokens["a"]) == 8


def test_ngram_call_shape_and_cap_at_max_model_len():
    d, batch, ids, n = make(k=8)
    prompt = [1, 2, 3] * 20
    commit(batch, ids, n, 0, "a", prompt, prompt_len=len(prompt))
    s = commit(batch, ids, n, 0, "a", [1])
    out = d.propose(8, [s], n, ids, slot_mappings=None)  # leading int: ngram-style call
    assert len(out[0]) == MAX_LEN - 61 - 1 == 2


@pytest.mark.parametrize("by_name", [False, True])
def test_scheduler_budget_caps_drafts_positional_or_by_name(by_name):
    """vLLM's / vllm-ascend's n-gram call passes the step's budget first; vLLM's other
    drafters (and vllm-ascend's suffix call) name it ``num_speculative_tokens``."""
    d, batch, ids, n = make(k=6)
    prompt = [3, 4, 5, 6, 7, 8, 9] * 4
    commit(batch, ids, n, 0, "a", prompt, prompt_len=len(prompt))
    s = commit(batch, ids, n, 0, "a", [3])
    if by_name:
        out = d.propose(num_speculative_tokens=2, sampled_token_ids=[s],
                        num_tokens_no_spec=n, token_ids_cpu=ids, slot_mappings=None)
    else:
        out = d.propose(2, [s], n, ids)
    assert out == [[4, 5]]
    assert d.propose(num_speculative_tokens=0, sampled_token_ids=[s],  # dynamic K = 0
                     num_tokens_no_spec=n, token_ids_cpu=ids) == [[]]


def test_resync_when_lengths_disagree():
    d, batch, ids, n = make()
    commit(batch, ids, n, 0, "a", [1, 2, 3, 1, 2], prompt_len=5)
    d.propose([[]], n, ids)
    # the runner committed tokens the proposer never saw (e.g. preempted, resumed)
    commit(batch, ids, n, 0, "a", [3, 1])
    s = commit(batch, ids, n, 0, "a", [2])
    d.propose([s], n, ids)
    assert d.proposer.tokens["a"].view().tolist() == ids[0, :n[0]].tolist()


def test_finished_requests_are_released():
    d, batch, ids, n = make()
    commit(batch, ids, n, 0, "a", [1, 2, 3], prompt_len=3)
    d.propose([[]], n, ids)
    d.on_step_start(SimpleNamespace(finished_req_ids={"a", "never-seen"},
                                    total_num_scheduled_tokens=0))
    assert d.proposer.active_requests == set()


def test_only_decode_steps_are_timed_for_the_cost_model():
    """Each timed step records its start, tokens, whether it verifies drafts and its rows."""
    d, *_ = make()

    def start(per_request, drafts):
        d.on_step_start(SimpleNamespace(
            finished_req_ids=set(), num_scheduled_tokens=per_request,
            total_num_scheduled_tokens=sum(per_request.values()),
            scheduled_spec_decode_tokens=drafts))
        return d._step

    assert start({"a": 1, "b": 1}, {})[1:] == (2, False, 2)
    assert start({"a": 3, "b": 1}, {"a": [7, 8]})[1:] == (4, True, 2)
    assert start({"a": 1, "b": 300}, {}) is None  # b is prefilling
    assert start({"a": 2, "b": 1}, {"a": [7, 8]}) is None  # a's step is not 1 + drafts


def test_requests_without_shown_drafts_are_proposed_for_only_when_probing(monkeypatch):
    d, batch, ids, n = make(k=4, adaptive=True, adaptive_threshold=0.99)  # never shown
    prompt = [3, 4, 5, 6, 7] * 4
    commit(batch, ids, n, 0, "a", prompt, prompt_len=len(prompt))
    d.propose([[]], n, ids)
    asked = []
    original = d.proposer.propose
    monkeypatch.setattr(d.proposer, "propose",
                        lambda req_ids, caps: asked.append(caps[0]) or original(req_ids, caps))
    for step in range(16):  # the pattern goes on: the n-gram always matches
        assert d.propose([commit(batch, ids, n, 0, "a", [prompt[step % 5]])], n, ids) == [[]]
    assert [i for i, cap in enumerate(asked) if cap] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 12]


def test_proposer_failure_gives_no_drafts(monkeypatch):
    d, batch, ids, n = make()
    commit(batch, ids, n, 0, "a", [1, 2, 3], prompt_len=3)

    def boom(*a, **k):
        raise RuntimeError("proposer bug")

    monkeypatch.setattr(d.proposer, "propose", boom)
    assert d.propose([[]], n, ids) == [[]]
    assert "a" not in d.proposer.active_requests  # resynced from scratch next step


def test_non_drafting_rank_does_no_work():
    d, batch, ids, n = make()
    d.is_drafting_rank = False
    commit(batch, ids, n, 0, "a", [1, 2, 1, 2], prompt_len=4)
    assert d.propose([[2]], n, ids) == [[]]
    assert d.proposer.active_requests == set()


def test_requires_front_door_config():
    cfg = SimpleNamespace(additional_config={}, model_config=SimpleNamespace(max_model_len=8))
    with pytest.raises(RuntimeError, match="vllm_specext"):
        SpecExtProposer(cfg)


def test_register_imports_no_numba():
    """vLLM's worker-side kernel scan runs after register() and breaks on llvmlite."""
    import subprocess
    import sys

    code = ("import sys, vllm_specext.plugin as p; p.register(); "
            "assert not [m for m in sys.modules if m.startswith(('numba', 'llvmlite'))]")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def _with_budgets(d, **max_tokens):
    d.runner.requests = {rid: SimpleNamespace(sampling_params=SimpleNamespace(max_tokens=n))
                         for rid, n in max_tokens.items()}


def test_drafts_stop_at_the_requests_max_tokens():
    """vLLM verifies drafts past ``max_tokens`` and drops what they add: a request with
    3 output tokens left gets at most 2 draft tokens (the step's bonus token is the 3rd)."""
    d, batch, ids, n = make(k=8)
    prompt = [1, 2, 3] * 10
    commit(batch, ids, n, 0, "a", prompt, prompt_len=len(prompt))
    _with_budgets(d, a=5)
    s = commit(batch, ids, n, 0, "a", [1, 2])  # 2 of 5 output tokens
    assert d.propose([s], n, ids) == [[3, 1]]
    s = commit(batch, ids, n, 0, "a", [3, 1])  # 4 of 5: the next step's bonus is the last
    assert d.propose([s], n, ids) == [[]]


def test_a_budget_vllm_set_to_the_model_length_is_not_a_budget():
    d, batch, ids, n = make(k=8)
    commit(batch, ids, n, 0, "a", [1, 2, 3] * 4, prompt_len=12)
    _with_budgets(d, a=MAX_LEN - 12)  # max_tokens=None filled to the model length
    assert d._budgets_left(["a"], n) == [None]
    _with_budgets(d, a=MAX_LEN - 13)
    assert d._budgets_left(["a"], n) == [MAX_LEN - 13 - 1]


@pytest.mark.parametrize("waiting, drain", [(None, True), (0, True), (3, True), (0, False)])
def test_budgets_reach_the_rule_only_while_nothing_waits(monkeypatch, waiting, drain):
    import vllm_specext.integration.adapter as adapter

    seen = []
    monkeypatch.setattr(adapter, "shown_drafts",
                        lambda *args: seen.append(args[-1]) or args[3])
    d, batch, ids, n = make(k=4, adaptive=True, adaptive_drain=drain)
    for row, rid in enumerate(["a", "b"]):
        commit(batch, ids, n, row, rid, [1, 2, 3] * 3, prompt_len=9)
    _with_budgets(d, a=20, b=30)
    d.on_step_start(SimpleNamespace(finished_req_ids=set(), total_num_scheduled_tokens=0,
                                    specext_num_waiting=waiting))
    sampled = [commit(batch, ids, n, row, rid, [1]) for row, rid in enumerate(["a", "b"])]
    d.propose(sampled, n, ids)
    assert seen == [[18, 28] if waiting == 0 and drain else None]


def test_verified_scale_key_reaches_the_cost_model():
    d, *_ = make(method="suffix", adaptive=True, adaptive_verified_scale=0)
    assert d.cost_model.verified_scale == 0
    d, *_ = make(method="suffix", adaptive=True)
    assert d.cost_model.verified_scale == 3


def test_decision_log_writes_one_line_per_step(monkeypatch, tmp_path):
    """``VLLM_SPECEXT_DECISION_LOG`` makes the drafting worker log each step's decision."""
    import json

    from vllm_specext.integration.decision_log import DECISION_LOG_ENV

    monkeypatch.setenv(DECISION_LOG_ENV, str(tmp_path / "log"))
    d, batch, ids, n = make(k=4, adaptive=True)
    prompt = [3, 4, 5, 6, 7] * 4
    commit(batch, ids, n, 0, "a", prompt, prompt_len=len(prompt))
    d.on_step_start(SimpleNamespace(finished_req_ids=set(), num_scheduled_tokens={"a": 20},
                                    total_num_scheduled_tokens=20))
    assert d.propose([[]], n, ids) == [[]]  # partial prefill: nothing offered
    d.on_step_start(SimpleNamespace(finished_req_ids=set(), num_scheduled_tokens={"a": 1},
                                    total_num_scheduled_tokens=1))
    shown = d.propose([commit(batch, ids, n, 0, "a", [3])], n, ids)
    files = list(tmp_path.glob("log.ngram.*.jsonl"))
    assert len(files) == 1
    first, second = [json.loads(line) for line in files[0].read_text().splitlines()]
    assert first["step"] == 1 and first["rows"] == 0 and first["offered"] == 0
    assert first["timed"] is None  # a prefill step is not timed
    assert second["rows"] == second["committed"] == 1 and second["batch"] == 1
    assert second["timed"][0] == 1 and second["timed"][2] is False
    assert second["offered"] == 4 and second["offered_rows"] == 1
    assert second["shown"] == len(shown[0]) and second["shown_rows"] == int(bool(shown[0]))
    assert set(second) >= {"threshold", "plain_ms", "exploring"}
    assert second["time"] >= first["time"] > 1.7e9  # Unix seconds


def test_decision_log_without_adaptation_shows_what_was_offered(monkeypatch, tmp_path):
    import json

    from vllm_specext.integration.decision_log import DECISION_LOG_ENV

    monkeypatch.setenv(DECISION_LOG_ENV, str(tmp_path / "log"))
    d, batch, ids, n = make(k=4, adaptive=False)
    commit(batch, ids, n, 0, "a", [3, 4, 5, 6, 7] * 4, prompt_len=20)
    d.propose([[]], n, ids)
    assert d.propose([commit(batch, ids, n, 0, "a", [3])], n, ids) == [[4, 5, 6, 7]]
    lines = [json.loads(x) for x in next(tmp_path.glob("log.*")).read_text().splitlines()]
    assert [(x["offered"], x["shown"], x["threshold"]) for x in lines] == [(0, 0, 0.0),
                                                                            (4, 4, 0.0)]


def test_an_unwritable_decision_log_is_a_warning_not_a_failure(monkeypatch, tmp_path, caplog):
    from vllm_specext.integration.decision_log import DECISION_LOG_ENV

    blocker = tmp_path / "file"
    blocker.write_text("")  # a file where the prefix wants a folder
    monkeypatch.setenv(DECISION_LOG_ENV, str(blocker / "log"))
    d, batch, ids, n = make(adaptive=True)
    assert d.decision_log is None
    assert DECISION_LOG_ENV in caplog.text
    commit(batch, ids, n, 0, "a", [1, 2, 3], prompt_len=3)
    assert d.propose([[]], n, ids) == [[]]


def test_no_decision_log_without_the_variable(monkeypatch):
    from vllm_specext.integration.decision_log import DECISION_LOG_ENV

    monkeypatch.delenv(DECISION_LOG_ENV, raising=False)
    assert make(adaptive=True)[0].decision_log is None
