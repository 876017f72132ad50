"""Real engine, real default model (fp32): :class:`EngineProcess` runs a cell whole
(``run``) or a slice of engine steps at a time (``begin``/``advance``, in-process engine
core), with the same greedy outputs and per-request timings either way."""
from __future__ import annotations

import pytest

from vllm_specext.engine_run import EngineProcess

pytestmark = pytest.mark.engine

CELL = {"chats": [[{"role": "user", "content": "Copy this list: red, green, blue, amber, "
                    "violet, silver, coral, olive."}],
                  [{"role": "user", "content": "Name three rivers in Europe."}]],
        "max_tokens": 24, "temperature": 0.0}


def test_stepped_cell_matches_whole_cell():
    # adaptive off: drafts must not depend on how busy the machine is
    engine = EngineProcess({"spec": {"method": "ngram", "num_speculative_tokens": 4,
                                     "adaptive": False},
                            "dtype": "float32", "warmup": False, "in_process": True,
                            "kv_cache_gib": 1})
    try:
        engine.wait_ready()
        whole = engine.run(CELL)
        engine.begin(CELL)
        slices = 1
        while (stepped := engine.advance(0.001)) is None:  # 0.001 s: one step per slice
            slices += 1
        # one max_tokens per prompt; phase times in the step log (a whole run ignores them)
        each = {**CELL, "max_tokens_each": [5, 11], "phase_times": True}
        whole_each = engine.run(each)
        engine.begin(each)
        while (stepped_each := engine.advance(1.0)) is None:
            pass
    finally:
        engine.close()
    assert stepped["token_ids"] == whole["token_ids"]
    assert stepped["output_tokens"] == whole["output_tokens"] == sum(map(len, whole["token_ids"]))
    assert slices > 1
    assert len(stepped["ttft_s"]) == len(stepped["tpot_s"]) == 2
    assert 0 < max(stepped["ttft_s"]) < stepped["seconds"]
    # both requests start at once: only the prefill step ran while one waited
    assert 0 < stepped["queued_seconds"] < stepped["seconds"]
    assert stepped["queued_tokens"] == 2
    log = stepped["step_log"]  # [seconds, output tokens, unfinished requests] per step
    assert sum(step[1] for step in log) == stepped["output_tokens"]
    assert sum(step[0] for step in log) <= stepped["seconds"]
    assert log[-1][2] == 0 and all(step[2] in (1, 2) for step in log[:-1])
    assert stepped["num_draft_tokens"] > 0
    assert all(len(step) == 3 for step in log)  # no phase times unless asked
    for seconds, _, _, phases in stepped_each["step_log"]:
        model = phases["_model_forward"] + phases["compute_logits"]
        assert 0 < phases["_model_forward"] and 0 < model <= phases["execute_model"] <= seconds
        assert 0 < phases["propose"] <= phases["sample_tokens"] <= seconds
    for cell in (whole_each, stepped_each):
        assert [len(t) for t in cell["token_ids"]] == [5, 11]
        assert [t[:5] for t in cell["token_ids"]] == [t[:5] for t in whole["token_ids"]]


def test_stepped_cell_needs_an_in_process_engine():
    engine = EngineProcess({"spec": None, "dtype": "float32", "warmup": False,
                            "kv_cache_gib": 1})
    try:
        engine.wait_ready()
        with pytest.raises(RuntimeError, match="in-process engine core"):
            engine.begin(CELL)
    finally:
        engine.close()
