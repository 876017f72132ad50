"""Units of :mod:`vllm_specext.phase_times` on a stand-in worker (the real engine's
phases are checked by ``test_engine_process.py``)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_specext.phase_times import time_phases


class _Runner:
    def __init__(self):
        self.drafter = SimpleNamespace(propose=lambda rows: [[] for _ in range(rows)])

    def _model_forward(self, x):
        return x + 1

    def execute_model(self, x):
        return self._model_forward(x)


class _InProcessLLM:
    """``collective_rpc(fn)`` calls ``fn(worker)`` here, as vLLM's one-process executor."""

    def __init__(self):
        self.worker = SimpleNamespace(model_runner=_Runner())

    def collective_rpc(self, fn):
        return [fn(self.worker)]


def test_each_timed_method_adds_its_seconds_once_per_engine():
    llm = _InProcessLLM()
    seconds = time_phases(llm)
    assert time_phases(llm) is seconds  # a second call does not wrap twice
    runner = llm.worker.model_runner
    assert runner.execute_model(1) == 2 and runner.drafter.propose(2) == [[], []]
    assert set(seconds) == {"execute_model", "_model_forward", "propose"}
    assert 0 < seconds["_model_forward"] <= seconds["execute_model"]
    seconds.clear()
    runner._model_forward(0)
    assert set(seconds) == {"_model_forward"}


def test_a_worker_in_another_process_is_refused():
    class _Remote(_InProcessLLM):
        def collective_rpc(self, fn):
            return [dict(fn(self.worker))]  # what a worker process sends back: a copy

    with pytest.raises(ValueError, match="one worker in this process"):
        time_phases(_Remote())
