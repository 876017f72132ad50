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

Usage::

    python benchmarks/e2e.py --batch-sizes 32 --slices 0.01 ... --out /tmp/e2e.json
    python benchmarks/step_log.py /tmp/e2e.json [--batch 32]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from e2e import group_key


def aligned_steps(log: list[list[float]], base: list[list[float]]) -> list[int]:
    """Indices ``i >= 1`` at which ``log`` and ``base`` (``[seconds, output tokens,
    requests left]`` per step) record the same output tokens and requests left."""
    return [i for i in range(1, min(len(log), len(base)))
            if log[i][1:] == base[i][1:]]


def compare(runs: list[dict], batch: int | None = None) -> list[dict]:
    """One row per run that has a step log and a ``none`` with one in its group (same
    round, batch, workload and group): ``first`` (its first step's seconds over
    ``none``'s), ``aligned``/``none_steps`` (aligned steps, ``none``'s steps after the
    first), ``aligned_ratio`` (seconds over those steps, over ``none``'s; None without
    any) and ``cell_ratio`` (tok/s over ``none``'s)."""
    nones = {group_key(r): r for r in runs if r["config"] == "none" and r.get("step_log")}
    rows = []
    for r in runs:
        base = nones.get(group_key(r))
        if (r["config"] == "none" or base is None or not r.get("step_log")
                or (batch is not None and r["batch"] != batch)):
            continue
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
    args = ap.parse_args(argv)
    rows = [row for path in args.results  # each file's runs paired among themselves
            for row in compare(json.loads(path.read_text())["runs"], args.batch)]
    if not rows:
        print("no step logs: run e2e.py with --slices", file=sys.stderr)
        return 1
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
