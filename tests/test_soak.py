"""Short loopback soak (the test-suite size of ``benchmarks/soak.py``): ``vllm-specext
serve`` with ``suffix`` speculation on 127.0.0.1, 16 concurrent clients mixing streamed,
non-streamed and aborted (client disconnect) greedy requests for about 40 s. Zero server
errors; every completed answer, streamed or not, has the token ids of decoding without
speculation (an in-process engine on the same prompt token ids), every aborted one a
prefix of them; afterwards the drafter holds no per-request state. Then a proposer
exception injected on one request (``VLLM_SPECEXT_TEST_FAIL_REQUEST``) is absorbed: the
answer is still right, the error is logged once with the request id and
``vllm_specext_proposer_errors_total`` on ``/metrics`` counts it.
"""
from __future__ import annotations

import pytest
from conftest import load_benchmark
from engine_helpers import run_job
from serve_helpers import Server, chat, metrics, wait_idle_state

pytestmark = pytest.mark.engine

CLIENTS, DURATION = 16, 40
FAULT = "inject-fault"
SPEC = {"method": "suffix", "num_speculative_tokens": 8}


soak = load_benchmark("soak")
BODIES = soak.pool_bodies()


def engine_job(job: dict) -> dict:
    """Child process (see engine_helpers): greedy answers without speculation."""
    from engine_helpers import chat_prompt, close_engine, drive, open_engine

    llm = open_engine(None)
    prompts = [chat_prompt(llm, b["messages"][0]["content"]) for b in BODIES]
    out = drive(llm, [{"id": str(i), "prompt": p,
                       "params": {"temperature": 0.0, "max_tokens": b["max_tokens"]}}
                      for i, (p, b) in enumerate(zip(prompts, BODIES))])
    close_engine(llm)
    return {"prompt_token_ids": [p["prompt_token_ids"] for p in prompts],
            "token_ids": [out[str(i)]["choices"][0]["token_ids"] for i in range(len(BODIES))]}


@pytest.fixture(scope="module")
def reference():
    return run_job(__file__, {})


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    env = {"VLLM_SERVER_DEV_MODE": "1",  # /collective_rpc for the drafter's state
           "VLLM_SPECEXT_TEST_FAIL_REQUEST": FAULT}
    with Server(SPEC, tmp_path_factory.mktemp("soak") / "server.log", env=env) as s:
        yield s


@pytest.fixture(scope="module")
def soaked(reference, server):
    return soak.run_config(server, BODIES, CLIENTS, DURATION)


def test_soak_no_errors_and_greedy_identical(reference, soaked, server):
    for rec in soaked["warmup"]:  # the server's chat template gives the same prompt
        assert rec["prompt_token_ids"] == reference["prompt_token_ids"][rec["prompt"]]
    ref = dict(enumerate(reference["token_ids"]))
    assert soaked["errors"] == 0, soaked["error_samples"]
    assert soak.check(soaked["warmup"] + soaked["records"], ref) == []
    modes = {(r["mode"], r["aborted"]) for r in soaked["records"]}
    assert {("plain", False), ("stream", False), ("abort", True)} <= modes
    assert soaked["accepted_tokens"] > 0 and soaked["proposer_errors"] == 0
    print({k: v for k, v in soaked.items() if k not in ("records", "warmup")})


def test_no_state_left_after_soak(soaked, server):
    (state,) = wait_idle_state(server.base)
    assert state["active_requests"] == [] and state["request_keys"] == 0, state


def test_proposer_exception_counted_on_metrics(reference, soaked, server):
    before = metrics(server.base)["vllm_specext_proposer_errors_total"]
    answer = chat(server.base, BODIES[0], headers={"X-Request-Id": f"{FAULT}-1"})
    assert answer["choices"][0]["token_ids"] == reference["token_ids"][0]
    assert before == 0 and metrics(server.base)["vllm_specext_proposer_errors_total"] > 0
    lines = [line for line in server.log().splitlines() if "proposer failed" in line]
    assert len(lines) == 1 and f"{FAULT}-1" in lines[0], lines
    (state,) = wait_idle_state(server.base)
    assert state["num_errors"] > 0
    assert state["active_requests"] == [] and state["request_keys"] == 0, state
