"""``benchmarks/adaptive_replay.py`` on synthetic outputs (no engine): the replay loop, the
sequence it builds, its argument errors."""
from __future__ import annotations

import argparse
import json

import pytest
from conftest import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("adaptive_replay")


def _outputs(bench) -> dict:
    """Every workload with 2 requests that copy their prompt, plus a warm-up request."""
    copy = {"prompt": list(range(10, 40)), "output": list(range(10, 40))}
    data = {w: [copy, copy] for w in bench.WORKLOADS}
    data["warmup"] = [{"prompt": [1, 2, 3], "output": [1, 2, 3, 1, 2, 3]}]
    return data


def test_sequence_follows_e2e_batch1_order(bench):
    seq = bench.build_sequence(_outputs(bench), prompts=1, max_tokens=5)
    assert [w for w, _ in seq] == ["warmup"] + list(bench.WORKLOADS)
    assert all(len(r["output"]) == 5 for w, r in seq[1:])


def test_copies_are_drafted_and_counted_per_workload(bench):
    seq = bench.build_sequence(_outputs(bench), prompts=2, max_tokens=30)
    for method in ("vllm_ngram", "suffix"):
        res = bench.replay_batch1(seq, method, fixed=0.1, per=0.01)
        assert set(res) == set(bench.WORKLOADS)  # the warm-up is not counted
        for cell in res.values():
            assert cell["tokens"] == 2 * 29  # every token after the prefill's
            assert cell["tau"] > 2 and cell["speed"] > 1.5  # copying a prompt pays


def test_a_slow_start_up_is_timed_again_and_copies_still_pay(bench):
    """The cost model times the warm-up request 10x slower (engines starting together):
    the copies that follow are still drafted, and priced by what their steps cost."""
    seq = bench.build_sequence(_outputs(bench), prompts=2, max_tokens=30)
    res = bench.replay_batch1(seq, "suffix", fixed=0.1, per=0.01, startup_slowdown=10.0)
    assert all(cell["tau"] > 2 for cell in res.values())


def test_nothing_to_copy_runs_plain(bench):
    data = {w: [{"prompt": [5, 6], "output": list(range(100, 140))}] for w in bench.WORKLOADS}
    data["warmup"] = [{"prompt": [1], "output": [2, 3]}]
    res = bench.replay_batch1(bench.build_sequence(data, 1, 40), "ngram", 0.3, 0.1)
    assert all(c["tau"] == 1.0 and c["speed"] == 1.0 for c in res.values())


def test_cost_specs_are_checked(bench):
    assert bench.parse_cost("hi=0.15,0.08") == ("hi", 0.15, 0.08)
    for bad in ("hi", "hi=0.1", "=0.1,0.2", "hi=-1,0.1", "hi=a,b"):
        with pytest.raises(argparse.ArgumentTypeError):
            bench.parse_cost(bad)


def test_main_writes_json_and_png(bench, tmp_path):
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps(_outputs(bench)))
    out = tmp_path / "r.json"
    assert bench.main(["--methods", "ngram,suffix", "--prompts", "1", "--max-tokens", "20",
                       "--costs", "a=0.1,0.02", "--outputs", str(outputs),
                       "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report["results"]["a"]) == {"vllm_ngram", "ngram", "suffix"}
    assert out.with_suffix(".png").stat().st_size > 0
    with pytest.raises(SystemExit):
        bench.main(["--methods", "eagle", "--outputs", str(outputs)])
    with pytest.raises(SystemExit):
        bench.main(["--startup-slowdown", "0.5", "--outputs", str(outputs)])
