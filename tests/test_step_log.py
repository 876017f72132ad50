"""Units of benchmarks/step_log.py: e2e cells compared with their group's ``none`` step
by step."""
from __future__ import annotations

import json

import pytest
from conftest import load_benchmark


@pytest.fixture(scope="module")
def step_log():
    return load_benchmark("step_log")


def _run(config, log, tps, group=("none", "naive", "suffix"), rnd=0):
    return {"round": rnd, "batch": 32, "workload": "open_chat", "config": config,
            "group": list(group), "tokens_per_s": tps, "step_log": log}


NONE_LOG = [[2.0, 32, 32], [0.1, 32, 32], [0.1, 32, 20], [0.1, 20, 0]]


def test_steps_align_where_the_same_work_was_done(step_log):
    drafter = [[2.2, 32, 32], [0.12, 32, 32], [0.15, 40, 12], [0.1, 12, 0]]
    assert step_log.aligned_steps(drafter, NONE_LOG) == [1]  # not the first step
    assert step_log.aligned_steps(NONE_LOG, NONE_LOG) == [1, 2, 3]
    assert step_log.aligned_steps(drafter[:1], NONE_LOG) == []


def test_each_run_is_compared_with_the_none_of_its_own_group(step_log):
    naive = [[1.8, 32, 32], [0.11, 32, 32], [0.11, 32, 20], [0.11, 20, 0]]
    runs = [_run("none", NONE_LOG, 50.0), _run("naive", naive, 49.0),
            _run("none", [[1.0, 32, 32]], 10.0, group=("none", "x")),
            _run("x", [[1.0, 32, 32]], 10.0, group=("none", "x"), rnd=1),  # no none there
            _run("suffix", [], 51.0)]  # a wall-clock cell keeps no steps
    (row,) = step_log.compare(runs)
    assert row["config"] == "naive" and row["first"] == pytest.approx(0.9)
    assert (row["aligned"], row["none_steps"]) == (3, 3)
    assert row["aligned_ratio"] == pytest.approx(1.1)
    assert row["cell_ratio"] == pytest.approx(0.98)
    assert step_log.compare(runs, batch=8) == []
    assert "| 0 | 32 | open_chat | naive | 0.900 | 3/3 | 1.100 | 0.980 |" in step_log.table([row])


def test_the_script_reads_e2e_json_and_says_when_nothing_was_logged(step_log, tmp_path,
                                                                    capsys):
    path = tmp_path / "e2e.json"
    path.write_text(json.dumps({"runs": [_run("none", NONE_LOG, 50.0),
                                         _run("naive", NONE_LOG, 50.0)]}))
    slower = tmp_path / "slower.json"  # a second run of the same groups
    slower.write_text(json.dumps({"runs": [_run("none", [[2 * s, n, r] for s, n, r in NONE_LOG],
                                                25.0),
                                           _run("naive", [[2 * s, n, r] for s, n, r in NONE_LOG],
                                                25.0)]}))
    assert step_log.main([str(path), str(slower)]) == 0
    out = capsys.readouterr().out  # each file's runs are paired with that file's none
    assert out.count("| 1.000 | 3/3 | 1.000 | 1.000 |") == 2
    path.write_text(json.dumps({"runs": [_run("naive", [], 50.0)]}))
    assert step_log.main([str(path)]) == 1
    assert "--slices" in capsys.readouterr().err
