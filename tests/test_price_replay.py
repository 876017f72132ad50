"""The decision-log price replay (``benchmarks/price_replay.py``) on hand-made logs."""
from __future__ import annotations

import json

import pytest
from conftest import load_benchmark

price_replay = load_benchmark("price_replay")


def step(rows, ms, verified=False, tokens=None, offered=0):
    return {"rows": rows, "batch": rows, "committed": rows, "offered": offered,
            "timed": [tokens or rows, ms, verified], "shown": 0}


def test_a_new_batch_meets_the_previous_batch_prices():
    """Plain 32-row steps at 160 ms in the warm-up, 100 ms in the cell: the cell's first
    steps are priced dear until the cost model follows them."""
    lines = ([{"mark": "warm-up"}] + [step(32, 160.0) for _ in range(6)]
             + [{"mark": "cell"}] + [step(32, 100.0) for _ in range(20)]
             + [step(32, 130.0, True, tokens=40, offered=8) for _ in range(3)])
    result = price_replay.replay(lines, min_rows=16, first=2)
    assert list(result) == ["warm-up", "cell"]
    warm, cell = result["warm-up"], result["cell"]
    assert warm["plain"]["steps"] == 3  # no price until 3 steps of a size are timed
    assert warm["plain"]["mean_error"] == pytest.approx(0.0)
    assert cell["plain"]["steps"] == 20
    assert cell["plain"]["first_error"] == pytest.approx(0.6)  # priced 160 ms, took 100
    assert 0.0 < cell["plain"]["mean_error"] < cell["plain"]["first_error"]
    assert cell["verified"]["steps"] == 3 and cell["threshold"] > 0.0
    assert cell["plain"]["mean_abs_error"] == pytest.approx(cell["plain"]["mean_error"])
    assert warm["verified"] == {"steps": 0, "mean_error": None, "mean_abs_error": None,
                                "first_error": None}


def test_small_rows_and_steps_with_a_prefill_are_not_scored():
    lines = [step(4, 50.0) for _ in range(5)] + [
        {"rows": 32, "batch": 33, "committed": 32, "offered": 0, "timed": None, "shown": 0},
        step(32, 100.0, tokens=40)]  # 40 tokens over 32 rows: a prefill chunk rode along
    result = price_replay.replay(lines, min_rows=16)
    assert result["start-up"]["plain"]["steps"] == 0


def test_main_prints_a_table_writes_json_and_numbers_repeated_runs(tmp_path, capsys):
    path = tmp_path / "b32.suffix.1.jsonl"
    lines = ([{"mark": "cell"}] + [step(32, 100.0)] * 4) * 2
    path.write_text("\n".join(map(json.dumps, lines)) + "\n")
    out = tmp_path / "new" / "r.json"
    assert price_replay.main([str(path), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("cost model of ") and "| cell (2) | 4 |" in printed
    assert list(json.loads(out.read_text())[str(path)]) == ["cell", "cell (2)"]
    marks_only = tmp_path / "marks.jsonl"
    marks_only.write_text(json.dumps({"mark": "cell"}) + "\n")
    assert price_replay.main([str(marks_only)]) == 0
    assert "no timed decode steps" in capsys.readouterr().out
    for bad in (["--first", "0"], ["--margin", "0.5"], ["--verified-scale", "-1"]):
        with pytest.raises(SystemExit):
            price_replay.main([str(path), *bad])
