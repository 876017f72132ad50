"""Unit tests of the plain-step wrapper of ``_prepare_inputs`` (a step without drafts is
prepared as without speculation). The engine tests cover the real runner: their greedy
outputs equal no speculation's with most batch steps undrafted."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")

from vllm.v1.spec_decode.metadata import SpecDecodeMetadata  # noqa: E402

from vllm_specext.integration.runner import _without_undrafted_metadata  # noqa: E402

CONFIG = SimpleNamespace(method="custom_class", num_speculative_tokens=4)


class _Runner:
    """Records the ``speculative_config`` each call saw; returns vLLM 0.32's tuple, with
    metadata whenever a config is visible (as vLLM 0.32 builds it)."""

    def __init__(self, plain_ok=True, fail=False):
        self.speculative_config = CONFIG
        self._specext_plain_steps = plain_ok
        self.fail = fail
        self.seen = []

    def _prepare_inputs(self, scheduler_output, num_scheduled_tokens):
        self.seen.append(self.speculative_config)
        if self.fail:
            raise RuntimeError("prepare failed")
        meta = (object.__new__(SpecDecodeMetadata)
                if self.speculative_config is not None else None)
        return ("logits_indices", meta, 1)


_Runner._prepare_inputs = _without_undrafted_metadata(_Runner._prepare_inputs)


def _step(drafts):
    return SimpleNamespace(scheduled_spec_decode_tokens=drafts)


def test_an_undrafted_step_is_prepared_without_the_speculative_config():
    runner = _Runner()
    out = runner._prepare_inputs(_step({}), [1, 1])
    assert runner.seen == [None]
    assert out == ("logits_indices", None, 1)
    assert runner.speculative_config is CONFIG  # restored after the call


def test_a_drafted_step_keeps_the_config_and_its_metadata():
    runner = _Runner()
    out = runner._prepare_inputs(_step({"a": [5, 6]}), [3])
    assert runner.seen == [CONFIG]
    assert isinstance(out[1], SpecDecodeMetadata)


def test_a_runner_that_may_not_run_plain_steps_keeps_the_speculative_path():
    runner = _Runner(plain_ok=False)  # e.g. a hybrid model, or another drafter
    out = runner._prepare_inputs(_step({}), [1])
    assert runner.seen == [CONFIG]
    assert isinstance(out[1], SpecDecodeMetadata)


def test_the_config_comes_back_when_preparing_fails():
    runner = _Runner(fail=True)
    with pytest.raises(RuntimeError, match="prepare failed"):
        runner._prepare_inputs(_step({}), [1])
    assert runner.speculative_config is CONFIG
