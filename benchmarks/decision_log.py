"""Sum up decision logs of the adaptive rule (``VLLM_SPECEXT_DECISION_LOG``).

Each drafting worker started with ``VLLM_SPECEXT_DECISION_LOG=<prefix>`` writes one line
per engine step (:mod:`vllm_specext.integration.decision_log`). This script cuts a log
into runs at its marks (the e2e benchmark marks its warm-up and each cell; the steps
before the first mark are the engine's start-up), groups each run's decode steps by how
many requests decoded (powers of two) and reports, per group:
steps, steps that showed drafts (and how many of those were explorations), draft tokens
offered and shown, accepted draft tokens (read from the next line's committed tokens),
and the median timed plain and verified step in milliseconds.

Usage::

    VLLM_SPECEXT_DECISION_LOG=/tmp/dl python benchmarks/e2e.py --batch-sizes 32 ...
    python benchmarks/decision_log.py /tmp/dl.*.jsonl [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path


def rows_bucket(rows: int) -> str:
    """The group of a step with ``rows`` decoding requests: ``"1"``, ``"2-3"``, ``"4-7"``…"""
    lo = 1 << (rows.bit_length() - 1)
    return str(lo) if lo == 1 else f"{lo}-{2 * lo - 1}"


def runs(lines: list[dict]) -> list[tuple[str, list[dict]]]:
    """``lines`` cut at their marks: ``[(label, step lines)]`` in file order, the steps
    before the first mark labelled ``"start-up"``; runs without steps are left out."""
    out: list[tuple[str, list[dict]]] = [("start-up", [])]
    for line in lines:
        if "mark" in line:
            out.append((line["mark"], []))
        else:
            out[-1][1].append(line)
    return [(label, steps) for label, steps in out if steps]


def summarize(lines: list[dict]) -> dict[str, dict]:
    """Per rows group (see module doc) of one log's lines, in file order.

    Returns:
        ``{group: {"steps", "shown_steps", "explorations", "offered", "shown",
        "accepted", "plain_ms", "verified_ms"}}``; the two times are medians of the
        timed steps of that group (None when there is none).
    """
    groups: dict[str, dict] = {}
    times: dict[tuple[str, bool], list[float]] = {}
    for line, after in zip(lines, lines[1:] + [None]):
        if line["rows"] <= 0:
            continue
        g = groups.setdefault(rows_bucket(line["rows"]), dict.fromkeys(
            ("steps", "shown_steps", "explorations", "offered", "shown", "accepted"), 0))
        g["steps"] += 1
        g["offered"] += line["offered"]
        if line["shown"]:
            g["shown_steps"] += 1
            g["explorations"] += bool(line["exploring"])
            g["shown"] += line["shown"]
            if after is not None:
                g["accepted"] += after["committed"] - after["rows"]
        if after is not None and after["timed"] is not None and after["rows"] == line["rows"]:
            tokens, ms, verified = after["timed"]
            times.setdefault((rows_bucket(line["rows"]), bool(verified)), []).append(ms)
    for name, g in groups.items():
        for verified, key in ((False, "plain_ms"), (True, "verified_ms")):
            t = times.get((name, verified))
            g[key] = round(statistics.median(t), 2) if t else None
    return dict(sorted(groups.items(), key=lambda kv: int(kv[0].split("-")[0])))


def table(name: str, groups: dict[str, dict]) -> str:
    """A Markdown table of :func:`summarize`'s result for one log."""
    head = ("| rows | steps | with drafts (explorations) | offered | shown | accepted "
            "| plain ms | verified ms |")
    out = [f"### {name}", "", head, "|" + "---|" * 8]
    for rows, g in groups.items():
        out.append(f"| {rows} | {g['steps']} | {g['shown_steps']} ({g['explorations']}) | "
                   f"{g['offered']} | {g['shown']} | {g['accepted']} | {g['plain_ms']} | "
                   f"{g['verified_ms']} |")
    return "\n".join(out)


def read_log(path: str) -> list[dict]:
    """A log's lines, in file order; a line that is not JSON (the last one of an engine
    killed mid-write) is skipped with a note on stderr.

    Raises:
        OSError: the file cannot be read.
    """
    lines = []
    for number, text in enumerate(Path(path).read_text().splitlines(), 1):
        if text.strip():
            try:
                lines.append(json.loads(text))
            except json.JSONDecodeError:
                print(f"{path}:{number}: not a JSON line, skipped", file=sys.stderr)
    return lines


def read_logs(paths: list[str],
              ap: argparse.ArgumentParser) -> Iterator[tuple[str, list[dict]]]:
    """``(path, lines)`` of each log (:func:`read_log`), in order; a file that cannot be
    read is a usage error of ``ap`` (it exits)."""
    for path in paths:
        try:
            lines = read_log(path)
        except OSError as err:
            ap.error(f"cannot read {path}: {err.strerror or err}")
        yield path, lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("logs", nargs="+", help="decision-log files (*.jsonl)")
    ap.add_argument("--json", help="also write the summaries to this JSON file")
    args = ap.parse_args(argv)
    result = {}
    for path, lines in read_logs(args.logs, ap):
        result[path] = {}
        for label, steps in runs(lines):
            result[path][label] = summarize(steps)
            print(table(f"{Path(path).name}: {label} ({len(steps)} steps)",
                        result[path][label]) + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
