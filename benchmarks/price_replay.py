"""How well the cost model priced a logged engine's steps: decision logs replayed offline.

A decision log (``VLLM_SPECEXT_DECISION_LOG``, :mod:`vllm_specext.integration.decision_log`)
keeps every timed step of an engine as ``[tokens, milliseconds, verified]`` with the rows
that decoded in it. This script feeds those steps, in order, to a fresh
:class:`vllm_specext.adaptive.StepCostModel` of the code it runs with (margin 1.5, the
engine's default) and, before each step, asks it what that step would cost: ``P(rows)``
for a plain step in which every row decoded, ``V(tokens)`` for a verified one. Per run of
the log (its marks: the e2e benchmark's warm-up and cells) it reports, for the steps of at
least ``--min-rows`` rows, the price's mean relative error (``price / measured - 1``; > 0:
priced too dear, and for ``P`` drafts then look too cheap), the same over the run's first
``--first`` such steps (where a new batch meets the previous batch's prices), and the
median threshold :meth:`~vllm_specext.adaptive.StepCostModel.threshold` gives the drafts
each step offered. So a change to the cost model can be judged on real engine timings
without running the engine again: run this on one log with the old code and the new.

The replay sees only the timed steps: calls the engine's adaptive rule made in between
(plain probes that re-measure a group, explorations) are not repeated, so its prices can
differ a little from the ``plain_ms`` and ``threshold`` the log recorded.

Usage::

    python benchmarks/price_replay.py /tmp/dl/b32.*.jsonl [--min-rows 16] [--first 10]
        [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from decision_log import read_log, runs

from vllm_specext.adaptive import StepCostModel

MARGIN = 1.5  # the engine's default adaptive_margin


def replay(lines: list[dict], min_rows: int = 16, first: int = 10) -> dict[str, dict]:
    """Replay one log's timed steps through a fresh :class:`StepCostModel`.

    Args:
        lines: the log's lines in file order (marks included).
        min_rows: only steps that decoded at least this many rows are scored.
        first: steps (of each kind) scored separately at the start of each run.

    Returns:
        ``{run label: {"plain": stats, "verified": stats, "threshold": median or None}}``
        in log order, each ``stats`` ``{"steps", "mean_error", "first_error"}``
        (relative errors, rounded to 4 places; None without steps).
    """
    model = StepCostModel(margin=MARGIN)
    out: dict[str, dict] = {}
    for label, steps in runs(lines):
        label = next(name for n in range(1, len(out) + 2)  # a label seen before: numbered
                     if (name := label if n == 1 else f"{label} ({n})") not in out)
        errors: dict[bool, list[float]] = {False: [], True: []}
        thresholds = []
        for line in steps:
            timed, rows = line["timed"], line["rows"]
            if timed is not None:
                tokens, ms, verified = timed
                if rows >= min_rows and ms > 0 and (verified or tokens == rows):
                    price = model.step_time(tokens, bool(verified))
                    if price > 0:
                        errors[bool(verified)].append(1e3 * price / ms - 1)
                model.observe(tokens, ms / 1e3, bool(verified), rows)
            if rows >= min_rows and line["offered"]:
                thresholds.append(model.threshold(rows, line["offered"]))
        out[label] = {kind: _stats(errors[verified], first)
                      for kind, verified in (("plain", False), ("verified", True))}
        out[label]["threshold"] = (round(statistics.median(thresholds), 4)
                                   if thresholds else None)
    return out


def _stats(errors: list[float], first: int) -> dict:
    def mean(xs):
        return round(statistics.fmean(xs), 4) if xs else None
    return {"steps": len(errors), "mean_error": mean(errors),
            "first_error": mean(errors[:first])}


def table(name: str, result: dict[str, dict], first: int) -> str:
    """A Markdown table of :func:`replay`'s result for one log."""
    out = [f"### {name}", "", "| run | plain steps | P error | P error, first "
           f"{first} | verified steps | V error | V error, first {first} | median "
           "threshold |", "|" + "---|" * 8]
    for label, r in result.items():
        p, v = r["plain"], r["verified"]
        out.append(f"| {label} | {p['steps']} | {p['mean_error']} | {p['first_error']} | "
                   f"{v['steps']} | {v['mean_error']} | {v['first_error']} | "
                   f"{r['threshold']} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("logs", nargs="+", help="decision-log files (*.jsonl)")
    ap.add_argument("--min-rows", type=int, default=16,
                    help="score steps that decoded at least this many rows (>= 1)")
    ap.add_argument("--first", type=int, default=10,
                    help="steps of each kind scored apart at each run's start (>= 1)")
    ap.add_argument("--json", help="also write the results to this JSON file")
    args = ap.parse_args(argv)
    if args.min_rows < 1 or args.first < 1:
        ap.error("--min-rows and --first must be >= 1")
    result = {}
    for path in args.logs:
        try:
            lines = read_log(path)
        except OSError as err:
            ap.error(f"cannot read {path}: {err.strerror or err}")
        result[path] = replay(lines, args.min_rows, args.first)
        print(table(Path(path).name, result[path], args.first) + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
