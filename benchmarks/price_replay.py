"""How well the cost model priced a logged engine's steps: decision logs replayed offline.

A decision log (``VLLM_SPECEXT_DECISION_LOG``, :mod:`vllm_specext.integration.decision_log`)
keeps every timed step of an engine as ``[tokens, milliseconds, verified]`` with the rows
that decoded in it. This script feeds those steps, in order, to a fresh
:class:`vllm_specext.adaptive.StepCostModel` of the code it imports (``--margin`` and
``--verified-scale`` as the engine's ``adaptive_margin`` and ``adaptive_verified_scale``)
and, before each step, asks it what that step would cost: ``P(rows)`` for a plain step in
which every row decoded, ``V(tokens)`` for a verified one. Per run of the log (its marks:
the e2e benchmark's warm-up and each cell) it reports, for the steps of at least
``--min-rows`` rows, the price's mean relative error (``price / measured - 1``; > 0: priced
too dear, and for ``P`` drafts then look too cheap) and mean absolute relative error, the
mean error over the run's first ``--first`` such steps (where a new batch meets the
previous batch's prices), and the median threshold
:meth:`~vllm_specext.adaptive.StepCostModel.threshold` gives the drafts each step offered.
An engine's start-up and warm-up runs read large errors: its first steps are slow.

So a change to the cost model can be judged on real engine timings without running the
engine again: run this once with the old code and once with the new, each imported from
its own copy (``git worktree add /tmp/old <commit>``, then ``PYTHONPATH=/tmp/old python
/tmp/old/benchmarks/price_replay.py LOGS``); the first line printed names the code used.

The replay sees only the timed steps: calls the engine's adaptive rule made in between
(plain probes that re-measure a group, explorations) are not repeated, so its prices can
differ a little from the ``plain_ms`` and ``threshold`` the log recorded.

Usage::

    python benchmarks/price_replay.py /tmp/dl/b32.*.jsonl [--min-rows 16] [--first 10]
        [--margin 1.5] [--verified-scale 3] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from decision_log import read_logs, runs

import vllm_specext
from vllm_specext.adaptive import StepCostModel


def replay(lines: list[dict], min_rows: int = 16, first: int = 10, margin: float = 1.5,
           verified_scale: int = 3) -> dict[str, dict]:
    """Replay one log's timed steps through a fresh :class:`StepCostModel`.

    Args:
        lines: the log's lines in file order (marks included).
        min_rows: only steps that decoded at least this many rows are scored.
        first: the first scored steps of each kind in each run, also scored apart.
        margin, verified_scale: the cost model's (the engine's ``adaptive_margin``,
            default 1.5, and ``adaptive_verified_scale``, default 3).

    Returns:
        ``{run label: {"plain": stats, "verified": stats, "threshold": median or None}}``
        in log order, a label seen before numbered (``"cell (2)"``), each ``stats``
        ``{"steps", "mean_error", "mean_abs_error", "first_error"}`` (relative errors,
        rounded to 4 places; None without steps).

    Raises:
        ValueError: ``margin`` or ``verified_scale`` outside the cost model's range.
    """
    model = StepCostModel(margin=margin, verified_scale=verified_scale)
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
            "mean_abs_error": mean([abs(e) for e in errors]),
            "first_error": mean(errors[:first])}


def table(name: str, result: dict[str, dict], first: int) -> str:
    """A Markdown table of :func:`replay`'s result for one log."""
    if not any(r["plain"]["steps"] or r["verified"]["steps"] for r in result.values()):
        return f"### {name}\n\nno timed decode steps of that many rows"
    out = [f"### {name}", "", "| run | plain steps | P error | P abs. error | P error, "
           f"first {first} | verified steps | V error | V abs. error | V error, first "
           f"{first} | median threshold |", "|" + "---|" * 10]
    for label, r in result.items():
        cells = [label] + [r[kind][key] for kind in ("plain", "verified") for key in (
            "steps", "mean_error", "mean_abs_error", "first_error")] + [r["threshold"]]
        out.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("logs", nargs="+", help="decision-log files (*.jsonl)")
    ap.add_argument("--min-rows", type=int, default=16,
                    help="score steps that decoded at least this many rows (>= 1)")
    ap.add_argument("--first", type=int, default=10,
                    help="the first scored steps of each kind in each run, also "
                    "scored apart (>= 1)")
    ap.add_argument("--margin", type=float, default=1.5,
                    help="the engine's adaptive_margin (sets the thresholds; >= 1)")
    ap.add_argument("--verified-scale", type=int, default=3,
                    help="the engine's adaptive_verified_scale (>= 0)")
    ap.add_argument("--json", help="also write the results to this JSON file")
    args = ap.parse_args(argv)
    if args.min_rows < 1 or args.first < 1:
        ap.error("--min-rows and --first must be >= 1")
    try:
        StepCostModel(margin=args.margin, verified_scale=args.verified_scale)
    except ValueError as err:
        ap.error(str(err))
    print(f"cost model of {Path(vllm_specext.__file__).parent}\n")
    result = {}
    for path, lines in read_logs(args.logs, ap):
        result[path] = replay(lines, args.min_rows, args.first, args.margin,
                              args.verified_scale)
        print(table(Path(path).name, result[path], args.first) + "\n")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
