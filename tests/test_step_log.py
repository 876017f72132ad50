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


def _phased(forward, prepare, sample, propose=None, drafts=0):
    phases = {"_model_forward": forward, "compute_logits": 0.001, "_prepare_inputs": prepare,
              "sample_tokens": sample, "draft_tokens": drafts}
    return phases if propose is None else {**phases, "propose": propose}


def test_phases_split_undrafted_aligned_steps_into_model_and_the_rest(step_log, tmp_path,
                                                                     capsys):
    none = [[2.0, 32, 32, _phased(1.9, 0.01, 0.02)],
            [0.100, 32, 32, _phased(0.090, 0.001, 0.002)],
            [0.100, 32, 32, _phased(0.090, 0.001, 0.002)],
            [0.100, 32, 0, _phased(0.090, 0.001, 0.002)]]
    naive = [[2.1, 32, 32, _phased(2.0, 0.01, 0.02, 0.001)],
             [0.104, 32, 32, _phased(0.093, 0.001, 0.0025, 0.0004)],
             [0.150, 32, 32, _phased(0.140, 0.001, 0.0025, 0.0004, drafts=8)],  # verified
             [0.102, 32, 0, _phased(0.091, 0.001, 0.0025, 0.0004)]]
    runs = [_run("none", none, 50.0), _run("naive", naive, 49.0),
            _run("suffix", NONE_LOG, 50.0)]  # a step log without phases
    (row,) = step_log.phase_deltas(runs)
    assert (row["config"], row["aligned"]) == ("naive", 2)  # the verified step left out
    assert row["none_ms"] == pytest.approx(100.0)
    d = row["deltas"]  # ms per undrafted aligned step over none's
    assert d["step"] == pytest.approx(3.0) and d["model"] == pytest.approx(2.0)
    assert d["rest of step"] == pytest.approx(1.0)
    assert d["propose"] == pytest.approx(0.4) and d["sampling"] == pytest.approx(0.1)
    assert d["prepare inputs"] == pytest.approx(0.0)
    assert "| +3.00 | +2.00 | +1.00 | +0.00 | +0.10 | +0.40 | +1.00% |" in step_log.phase_table([row])
    _check_phase_cli(step_log, tmp_path, capsys, runs, "--phases",
                     "| 0 | 32 | open_chat | naive | 2 | 100.0 |")


def _check_phase_cli(step_log, tmp_path, capsys, runs, flag, line):
    """``step_log.py FILE flag`` prints ``line`` for ``runs`` and, for runs whose step
    logs have no phase times, exits 1 asking for ``--phase-times``."""
    path = tmp_path / "e2e.json"
    path.write_text(json.dumps({"runs": runs}))
    assert step_log.main([str(path), flag]) == 0
    assert line in capsys.readouterr().out
    path.write_text(json.dumps({"runs": [_run("none", NONE_LOG, 50.0),
                                         _run("naive", NONE_LOG, 50.0)]}))
    assert step_log.main([str(path), flag]) == 1
    assert "--phase-times" in capsys.readouterr().err


def test_account_splits_a_cell_into_first_step_undrafted_drafted_and_saved(step_log,
                                                                         tmp_path, capsys):
    plain = _phased(0.09, 0.001, 0.002)
    none = [[2.0, 32, 32, plain], [0.1, 32, 32, plain], [0.1, 32, 16, plain],
            [0.08, 16, 0, plain]]  # later steps' means: 0.1 s at 32 unfinished, 0.08 at 16
    suffix = [[2.1, 32, 32, plain], [0.11, 32, 32, plain],
              [0.15, 48, 0, _phased(0.14, 0.001, 0.002, 0.001, drafts=16)]]
    naive = [[2.0, 32, 32, plain], [0.1, 32, 20, plain],  # 20 unfinished: priced as 16
             [0.09, 20, 0, plain]]
    runs = [_run("none", none, 50.0), _run("suffix", suffix, 48.0),
            _run("naive", naive, 51.0), _run("x", NONE_LOG, 50.0)]  # no phases: left out
    rows = {r["config"]: r for r in step_log.account(runs)}
    assert set(rows) == {"suffix", "naive"}
    total = 2.28
    s = rows["suffix"]
    assert s["first"] == pytest.approx(0.1 / total)
    assert s["undrafted"] == pytest.approx(0.01 / total)
    assert s["drafted"] == pytest.approx(0.05 / total)  # 0.15 s against 0.1 s
    assert s["saved"] == pytest.approx(0.08 / total)  # none's 0.28 s against 2 x 0.1 s
    assert (s["drafted_steps"], s["draft_tokens"]) == (1, 16)
    cell = sum(e[0] for e in suffix) - total  # the parts add up to the whole difference
    assert s["first"] + s["undrafted"] + s["drafted"] - s["saved"] == pytest.approx(cell / total)
    assert rows["naive"]["undrafted"] == pytest.approx(0.01 / total)  # 0.09 s against 0.08
    assert rows["naive"]["cell_ratio"] == pytest.approx(1.02)
    assert ("| 0 | 32 | open_chat | suffix | 0.960 | +4.39% | +0.44% | +2.19% (1, 16) | "
            "+3.51% |") in step_log.account_table([s])
    _check_phase_cli(step_log, tmp_path, capsys, runs, "--account",
                     "| 0 | 32 | open_chat | naive | 1.020 |")
