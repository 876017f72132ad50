"""Request life cycle with speculation on (real engine, default model, fp32, greedy), for
every method but ``mtp_ngram``: preempted and resumed requests (a KV cache of 4 usable blocks
for 6 concurrent requests), aborted requests (running or waiting), request-id reuse
(right after the id finished or was aborted, in the same engine step) and an injected
proposer exception leave the drafter with no per-request state, and outputs stay
identical to decoding without speculation. The exception is absorbed: the request
completes, the error is logged once with its request id and counted in
``vllm_specext_proposer_errors_total``.

Client disconnects over HTTP and the counter on the server's ``/metrics`` are tested in
test_soak.py.
"""
from __future__ import annotations

import pytest
from engine_helpers import run_job

pytestmark = pytest.mark.engine

METHODS = {"ngram": {"method": "ngram", "num_speculative_tokens": 8},
           "suffix": {"method": "suffix", "num_speculative_tokens": 8},
           "memory_decoding": {"method": "memory_decoding", "num_speculative_tokens": 8},
           "lookahead": {"method": "lookahead"}}
PROMPTS = [
    "Count from 1 to 100, separated by commas.",
    "Copy this list exactly, one item per line: apple, banana, cherry, date, elderberry, "
    "fig, grape, honeydew, kiwi, lemon, mango, nectarine.",
    "Repeat exactly: red green blue red green blue red green blue red green blue",
    "Write a short story about a robot who learns to paint.",
    "Explain how a bicycle works.",
    "List ten fruits and their colors.",
]
LONG = {"temperature": 0.0, "max_tokens": 160, "ignore_eos": True}
SHORT = {"temperature": 0.0, "max_tokens": 40, "ignore_eos": True}
TINY_KV = {"max_model_len": 512, "num_gpu_blocks_override": 5}  # 4 x 128 tokens usable
FAULT = "inject-fault"


def engine_job(job: dict) -> dict:
    """Child process (see engine_helpers)."""
    import logging
    import os

    os.environ["VLLM_DISABLE_REQUEST_ID_RANDOMIZATION"] = "1"  # ids reach the drafter as given
    os.environ["VLLM_SPECEXT_TEST_FAIL_REQUEST"] = FAULT  # the adapter's test hook
    from engine_helpers import (chat_prompt, close_engine, counter, debug_states, drive,
                                idle_state, open_engine)

    from vllm_specext.integration.metrics import proposer_errors_total

    logged: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())
    logging.getLogger("vllm_specext.integration.adapter").addHandler(handler)

    llm = open_engine(None)
    prompts = [chat_prompt(llm, p) for p in PROMPTS]
    ref = drive(llm, [{"id": f"long{i}", "prompt": p, "params": LONG}
                      for i, p in enumerate(prompts)]
                + [{"id": f"short{i}", "prompt": p, "params": SHORT}
                   for i, p in enumerate(prompts)])
    close_engine(llm)
    results = {"none": {k: v["choices"][0]["token_ids"] for k, v in ref.items()}}

    for name, spec in METHODS.items():
        llm = open_engine(spec, **TINY_KV)
        res: dict = {"phases": {}}
        # 1. preemption: 6 long requests; two aborted (early, late), streamed for a prefix
        pre = counter(llm, "vllm:num_preemptions")
        reqs = [{"id": f"long{i}", "prompt": p, "params": {**LONG, "stream": i in (1, 4)},
                 "abort_after_steps": {1: 5, 4: 60}.get(i)} for i, p in enumerate(prompts)]
        res["phases"]["preempt_abort"] = drive(llm, reqs)
        res["preemptions"] = counter(llm, "vllm:num_preemptions") - pre
        res["state_after_preempt"] = idle_state(llm)
        res["waiting_seen"] = debug_states(llm)[0]["requests_waiting"]
        # 2. reuse of a finished id in the very next step (its finish is not flushed yet)
        res["phases"]["reuse_a"] = drive(llm, [
            {"id": "bg", "prompt": prompts[0], "params": SHORT},
            {"id": "reuse", "prompt": prompts[2], "params": SHORT}])
        res["phases"]["reuse_b"] = drive(llm, [
            {"id": "reuse", "prompt": prompts[3], "params": SHORT}])
        # 3. reuse of an aborted id
        res["phases"]["reuse_c"] = drive(llm, [
            {"id": "reuse", "prompt": prompts[5], "params": {**SHORT, "stream": True},
             "abort_after_steps": 3}])
        res["phases"]["reuse_d"] = drive(llm, [
            {"id": "reuse", "prompt": prompts[4], "params": SHORT}])
        res["state_after_reuse"] = idle_state(llm)
        # 4. a proposer exception on one request of a batch
        errors, n_logged = proposer_errors_total(), len(logged)
        res["phases"]["fault"] = drive(llm, [
            {"id": f"{FAULT}-1", "prompt": prompts[1], "params": SHORT},
            {"id": "ok", "prompt": prompts[2], "params": SHORT}])
        res["errors_counted"] = proposer_errors_total() - errors
        res["logged"] = logged[n_logged:]
        res["state_after_fault"] = idle_state(llm)
        res["num_errors"] = debug_states(llm)[0]["num_errors"]
        close_engine(llm)
        results[name] = res
    return results


@pytest.fixture(scope="module")
def runs():
    return run_job(__file__, {})


@pytest.fixture(params=list(METHODS))
def method(request):
    return request.param


def _ids(rec: dict) -> list[int]:
    return rec["choices"][0]["token_ids"] if rec["choices"] else []  # aborted while waiting


def _idle(states: list) -> None:
    (state,) = states
    assert state["active_requests"] == [] and state["request_keys"] == 0, state


def test_preempted_and_aborted_requests(runs, method):
    res, ref = runs[method], runs["none"]
    assert res["preemptions"] > 0
    out = res["phases"]["preempt_abort"]
    for i in range(len(PROMPTS)):
        rec, want = out[f"long{i}"], ref[f"long{i}"]
        if i in (1, 4):  # aborted: what was streamed is a prefix
            assert rec["aborted"] and _ids(rec) == want[:len(_ids(rec))]
        else:
            assert _ids(rec) == want, f"long{i}"
    _idle(res["state_after_preempt"])
    assert res["waiting_seen"] == 0  # the scheduler's queue reaches the drafter



def test_request_id_reuse(runs, method):
    res, ref = runs[method], runs["none"]
    ph = res["phases"]
    assert _ids(ph["reuse_a"]["reuse"]) == ref["short2"]
    assert _ids(ph["reuse_a"]["bg"]) == ref["short0"]
    assert _ids(ph["reuse_b"]["reuse"]) == ref["short3"]
    assert ph["reuse_c"]["reuse"]["aborted"]
    assert _ids(ph["reuse_c"]["reuse"]) == ref["short5"][:len(_ids(ph["reuse_c"]["reuse"]))]
    assert _ids(ph["reuse_d"]["reuse"]) == ref["short4"]
    _idle(res["state_after_reuse"])


def test_proposer_exception_is_absorbed(runs, method):
    res, ref = runs[method], runs["none"]
    fault = res["phases"]["fault"]
    assert _ids(fault[f"{FAULT}-1"]) == ref["short1"]
    assert _ids(fault["ok"]) == ref["short2"]
    assert res["num_errors"] > 0 and res["errors_counted"] == res["num_errors"]
    assert len(res["logged"]) == 1 and "proposer failed" in res["logged"][0]
    assert f"{FAULT}-1" in res["logged"][0]
    _idle(res["state_after_fault"])
