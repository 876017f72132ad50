"""The decision-log summary (``benchmarks/decision_log.py``) on hand-made lines."""
from __future__ import annotations

import json

import pytest
from conftest import load_benchmark

from vllm_specext.integration.decision_log import DecisionLog

decision_log = load_benchmark("decision_log")


def line(rows, committed, timed, offered, shown, exploring=False):
    return {"rows": rows, "batch": rows, "committed": committed, "timed": timed,
            "offered": offered, "offered_rows": 1, "shown": shown, "shown_rows": 1,
            "threshold": 0.5, "plain_ms": 10.0, "exploring": exploring}


def test_rows_bucket():
    assert [decision_log.rows_bucket(r) for r in (1, 2, 3, 4, 7, 8, 32, 33)] == [
        "1", "2-3", "2-3", "4-7", "4-7", "8-15", "32-63", "32-63"]


def test_summary_attributes_acceptance_and_time_to_the_step_that_showed_drafts():
    lines = [line(0, 0, None, 0, 0),                     # after the prefill
             line(4, 4, None, 6, 0),                     # plain step decided
             line(4, 4, [4, 10.0, False], 8, 8, True),   # an exploration decided
             line(4, 7, [12, 14.0, True], 3, 0),         # it accepted 3
             line(2, 2, [4, 11.0, False], 2, 2),         # rows fell to 2
             line(2, 3, [4, 9.0, True], 0, 0)]
    s = decision_log.summarize(lines)
    assert list(s) == ["2-3", "4-7"]
    assert s["4-7"] == {"steps": 3, "shown_steps": 1, "explorations": 1, "offered": 17,
                        "shown": 8, "accepted": 3, "plain_ms": 10.0, "verified_ms": 14.0}
    assert s["2-3"]["shown"] == 2 and s["2-3"]["accepted"] == 1
    assert s["2-3"]["verified_ms"] == 9.0 and s["2-3"]["plain_ms"] is None
    assert "| 4-7 | 3 | 1 (1) | 17 | 8 | 3 | 10.0 | 14.0 |" in decision_log.table("x", s)


def test_a_failed_write_stops_the_log_without_raising(tmp_path, caplog):
    log = DecisionLog(str(tmp_path / "x.jsonl"))
    log.write(rows=1)
    log._file.close()
    log._file = open("/dev/full", "w", buffering=1)  # noqa: SIM115  (a full disk: ENOSPC)
    log.write(rows=2)
    log.write(rows=3)
    assert "logging stops" in caplog.text
    assert len((tmp_path / "x.jsonl").read_text().splitlines()) == 1


def test_a_truncated_line_is_skipped_and_a_missing_file_is_a_usage_error(tmp_path, capsys):
    path = tmp_path / "log.jsonl"
    path.write_text(json.dumps(line(4, 4, None, 0, 0)) + "\n" + '{"step": 2, "ro')
    assert decision_log.main([str(path)]) == 0
    out = capsys.readouterr()
    assert "log.jsonl:2: not a JSON line, skipped" in out.err and "| 4-7 | 1 |" in out.out
    assert "log.jsonl: start-up (1 steps)" in out.out
    with pytest.raises(SystemExit) as exit_info:
        decision_log.main([str(tmp_path / "missing.jsonl")])
    assert exit_info.value.code == 2 and "cannot read" in capsys.readouterr().err


def test_a_log_is_cut_into_runs_at_its_marks():
    step = line(1, 1, None, 0, 0)
    marked = [step, {"mark": "warm-up"}, step, step, {"mark": "empty"}, {"mark": "cell"}, step]
    assert [(label, len(s)) for label, s in decision_log.runs(marked)] == [
        ("start-up", 1), ("warm-up", 2), ("cell", 1)]
    assert [(label, len(s)) for label, s in decision_log.runs([step] * 3)] == [("start-up", 3)]


def test_a_mark_is_a_line_of_its_own(tmp_path):
    log = DecisionLog(str(tmp_path / "x.jsonl"))
    log.write(rows=1)
    log.mark("cell A")
    log.write(rows=2)
    lines = [json.loads(x) for x in (tmp_path / "x.jsonl").read_text().splitlines()]
    assert [x.get("mark", x.get("step")) for x in lines] == [1, "cell A", 2]
