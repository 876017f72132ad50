"""Units of the end-to-end benchmark's interleaving: engine groups, units, merging and
the pairing of each configuration with its own group's ``none``."""
from __future__ import annotations

import pytest
from conftest import load_benchmark


@pytest.fixture(scope="module")
def e2e():
    return load_benchmark("e2e")


def test_groups_hold_none_and_every_configuration_once(e2e):
    configs = ["none", "a", "b", "c", "d", "e", "f", "g"]
    groups = e2e.engine_groups(configs, 4)
    assert all(g[0] == "none" and len(g) <= 4 for g in groups)
    assert sorted(c for g in groups for c in g[1:]) == configs[1:]
    assert [len(g) for g in groups] == [4, 3, 3]  # as even as possible
    assert e2e.engine_groups(["none", "a"], 4) == [["none", "a"]]
    with pytest.raises(ValueError, match="engines_at_once"):
        e2e.engine_groups(configs, 1)


def test_units_are_prompts_at_batch_1_and_one_batch_otherwise(e2e):
    one = e2e.units("summarization", 1, 3, 16)
    assert len(one) == 3 and all(len(u["chats"]) == 1 and u["batch_size"] == 1 for u in one)
    eight = e2e.units("summarization", 8, 3, 16)
    assert len(eight) == 1 and len(eight[0]["chats"]) == 8 and eight[0]["max_tokens"] == 16
    four = e2e.units("summarization", 8, 3, 16, batch_units=4)
    assert [u["chats"] for u in four] == [e2e.WORKLOADS["summarization"][i:i + 8]
                                          for i in (0, 8, 16, 24)]
    assert len(e2e.units("summarization", 32, 3, 16, batch_units=4)) == 1  # 32 prompts


def test_slots_send_every_prompt_of_a_cell_in_one_call(e2e):
    """--slots: at batch B one cell of B x units prompts sent together (the engine holds
    B at a time and refills); batch 1 is unchanged."""
    cells = e2e.units("summarization", 8, 3, 16, batch_units=3, slots=True)
    assert len(cells) == 1 and cells[0]["chats"] == e2e.WORKLOADS["summarization"][:24]
    assert cells[0]["batch_size"] == 24  # one generate() for all 24
    assert e2e.units("summarization", 1, 3, 16, slots=True) == e2e.units("summarization", 1, 3, 16)


def test_length_spread_gives_each_prompt_its_own_fixed_max_tokens(e2e):
    """--length-spread: every prompt's max_tokens within the spread around max_tokens, set by
    its place in the workload (the same in every cell shape and configuration), about
    max_tokens on average; 0 leaves one length for all."""
    lengths = e2e.request_lengths(64, 0.25, 0, 32)
    assert all(48 <= n <= 80 for n in lengths) and len(set(lengths)) > 16
    assert abs(sum(lengths) / 32 - 64) < 1.0
    assert e2e.request_lengths(64, 0.25, 8, 8) == lengths[8:16]
    one = e2e.units("summarization", 1, 4, 64, length_spread=0.25)
    eight = e2e.units("summarization", 8, 4, 64, batch_units=2, length_spread=0.25)
    slots = e2e.units("summarization", 8, 4, 64, batch_units=2, slots=True, length_spread=0.25)
    assert [u["max_tokens_each"] for u in one] == [[n] for n in lengths[:4]]
    assert [u["max_tokens_each"] for u in eight] == [lengths[:8], lengths[8:16]]
    assert slots[0]["max_tokens_each"] == lengths[:16]
    assert "max_tokens_each" not in e2e.units("summarization", 8, 4, 64)[0]
    with pytest.raises(ValueError, match="spread"):
        e2e.request_lengths(64, 1.0, 0, 1)


def test_engine_jobs_cap_running_requests_with_slots_and_step_in_process_with_slices(e2e):
    """--slots caps each engine at B running requests (max_num_seqs), --slices runs its
    core in-process; the two combine (slots measured with the drift cancelled)."""
    spec = {"method": "naive", "num_speculative_tokens": 8}
    plain = e2e.engine_job(spec, "float32", 1, 8, None, False)
    assert "max_num_seqs" not in plain and not plain["in_process"]
    assert plain["spec"] == spec and plain["enable_prefix_caching"] is False
    both = e2e.engine_job(None, "float32", 1, 8, 0.3, True)
    assert both["max_num_seqs"] == 8 and both["in_process"] and both["spec"] is None


def _result(seconds, tokens, drafts=0, draft_tokens=0, accepted=0, steps=1):
    return {"seconds": seconds, "output_tokens": tokens, "num_drafts": drafts,
            "num_draft_tokens": draft_tokens, "num_accepted_tokens": accepted, "steps": steps,
            "token_ids": [[1] * tokens], "ttft_s": [0.1], "tpot_s": [0.02]}


def test_merge_recomputes_rates_from_sums(e2e):
    out = e2e.merge([_result(1.0, 10, 2, 8, 4, 5), _result(3.0, 30, 6, 24, 12, 15)])
    assert out["tokens_per_s"] == 10.0
    assert out["mean_acceptance_length"] == 1 + 16 / 8
    assert out["tau"] == 40 / 20  # from the steps, not from the accepted tokens
    assert len(out["token_ids"]) == 2 and out["ttft_s"] == [0.1, 0.1]
    steps = [{**_result(1.0, 2), "step_log": [[0.6, 1, 1], [0.4, 1, 0]]},
             {**_result(0.5, 1), "step_log": [[0.5, 1, 0]]}]
    assert e2e.merge(steps)["step_log"] == [[0.6, 1, 1], [0.4, 1, 0], [0.5, 1, 0]]
    assert e2e.merge([_result(1.0, 10)])["step_log"] == []  # wall-clock cells log no steps


def test_queued_throughput_is_summed_over_units_and_paired_with_nones(e2e):
    units = [{**_result(1.0, 10, 2, 8, 4, 5), "queued_seconds": 0.5, "queued_tokens": 4},
             {**_result(3.0, 30, 6, 24, 12, 15), "queued_seconds": 1.5, "queued_tokens": 16}]
    out = e2e.merge(units)
    assert (out["queued_seconds"], out["queued_tokens"]) == (2.0, 20)
    assert e2e._queued_rate(out) == 10.0
    assert "queued_seconds" not in e2e.merge([_result(1.0, 10, 2, 8, 4, 5)])  # wall clock
    assert e2e._queued_rate(_result(1.0, 10, 2, 8, 4, 5)) is None
    run = {"round": 0, "batch": 8, "workload": "summarization", "config": "a",
           "group": ["none", "a"], "tokens_per_s": 11.0, "base_tokens_per_s": 10.0,
           "ttft_s": [], "base_ttft_s": [], "tpot_s": [], "tau": 1.0,
           "mean_acceptance_length": 1.0, "num_draft_tokens": 0, "num_accepted_tokens": 0,
           "token_ids": [], "base_token_ids": [], "queued_seconds": 2.0,
           "queued_tokens": 24, "base_queued_tokens_per_s": 10.0}
    assert e2e.summarize([run])[0]["queued_speedup"] == pytest.approx(1.2)
    assert e2e.summarize([{**run, "queued_seconds": 0.0}])[0]["queued_speedup"] is None


def test_summary_pairs_each_configuration_with_its_groups_none(e2e):
    def run(rnd, config, group, tps, base_tps, ids=(1, 2)):
        return {"round": rnd, "batch": 1, "workload": "summarization", "config": config,
                "group": group, "tokens_per_s": tps, "base_tokens_per_s": base_tps,
                "ttft_s": [0.2], "base_ttft_s": [0.1], "tpot_s": [0.01], "tau": 2.0,
                "mean_acceptance_length": 2.0, "num_draft_tokens": 4,
                "num_accepted_tokens": 2, "token_ids": [list(ids)],
                "base_token_ids": [[1, 2]]}

    runs = [run(0, "none", ["none", "a"], 10, 10), run(0, "a", ["none", "a"], 15, 10),
            run(0, "none", ["none", "b"], 20, 20), run(0, "b", ["none", "b"], 22, 20, (1, 3)),
            run(1, "a", ["none", "a"], 13, 10)]
    rows = {r["config"]: r for r in e2e.summarize(runs)}
    assert [r["config"] for r in e2e.summarize(runs, ["none", "b", "a"])] == ["none", "b", "a"]
    assert rows["a"]["speedup"] == pytest.approx(1.4)  # median of 1.5 and 1.3
    assert (rows["a"]["speedup_min"], rows["a"]["speedup_max"]) == (1.3, 1.5)
    assert rows["b"]["speedup"] == pytest.approx(1.1)  # against its own group's none
    assert rows["a"]["ttft_ratio"] == pytest.approx(2.0)
    assert (rows["a"]["identical"], rows["b"]["identical"]) == (2, 0)
    assert rows["none"]["speedup"] == 1.0 and rows["none"]["measurements"] == 2


def test_results_written_after_each_group_say_whether_groups_are_left(e2e, tmp_path):
    import json

    run = {"round": 0, "batch": 1, "workload": "summarization", "config": "none",
           "group": ["none"], "tokens_per_s": 10.0, "base_tokens_per_s": 10.0,
           "ttft_s": [0.1], "base_ttft_s": [0.1], "tpot_s": [0.01], "tau": 1.0,
           "mean_acceptance_length": 1.0, "num_draft_tokens": 0, "num_accepted_tokens": 0,
           "token_ids": [[1, 2]], "base_token_ids": [[1, 2]]}
    out = tmp_path / "e2e.json"
    rows = e2e.write_results(out, {"k": 8}, ["none"], [run], [], partial=True)
    data = json.loads(out.read_text())
    assert data["meta"] == {"k": 8, "partial": True} and data["summary"] == rows
    assert "token_ids" not in data["runs"][0] and data["runs"][0]["tokens_per_s"] == 10.0
    e2e.write_results(out, {"k": 8}, ["none"], [run], [], partial=False)
    assert json.loads(out.read_text())["meta"]["partial"] is False


def test_a_reference_joins_every_group_and_pairs_each_configuration(e2e):
    configs = ["none", "a", "b", "c", "ref"]
    groups = e2e.engine_groups(configs, 4, "ref")
    assert groups == [["none", "ref", "a", "c"], ["none", "ref", "b"]]
    with pytest.raises(ValueError, match="engines_at_once must be >= 3"):
        e2e.engine_groups(configs, 2, "ref")
    with pytest.raises(ValueError, match="reference 'x'"):
        e2e.engine_groups(configs, 4, "x")

    def run(config, group, tps, base, ref):
        return {"round": 0, "batch": 1, "workload": "summarization", "config": config,
                "group": group, "tokens_per_s": tps, "base_tokens_per_s": base,
                "ref_tokens_per_s": ref, "ttft_s": [0.1], "base_ttft_s": [0.1],
                "tpot_s": [0.01], "tau": 1.0, "mean_acceptance_length": 1.0,
                "num_draft_tokens": 0, "num_accepted_tokens": 0, "token_ids": [[1]],
                "base_token_ids": [[1]]}

    g1, g2 = groups
    runs = [run("none", g1, 10, 10, 20), run("ref", g1, 20, 10, 20), run("a", g1, 22, 10, 20),
            run("none", g2, 8, 8, 12), run("ref", g2, 12, 8, 12), run("b", g2, 12, 8, 12)]
    rows = {r["config"]: r for r in e2e.summarize(runs)}
    assert rows["a"]["vs_reference"] == pytest.approx(1.1)
    assert rows["b"]["vs_reference"] == pytest.approx(1.0)
    assert rows["ref"]["speedup"] == pytest.approx(1.75)  # median over its two groups
    assert rows["ref"]["measurements"] == 2
    assert "1.10×" in e2e.speedup_table(list(rows.values()), "vs_reference")
    no_reference = {key: v for key, v in runs[2].items() if key != "ref_tokens_per_s"}
    assert e2e.summarize([no_reference])[0]["vs_reference"] is None


def test_ttft_ratio_pairs_requests_prompt_by_prompt(e2e):
    paired = {"ttft_s": [0.2, 0.3], "base_ttft_s": [0.1, 0.3]}
    assert e2e._ttft_ratios(paired) == pytest.approx([2.0, 1.0])
    one_missing = {"ttft_s": [0.2, 0.3, 0.4], "base_ttft_s": [0.1, 0.3]}
    assert e2e._ttft_ratios(one_missing) == pytest.approx([0.3 / 0.2])  # medians
    assert e2e._ttft_ratios({"ttft_s": [], "base_ttft_s": [0.1]}) == []


def test_per_prompt_lengths_need_one_entry_per_prompt():
    from vllm_specext.engine_run import _sampling_params

    cell = {"max_tokens": 16, "max_tokens_each": [5, 11]}
    assert [p.max_tokens for p in _sampling_params(cell, 2)] == [5, 11]
    assert [p.max_tokens for p in _sampling_params({"max_tokens": 16}, 2)] == [16, 16]
    with pytest.raises(ValueError, match="max_tokens_each has 2 entries for 3 prompts"):
        _sampling_params(cell, 3)


def test_configuration_names_may_set_keys_after_a_slash(e2e):
    configs = e2e.configurations(["suffix", "suffix/adaptive_drain=true/adaptive_margin=2"], 8)
    assert configs["suffix"] == {"method": "suffix", "num_speculative_tokens": 8}
    assert configs["suffix/adaptive_drain=true/adaptive_margin=2"] == {
        "method": "suffix", "num_speculative_tokens": 8, "adaptive_drain": True,
        "adaptive_margin": 2}
    with pytest.raises(SystemExit, match="not JSON"):
        e2e.configurations(["suffix/adaptive_drain=yes"], 8)
    with pytest.raises(SystemExit, match="unknown"):
        e2e.configurations(["sufix/adaptive_drain=true"], 8)


def test_the_a_a_control_is_a_second_none_run_only_when_named(e2e):
    configs = e2e.configurations(["naive", e2e.CONTROL], 8)
    assert configs == {"none": None, "naive": {"method": "naive", "num_speculative_tokens": 8},
                       e2e.CONTROL: None}
    assert e2e.CONTROL not in e2e.configurations(None, 8)
    with pytest.raises(SystemExit, match="unknown"):
        e2e.configurations([e2e.CONTROL + "/adaptive=false"], 8)


def test_with_the_control_each_ratio_is_also_paired_with_both_nones(e2e):
    def run(rnd, config, group, tps, base):
        return {"round": rnd, "batch": 32, "workload": "open_chat", "config": config,
                "group": group, "tokens_per_s": tps, "base_tokens_per_s": base,
                "ttft_s": [], "base_ttft_s": [], "tpot_s": [], "tau": 1.0,
                "mean_acceptance_length": 1.0, "num_draft_tokens": 0,
                "num_accepted_tokens": 0, "token_ids": [], "base_token_ids": []}

    with_aa, without = ["none", e2e.CONTROL, "a"], ["none", "b"]
    runs = [run(0, "none", with_aa, 100, 100), run(0, e2e.CONTROL, with_aa, 81, 100),
            run(0, "a", with_aa, 90, 100), run(0, "none", without, 50, 50),
            run(0, "b", without, 49, 50)]
    rows = {r["config"]: r for r in e2e.summarize(runs)}
    assert rows["a"]["speedup"] == pytest.approx(0.9)
    assert rows["a"]["vs_both_nones"] == pytest.approx(1.0)  # 90 / sqrt(100 * 81)
    assert rows[e2e.CONTROL]["vs_both_nones"] == pytest.approx(0.9)  # sqrt(81 / 100)
    assert rows["b"]["vs_both_nones"] is None  # its group ran no control
    assert "1.00×" in e2e.speedup_table(list(rows.values()), "vs_both_nones")


@pytest.mark.parametrize("size", [2, 3, 4, 5])
def test_rounds_start_every_engine_first_once_and_swap_who_follows_whom(e2e, size):
    group = ["none", "a", "b", "c", "d"][:size]
    orders = [e2e.round_order(group, r) for r in range(size)]
    assert orders[0] == group
    assert all(sorted(o) == sorted(group) for o in orders)
    assert sorted(o[0] for o in orders) == sorted(group)  # each engine started first once
    if size > 2:  # who takes its turn right after none: the next engine, then the last
        after = {o[(o.index("none") + 1) % size] for o in orders}
        assert after == {group[1], group[-1]}
