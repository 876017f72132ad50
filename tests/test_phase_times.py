"""Units of :mod:`vllm_specext.phase_times` on a stand-in worker (the real engine's
phases are checked by ``test_engine_process.py``)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_specext.phase_times import time_phases


class _Runner:
    def __init__(self):
        self.drafter = SimpleNamespace(propose=lambda rows: [[] for _ in range(rows)])
        self.model = SimpleNamespace(compute_logits=lambda hidden: hidden * 2)

    def _model_forward(self, x):
        return x + 1

    def execute_model(self, scheduler_output):
        return self.model.compute_logits(self._model_forward(scheduler_output.x))


class _InProcessLLM:
    """``collective_rpc(fn)`` calls ``fn(worker)`` here, as vLLM's one-process executor."""

    def __init__(self):
        self.worker = SimpleNamespace(model_runner=_Runner())

    def collective_rpc(self, fn):
        return [fn(self.worker)]


def _step(x, drafts):
    return SimpleNamespace(x=x, scheduled_spec_decode_tokens=drafts)


def test_each_timed_method_adds_its_seconds_once_per_engine():
    llm = _InProcessLLM()
    seconds = time_phases(llm)
    assert time_phases(llm) is seconds  # a second call does not wrap twice
    runner = llm.worker.model_runner
    assert runner.execute_model(_step(1, {"a": [7, 8], "b": []})) == 4
    assert runner.drafter.propose(2) == [[], []]
    assert set(seconds) == {"execute_model", "_model_forward", "compute_logits", "propose",
                            "draft_tokens"}
    assert seconds["draft_tokens"] == 2
    assert 0 < seconds["_model_forward"] + seconds["compute_logits"] <= seconds["execute_model"]
    seconds.clear()
    runner.execute_model(_step(0, {}))
    assert seconds["draft_tokens"] == 0 and "propose" not in seconds


def test_a_worker_in_another_process_is_refused():
    class _Remote(_InProcessLLM):
        def collective_rpc(self, fn):
            return [dict(fn(self.worker))]  # what a worker process sends back: a copy

    with pytest.raises(ValueError, match="one worker in this process"):
        time_phases(_Remote())
