"""Unit tests of the draft hand-off (drafts carried by the model output instead of a
second RPC per step). The end-to-end path is covered by the engine tests, whose
accepted-draft assertions only pass when the scheduler receives the drafts."""
from __future__ import annotations

import pickle
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")

from vllm.v1.engine.core import EngineCore  # noqa: E402
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, DraftTokenIds, ModelRunnerOutput  # noqa: E402

from vllm_specext.integration.draft_handoff import (  # noqa: E402
    HANDOFF_ATTR,
    attach_drafts,
    hands_off,
    patch_engine_core,
)

DRAFTS = DraftTokenIds(req_ids=["a", "b"], draft_token_ids=[[1, 2], []])


class _Runner:
    def __init__(self, async_scheduling=False, pp=1):
        self.use_async_scheduling = async_scheduling
        self.vllm_config = SimpleNamespace(
            parallel_config=SimpleNamespace(pipeline_parallel_size=pp))
        self.taken = 0

    def take_draft_token_ids(self):
        self.taken += 1
        return DRAFTS


class _Scheduler:
    def __init__(self):
        self.updates = []

    def update_draft_token_ids(self, drafts):
        self.updates.append(drafts)


class _Executor:
    def __init__(self):
        self.calls = 0

    def take_draft_token_ids(self):
        self.calls += 1
        return DraftTokenIds(req_ids=["x"], draft_token_ids=[[9]])


def _core():
    return SimpleNamespace(scheduler=_Scheduler(), model_executor=_Executor(),
                           check_for_draft_tokens=True, async_scheduling=False)


def test_hands_off_only_with_sync_scheduling_and_one_stage():
    assert hands_off(_Runner())
    assert not hands_off(_Runner(async_scheduling=True))
    assert not hands_off(_Runner(pp=2))
    assert not hands_off(SimpleNamespace())


def test_attached_drafts_survive_pickling():
    out = ModelRunnerOutput(req_ids=["a", "b"], req_id_to_index={"a": 0, "b": 1})
    runner = _Runner()
    assert attach_drafts(runner, out) is out and runner.taken == 1
    back = pickle.loads(pickle.dumps(out))  # what the worker's response queue does
    assert getattr(back, HANDOFF_ATTR) == DRAFTS


def test_shared_empty_output_is_left_alone():
    runner = _Runner()
    assert attach_drafts(runner, EMPTY_MODEL_RUNNER_OUTPUT) is EMPTY_MODEL_RUNNER_OUTPUT
    assert not hasattr(EMPTY_MODEL_RUNNER_OUTPUT, HANDOFF_ATTR) and runner.taken == 0
    assert attach_drafts(runner, None) is None


def test_post_step_uses_handed_off_drafts_without_calling_workers():
    patch_engine_core()
    core = _core()
    core.scheduler._specext_handoff = DRAFTS
    EngineCore.post_step(core, True)
    assert core.scheduler.updates == [DRAFTS] and core.model_executor.calls == 0
    assert not hasattr(core.scheduler, "_specext_handoff")  # consumed once


def test_post_step_falls_back_to_vllm_without_hand_off():
    patch_engine_core()
    patch_engine_core()  # idempotent
    core = _core()
    EngineCore.post_step(core, True)
    assert core.model_executor.calls == 1 and len(core.scheduler.updates) == 1


def test_handed_off_none_means_no_drafts():
    patch_engine_core()
    core = _core()
    core.scheduler._specext_handoff = None
    EngineCore.post_step(core, True)
    assert core.scheduler.updates == [] and core.model_executor.calls == 0
