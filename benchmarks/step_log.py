"""Compare time-sliced e2e cells with their group's ``none``, step by step.

``python benchmarks/e2e.py --slices S ...`` keeps each cell's per-step log (engine
seconds, output tokens, requests left after the step). Engines of one group ran the same
requests, so a configuration that drafts nothing runs ``none``'s schedule step for step,
and a drafter runs it until its drafts change which requests are left. This script splits
each cell's time against its group's ``none`` into:

* the first step (at batch B > 1 the batch's prefill or its first chunk: a single step
  that no interleaving spreads out, 17-28% of a batch-32 open-chat or code-generation
  cell on the project's CPU VMs),
* the *aligned* later steps: those at the same place in both logs with the same output
  tokens and requests left, so the same work (what a configuration's own step costs,
  whatever it saves in steps; a step whose drafts were all rejected counts, with what
  verifying them cost), with the number of such steps among those of ``none``,
* the whole cell (the benchmark's tok/s ratio).

Reads one or more e2e JSON files (``--out`` of ``e2e.py``; each file's runs are paired
among themselves) and prints a markdown table; ``--batch`` keeps one batch size.

``--phases`` (runs made with ``e2e.py --phase-times``) prints instead, per run, what its
aligned steps that verified no draft (in either engine) took more than ``none``'s, in ms
per step, phase by phase (:mod:`vllm_specext.phase_times`): the model (forward pass and
output projection), which does the same work in both engines on such a step (its
difference is the machine's noise), and the rest of the step (state updates, input
preparation, sampling, the drafter's ``propose``, the engine's own work), which is what
the speculative path costs a step that drafts nothing. Steps that verified drafts are
left to the cell ratio: what they cost is what the adaptive rule chose to pay.

``--account`` (also runs made with ``--phase-times``) prints instead, per run, where its
cell's time over ``none``'s went, each part as a share of ``none``'s cell time and
summing to the whole difference: the first step, the excess of its later steps that
verified no draft and of those that verified drafts (each step against ``none``'s mean
step with as many unfinished requests, the work such a step does), less the time of the
steps its drafts saved (``none``'s later steps against those same means over the run's
own schedule).

Usage::

    python benchmarks/e2e.py --batch-sizes 32 --slices 0.01 [--phase-times] ... --out /tmp/e2e.json
    python benchmarks/step_log.py /tmp/e2e.json [--batch 32] [--phases | --account]
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path

from e2e import group_key


def aligned_steps(log: list[list[float]], base: list[list[float]]) -> list[int]:
    """Indices ``i >= 1`` at which ``log`` and ``base`` (``[seconds, output tokens,
    requests left, (phase seconds)]`` per step) record the same output tokens and
    requests left."""
    return [i for i in range(1, min(len(log), len(base)))
            if log[i][1:3] == base[i][1:3]]


def _paired(runs: list[dict], batch: int | None) -> Iterator[tuple[dict, dict]]:
    """``(run, its group's none)`` for each run other than ``none`` that has a step log,
    as has that ``none`` (only batch ``batch`` when given)."""
    nones = {group_key(r): r for r in runs if r["config"] == "none" and r.get("step_log")}
    for r in runs:
        base = nones.get(group_key(r))
        if (r["config"] != "none" and base is not None and r.get("step_log")
                and (batch is None or r["batch"] == batch)):
            yield r, base


def compare(runs: list[dict], batch: int | None = None) -> list[dict]:
    """One row per run that has a step log and a ``none`` with one in its group (same
    round, batch, workload and group): ``first`` (its first step's seconds over
    ``none``'s), ``aligned``/``none_steps`` (aligned steps, ``none``'s steps after the
    first), ``aligned_ratio`` (seconds over those steps, over ``none``'s; None without
    any) and ``cell_ratio`` (tok/s over ``none``'s)."""
    rows = []
    for r, base in _paired(runs, batch):
        log, ref = r["step_log"], base["step_log"]
        same = aligned_steps(log, ref)
        rows.append({
            "round": r["round"], "batch": r["batch"], "workload": r["workload"],
            "config": r["config"], "first": log[0][0] / ref[0][0],
            "aligned": len(same), "none_steps": len(ref) - 1,
            "aligned_ratio": (sum(log[i][0] for i in same) / sum(ref[i][0] for i in same)
                              if same else None),
            "cell_ratio": r["tokens_per_s"] / base["tokens_per_s"]})
    return rows


def _model(entry: list) -> float:
    """Seconds of one step-log entry's model work: forward pass and output projection."""
    return entry[3].get("_model_forward", 0.0) + entry[3].get("compute_logits", 0.0)


#: columns of the --phases table: (heading, seconds of one step-log entry)
PHASE_COLUMNS = (
    ("step", lambda e: e[0]),
    ("model", _model),
    ("rest of step", lambda e: e[0] - _model(e)),
    ("prepare inputs", lambda e: e[3].get("_prepare_inputs", 0.0)),
    ("sampling", lambda e: e[3].get("sample_tokens", 0.0) - e[3].get("propose", 0.0)),
    ("propose", lambda e: e[3].get("propose", 0.0)),
)


def _drafted(entry: list) -> bool:
    """Whether a step-log entry (with phase times) verified any draft token."""
    return bool(entry[3].get("draft_tokens"))


def phase_deltas(runs: list[dict], batch: int | None = None) -> list[dict]:
    """One row per run whose step log has phase times and a ``none`` with them in its
    group: ``aligned`` steps (:func:`aligned_steps` at which neither engine verified a
    draft), ``none_ms`` (``none``'s mean step over them, ms) and ``deltas``: ``{column of
    PHASE_COLUMNS: mean ms per such step over none's}``."""
    rows = []
    for r, base in _paired(runs, batch):
        log, ref = r["step_log"], base["step_log"]
        same = [i for i in aligned_steps(log, ref) if len(log[i]) > 3 and len(ref[i]) > 3
                and not _drafted(log[i]) and not _drafted(ref[i])]
        if not same:
            continue
        rows.append({
            "round": r["round"], "batch": r["batch"], "workload": r["workload"],
            "config": r["config"], "aligned": len(same),
            "none_ms": 1e3 * sum(ref[i][0] for i in same) / len(same),
            "deltas": {name: 1e3 * sum(f(log[i]) - f(ref[i]) for i in same) / len(same)
                       for name, f in PHASE_COLUMNS}})
    return rows


def phase_table(rows: list[dict]) -> str:
    """Markdown: one line per row of :func:`phase_deltas`, ms per undrafted aligned step
    over ``none``'s (and the rest of the step as a share of ``none``'s step)."""
    names = [name for name, _ in PHASE_COLUMNS]
    lines = ["| round | batch | workload | config | undrafted aligned steps | none step ms | "
             + " | ".join(f"{n} +ms" for n in names) + " | rest × none step |",
             "|---:|---:|---|---|---:|---:|" + "---:|" * (len(names) + 1)]
    for r in sorted(rows, key=lambda r: (r["batch"], r["workload"], r["config"], r["round"])):
        d = r["deltas"]
        lines.append(f"| {r['round']} | {r['batch']} | {r['workload']} | {r['config']} | "
                     f"{r['aligned']} | {r['none_ms']:.1f} | "
                     + " | ".join(f"{d[n]:+.2f}" for n in names)
                     + f" | {d['rest of step'] / r['none_ms']:+.2%} |")
    return "\n".join(lines)


def account(runs: list[dict], batch: int | None = None) -> list[dict]:
    """One row per run whose step log has phase times and a ``none`` with a step log in its
    group: where the run's cell time over ``none``'s went, as shares of ``none``'s cell
    time (module docstring), ``first + undrafted + drafted - saved`` being the whole
    difference. Step ``i >= 1`` of either log is priced at ``none``'s mean later step with
    the same number of unfinished requests before it (the nearest such number ``none``
    ran when it ran no step with as many).

    Returns:
        ``[{"round", "batch", "workload", "config", "cell_ratio" (tok/s over none's),
        "first", "undrafted", "drafted", "saved" (shares, floats), "drafted_steps",
        "draft_tokens" (ints)}]``.
    """
    rows = []
    for r, base in _paired(runs, batch):
        log, ref = r["step_log"], base["step_log"]
        if len(ref) < 2 or not all(len(e) > 3 for e in log):
            continue
        seconds: dict[int, list[float]] = {}
        for before, step in zip(ref, ref[1:]):
            seconds.setdefault(before[2], []).append(step[0])
        mean = {n: sum(v) / len(v) for n, v in seconds.items()}

        def price(unfinished: int) -> float:
            return mean[min(mean, key=lambda n: (abs(n - unfinished), n))]

        total = sum(e[0] for e in ref)
        parts = {"undrafted": 0.0, "drafted": 0.0}
        for before, step in zip(log, log[1:]):
            parts["drafted" if _drafted(step) else "undrafted"] += step[0] - price(before[2])
        saved = (sum(e[0] for e in ref[1:])
                 - sum(price(before[2]) for before in log[:-1]))
        rows.append({
            "round": r["round"], "batch": r["batch"], "workload": r["workload"],
            "config": r["config"], "cell_ratio": r["tokens_per_s"] / base["tokens_per_s"],
            "first": (log[0][0] - ref[0][0]) / total,
            **{k: v / total for k, v in parts.items()}, "saved": saved / total,
            "drafted_steps": sum(1 for e in log[1:] if _drafted(e)),
            "draft_tokens": int(sum(e[3].get("draft_tokens", 0) for e in log[1:]))})
    return rows


def account_table(rows: list[dict]) -> str:
    """Markdown: one line per row of :func:`account`, shares of ``none``'s cell time."""
    lines = ["| round | batch | workload | config | tok/s × none | first step | undrafted "
             "steps' excess | drafted steps' excess (steps, draft tokens) | steps saved |",
             "|---:|---:|---|---|---:|---:|---:|---:|---:|"]
    for r in sorted(rows, key=lambda r: (r["batch"], r["workload"], r["config"], r["round"])):
        lines.append(f"| {r['round']} | {r['batch']} | {r['workload']} | {r['config']} | "
                     f"{r['cell_ratio']:.3f} | {r['first']:+.2%} | {r['undrafted']:+.2%} | "
                     f"{r['drafted']:+.2%} ({r['drafted_steps']}, {r['draft_tokens']}) | "
                     f"{r['saved']:+.2%} |")
    return "\n".join(lines)


def table(rows: list[dict]) -> str:
    """Markdown: one line per row of :func:`compare`, times as ratios to ``none``."""
    lines = ["| round | batch | workload | config | first step × none | aligned steps | "
             "their time × none | tok/s × none |", "|---:|---:|---|---|---:|---:|---:|---:|"]
    for r in sorted(rows, key=lambda r: (r["batch"], r["workload"], r["config"], r["round"])):
        aligned = "–" if r["aligned_ratio"] is None else f"{r['aligned_ratio']:.3f}"
        lines.append(f"| {r['round']} | {r['batch']} | {r['workload']} | {r['config']} | "
                     f"{r['first']:.3f} | {r['aligned']}/{r['none_steps']} | {aligned} | "
                     f"{r['cell_ratio']:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", type=Path, nargs="+", help="e2e.py JSON files")
    ap.add_argument("--batch", type=int, help="only this batch size")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--phases", action="store_true",
                      help="aligned steps' phases over none's (runs of e2e.py --phase-times)")
    mode.add_argument("--account", action="store_true",
                      help="each cell's time over none's: first step, undrafted and drafted "
                      "steps' excess, steps saved (runs of e2e.py --phase-times)")
    args = ap.parse_args(argv)
    pair, show, need = (
        (phase_deltas, phase_table, "--slices --phase-times") if args.phases else
        (account, account_table, "--slices --phase-times") if args.account else
        (compare, table, "--slices"))
    rows = [row for path in args.results  # each file's runs paired among themselves
            for row in pair(json.loads(path.read_text())["runs"], args.batch)]
    if not rows:
        print(f"no step logs: run e2e.py with {need}", file=sys.stderr)
        return 1
    print(show(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
