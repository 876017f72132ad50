"""Trace loading and prompt rendering (chat templates, multi-turn, completion prompts)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_replay_tokenizers import make_hf_dir, make_tiktoken_file

from vllm_specext.replay.tokenizers import Special, load_tokenizer
from vllm_specext.replay.traces import (
    VICUNA_SYSTEM,
    TraceError,
    load_traces,
    render_chat,
    resolve_template,
    tokenize_record,
)

TWO_TURNS = [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"},
             {"role": "user", "content": "q2"}]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def tiktoken_tok(tmp_path):
    return load_tokenizer(str(make_tiktoken_file(tmp_path / "t.tiktoken")))


def test_load_traces_fields_and_limit(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [
        {"id": "a", "category": "c1", "model": "m", "prompt": "p", "output": "o"},
        {"id": "b", "model": "vicuna", "messages": TWO_TURNS, "output": "a2"},
        {"id": "c", "prompt": "p3", "output": "o3"}])
    recs = load_traces(path)
    assert [r.id for r in recs] == ["a", "b", "c"] and [r.line for r in recs] == [1, 2, 3]
    assert recs[0].prompt == "p" and recs[0].messages is None
    assert recs[1].prompt is None and recs[1].messages == TWO_TURNS
    assert recs[1].category == "all"
    assert len(load_traces(path, limit=2)) == 2


@pytest.mark.parametrize("row, match", [
    ("{not json", "not JSON"),
    (json.dumps({"prompt": "p"}), "output"),
    (json.dumps({"output": "o"}), "prompt"),
])
def test_load_traces_errors(tmp_path, row, match):
    path = tmp_path / "bad.jsonl"
    path.write_text(row + "\n")
    with pytest.raises(TraceError, match=match):
        load_traces(path)


def test_vicuna_two_turns():
    segs = render_chat(TWO_TURNS, "vicuna_v1.1", None)
    assert segs == [Special("<s>"), f"{VICUNA_SYSTEM} USER: q1 ASSISTANT: a1", Special("</s>"),
                    "USER: q2 ASSISTANT:"]
    assert render_chat(TWO_TURNS[:1], "vicuna_v1.1", None) == [
        Special("<s>"), f"{VICUNA_SYSTEM} USER: q1 ASSISTANT:"]


def test_chatml_adds_default_system():
    segs = render_chat(TWO_TURNS, "chatml", None)
    start, end = Special("<|im_start|>"), Special("<|im_end|>")
    assert segs == [start, "system\nYou are a helpful assistant.", end, "\n",
                    start, "user\nq1", end, "\n", start, "assistant\na1", end, "\n",
                    start, "user\nq2", end, "\n", start, "assistant\n"]
    own = render_chat([{"role": "system", "content": "S"}] + TWO_TURNS[:1], "chatml", None)
    assert own[1] == "system\nS"


def test_mistral_inst_system_goes_to_last_user():
    msgs = [{"role": "system", "content": "S"}] + TWO_TURNS
    assert render_chat(msgs, "mistral_inst", None) == [
        Special("<s>"), Special("[INST]"), "q1", Special("[/INST]"), "a1", Special("</s>"),
        Special("[INST]"), "S\n\nq2", Special("[/INST]")]


def test_hf_template(tmp_path):
    template = ("{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}"
                "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
    tok = load_tokenizer(str(make_hf_dir(tmp_path / "hf", template)))
    assert render_chat(TWO_TURNS, "hf", tok) == ["<s><user>q1<assistant>a1<user>q2<assistant>"]
    assert resolve_template("auto", "some-model", tok) == "hf"


def test_resolve_template(tiktoken_tok):
    assert resolve_template("auto", "vicuna-7b", tiktoken_tok) == "vicuna_v1.1"
    assert resolve_template("auto", "Qwen2-7B-Instruct", tiktoken_tok) == "chatml"
    assert resolve_template("auto", "Mistral-7B-Instruct-v0.3", tiktoken_tok) == "mistral_inst"
    assert resolve_template("chatml", "vicuna", tiktoken_tok) == "chatml"
    with pytest.raises(TraceError, match="pass --template"):
        resolve_template("auto", "gpt", tiktoken_tok)
    with pytest.raises(TraceError, match="unknown chat template"):
        resolve_template("nope", "gpt", tiktoken_tok)
    with pytest.raises(TraceError, match="no chat_template"):
        render_chat(TWO_TURNS, "hf", tiktoken_tok)


def test_tokenize_record_completion_and_chat(tmp_path, tiktoken_tok):
    path = write_jsonl(tmp_path / "t.jsonl", [
        {"id": "a", "prompt": "the end", "output": " the end"},
        {"id": "b", "model": "x", "messages": TWO_TURNS, "output": "hello"}])
    comp, chat = load_traces(path)
    prompt, output = tokenize_record(comp, tiktoken_tok)
    assert prompt == tiktoken_tok.encode_text("the end")
    assert output == tiktoken_tok.encode_text(" the end")
    # vicuna needs <s> and </s>: the tiny tiktoken vocabulary has neither
    with pytest.raises(ValueError, match="<s>"):
        tokenize_record(chat, tiktoken_tok, "vicuna_v1.1")
    hf = load_tokenizer(str(make_hf_dir(tmp_path / "hf")))
    prompt, output = tokenize_record(chat, hf, "vicuna_v1.1")
    eos = hf.special_id("</s>")
    assert prompt[0] == hf.special_id("<s>") and prompt.count(eos) == 1
    cut = prompt.index(eos)
    assert prompt[1:cut] == hf.encode_text(f"{VICUNA_SYSTEM} USER: q1 ASSISTANT: a1")
    assert prompt[cut + 1:] == hf.encode_text("USER: q2 ASSISTANT:")
    assert output == hf.encode_text("hello")
