"""``vllm-specext replay`` end to end on tiny traces: tables, files, plots, sweeps, errors."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_replay_tokenizers import make_tiktoken_file
from test_replay_traces import write_jsonl

from vllm_specext.replay.cli import main
from vllm_specext.replay.runner import pick_rule
from vllm_specext.replay.sweep import ReplayError, available_methods, expand_configs, parse_param

ROWS = [
    {"id": "0", "category": "copy", "model": "m", "prompt": "the the the",
     "output": " the the the the"},
    {"id": "1", "category": "fresh", "model": "m", "prompt": "abc", "output": "xyz"},
]


@pytest.fixture
def tiny(tmp_path):
    return (write_jsonl(tmp_path / "tiny.jsonl", ROWS),
            make_tiktoken_file(tmp_path / "tiny.tiktoken"))


def _run(capsys, *argv):
    code = main([str(a) for a in argv] + ["--no-progress"])
    out, err = capsys.readouterr()
    return code, out, err


def test_naive_end_to_end_files(tiny, tmp_path, capsys):
    traces, tok = tiny
    out_dir = tmp_path / "out"
    code, out, err = _run(capsys, "--traces", traces, "--tokenizer", tok, "--methods", "naive",
                          "--k", "2,4", "--out", out_dir, "--recommend")
    assert code == 0, err
    assert "| tiny.jsonl | copy | naive k=2 |" in out and "Recommended" in out
    data = json.loads((out_dir / "replay.json").read_text())
    rows = {(r["category"], r["k"]): r for r in data["rows"]}
    assert set(rows) == {(c, k) for c in ("copy", "fresh", "ALL") for k in (2, 4)}
    # " the" x4 (tokens 258) after a prompt "the the the" = [257, 258, 258]:
    # naive takes 4 steps; the oracle copies " the the" (k=2) + bonus, then " the" (end).
    copy2, copy4 = rows[("copy", 2)], rows[("copy", 4)]
    assert copy2["output_tokens"] == 4 and copy2["tau"] == 1.0
    assert copy2["oracle_steps"] == 2 and copy4["oracle_steps"] == 1
    assert rows[("fresh", 4)]["oracle_tau"] == 1.0
    assert rows[("ALL", 4)]["requests"] == 2
    assert data["meta"]["cost_model"]["step_ms"] == 33.2
    assert {r["category"] for r in data["recommendations"]} == {"copy", "fresh", "ALL"}
    csv_lines = (out_dir / "replay.csv").read_text().splitlines()
    assert len(csv_lines) == 1 + 6 and "acceptance_by_position" in csv_lines[0]


def test_plots_are_written(tiny, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    traces, tok = tiny
    out_dir = tmp_path / "out"
    methods = ",".join(available_methods()[0])  # naive draws "no drafts" panels
    code, _, err = _run(capsys, "--traces", traces, "--tokenizer", tok, "--methods", methods,
                        "--out", out_dir)
    assert code == 0, err
    for name in ("tau_by_category.png", "acceptance_by_position.png", "latency_vs_context.png"):
        png = (out_dir / name).read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000


def test_all_available_methods_and_cold(tiny, capsys):
    traces, tok = tiny
    code, out, err = _run(capsys, "--traces", traces, "--tokenizer", tok, "--cold")
    assert code == 0, err
    for method in available_methods()[0]:
        assert f"| {method} k=8 |" in out


def test_unknown_and_unimplemented_methods(tiny, capsys):
    traces, tok = tiny
    code, _, err = _run(capsys, "--traces", traces, "--tokenizer", tok, "--methods", "bogus")
    assert code == 2 and "unknown speculative method 'bogus'" in err
    code, _, err = _run(capsys, "--traces", traces, "--tokenizer", tok, "--methods", "mtp_ngram")
    assert code == 2 and "mtp_ngram" in err


def test_param_errors(tiny, capsys):
    traces, tok = tiny
    code, _, err = _run(capsys, "--traces", traces, "--tokenizer", tok, "--methods", "naive",
                        "--param", "prompt_lookup_min=1")
    assert code == 2 and "no selected method" in err
    code, _, err = _run(capsys, "--traces", traces, "--tokenizer", tok, "--methods", "naive",
                        "--param", "num_speculative_tokens=3")
    assert code == 2 and "--k" in err


def test_missing_tokenizer_rule(tiny, capsys):
    traces, tok = tiny
    code, _, err = _run(capsys, "--traces", traces, "--tokenizer", f"othermodel={tok}",
                        "--methods", "naive")
    assert code == 2 and "no --tokenizer rule" in err


def test_parse_param_and_sweep():
    assert parse_param("ngram.prompt_lookup_min=1,2") == ("ngram", "prompt_lookup_min", [1, 2])
    assert parse_param("x=true,0.5,abc") == (None, "x", [True, 0.5, "abc"])
    with pytest.raises(ReplayError):
        parse_param("novalue")
    configs = expand_configs(["naive"], [], [2, 4])
    assert [c.label for c in configs] == ["naive k=2", "naive k=4"]


@pytest.mark.skipif("ngram" not in available_methods()[0], reason="ngram not built yet")
def test_param_cartesian_product():
    configs = expand_configs(["ngram", "naive"], ["prompt_lookup_min=1,2",
                                                  "ngram.prompt_lookup_max=3,4"], [8])
    assert [c.label for c in configs] == [
        "ngram prompt_lookup_max=3 prompt_lookup_min=1 k=8",
        "ngram prompt_lookup_max=4 prompt_lookup_min=1 k=8",
        "ngram prompt_lookup_max=3 prompt_lookup_min=2 k=8",
        "ngram prompt_lookup_max=4 prompt_lookup_min=2 k=8",
        "naive k=8"]
    with pytest.raises(ReplayError, match="prompt_lookup_min"):
        expand_configs(["ngram"], ["prompt_lookup_min=9", "prompt_lookup_max=3"], [8])


def test_pick_rule_prefers_model_over_file_name():
    rules = ["mistral=A", "qwen=B", "C"]
    assert pick_rule(rules, "Qwen2-7B", "mtbench_qwen2_mistral.jsonl") == "B"
    assert pick_rule(rules, "unknown", "x_mistral.jsonl") == "A"
    assert pick_rule(rules, "unknown", "x.jsonl") == "C"
    assert pick_rule(["mistral=A"], "unknown", "x.jsonl") is None


SHARED = Path(__file__).resolve().parents[2] / "shared"


@pytest.mark.skipif(not (SHARED / "traces").exists(), reason="shared/traces not present")
def test_shared_chat_traces_smoke(capsys):
    tok = SHARED / "tokenizers"
    code, out, err = _run(
        capsys, "--traces", SHARED / "traces" / "mtbench_qwen2_mistral_vllm_greedy.jsonl",
        "--tokenizer", f"Mistral={tok / 'mistral'}",
        "--tokenizer", f"Qwen={tok / 'qwen' / 'qwen.tiktoken'}",
        "--methods", "naive", "--limit", "2")
    assert code == 0, err
    assert "| mtbench_qwen2_mistral_vllm_greedy.jsonl | ALL | naive k=8 |" in out
