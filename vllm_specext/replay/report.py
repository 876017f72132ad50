"""Replay output: ``replay.json``, ``replay.csv``, PNG plots, a text table and recommendations.

Files written by :func:`write_report` into the output directory:

- ``replay.json``: ``{"meta": ..., "rows": [...], "recommendations": [...]}``;
- ``replay.csv``: the rows, ``acceptance_by_position`` joined with ``;``;
- ``tau_by_category.png``: tau per category per configuration (oracle bound as a marker);
- ``acceptance_by_position.png``: vLLM's per-position acceptance (category ALL);
- ``latency_vs_context.png``: median proposer µs per step against context length.
"""
from __future__ import annotations

import csv
import json
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from vllm_specext.replay.runner import ALL, ReplayRun

logger = logging.getLogger(__name__)

TABLE_COLUMNS = [("file", "file"), ("category", "category"), ("label", "config"),
                 ("tau", "tau"), ("oracle_tau", "oracle"), ("acceptance_rate", "acc"),
                 ("mean_acceptance_length", "mal"), ("wasted_per_step", "waste/step"),
                 ("proposer_us_median", "us_med"), ("proposer_us_p99", "us_p99"),
                 ("proposer_us_per_token", "us/tok"), ("state_bytes_peak", "state_B"),
                 ("modelled_speedup", "speedup")]


def recommend(rows: Sequence[dict]) -> list[dict]:
    """Best configuration per (file, category): highest modelled speedup, then tau.

    Returns:
        Dicts with ``file``, ``category``, ``method``, ``params``, ``k``, ``label``,
        ``modelled_speedup``, ``tau``, ``oracle_tau``.
    """
    best: dict[tuple[str, str], dict] = {}
    for row in rows:
        key = (row["file"], row["category"])
        score = (row["modelled_speedup"] or 0.0, row["tau"] or 0.0)
        cur = best.get(key)
        if cur is None or score > (cur["modelled_speedup"] or 0.0, cur["tau"] or 0.0):
            best[key] = row
    fields = ("file", "category", "method", "params", "k", "label", "modelled_speedup",
              "tau", "oracle_tau")
    return [{f: best[key][f] for f in fields} for key in best]


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def format_table(rows: Sequence[dict], columns=TABLE_COLUMNS) -> str:
    """A Markdown table of ``rows`` with the main metrics."""
    lines = ["| " + " | ".join(h for _, h in columns) + " |",
             "|" + "|".join("---" if i < 3 else "---:" for i in range(len(columns))) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(_fmt(row.get(k)) for k, _ in columns) + " |")
    return "\n".join(lines)


def format_recommendations(recs: Sequence[dict]) -> str:
    """One line per (file, category): the best configuration and its numbers."""
    return "\n".join(
        f"{r['file']} [{r['category']}]: {r['label']}  speedup {_fmt(r['modelled_speedup'])}x, "
        f"tau {_fmt(r['tau'])} (oracle {_fmt(r['oracle_tau'])})" for r in recs)


def write_report(run: ReplayRun, out_dir: str | Path, meta: dict) -> list[Path]:
    """Write JSON, CSV and the three PNG plots (skipped with a warning when matplotlib
    is not installed); returns the paths written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "replay.json", out / "replay.csv"]
    paths[0].write_text(json.dumps({"meta": meta, "rows": run.rows,
                                    "recommendations": recommend(run.rows)}, indent=1))
    keys = [k for k in run.rows[0] if k != "acceptance_by_position"] if run.rows else []
    with open(paths[1], "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(keys + ["acceptance_by_position"])
        for row in run.rows:
            writer.writerow([json.dumps(row[k]) if isinstance(row[k], (dict, list)) else row[k]
                             for k in keys]
                            + [";".join(_fmt(v) for v in row["acceptance_by_position"])])
    try:
        paths += plot_all(run, out)
    except ImportError:
        logger.warning("matplotlib is not installed: no PNG plots (pip install matplotlib)")
    return paths


def plot_all(run: ReplayRun, out: Path) -> list[Path]:
    """Draw the three PNG plots (matplotlib, Agg backend) into ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = sorted({r["file"] for r in run.rows})
    labels = list(dict.fromkeys(r["label"] for r in run.rows))
    paths = [out / "tau_by_category.png", out / "acceptance_by_position.png",
             out / "latency_vs_context.png"]

    fig, axes = plt.subplots(len(files), 1, figsize=(max(8, 1.2 * _max_cats(run, files)),
                                                     3.6 * len(files)), squeeze=False)
    for ax, fname in zip(axes[:, 0], files):
        rows = [r for r in run.rows if r["file"] == fname]
        cats = list(dict.fromkeys(r["category"] for r in rows))
        width = 0.8 / max(1, len(labels))
        for j, label in enumerate(labels):
            tau = {r["category"]: r["tau"] or 0.0 for r in rows if r["label"] == label}
            ax.bar(np.arange(len(cats)) + j * width, [tau.get(c, 0.0) for c in cats], width,
                   label=label)
        oracle = {c: max(r["oracle_tau"] or 0.0 for r in rows if r["category"] == c)
                  for c in cats}
        ax.scatter(np.arange(len(cats)) + 0.4 - width / 2, [oracle[c] for c in cats],
                   marker="_", s=400, color="black", label="retrieval oracle (largest k)",
                   zorder=3)
        ax.set_xticks(np.arange(len(cats)) + 0.4 - width / 2, cats, rotation=30, ha="right")
        ax.set_ylabel("tau (tokens / step)")
        ax.set_title(fname)
    handles, names = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", bbox_to_anchor=(0.5, 1.0),
               ncol=min(4, len(names)), fontsize=8)
    _save(fig, paths[0])

    fig, axes = _grid(plt, len(files))
    for ax, fname in zip(axes, files):
        for r in run.rows:
            if r["file"] == fname and r["category"] == ALL and r["drafted_steps"]:
                acc = r["acceptance_by_position"]
                ax.plot(np.arange(1, len(acc) + 1), acc, marker="o", ms=3, label=r["label"])
        ax.set_xlabel("draft position")
        ax.set_ylabel("accepted / drafted steps")
        ax.set_ylim(0, 1)
        ax.set_title(fname, fontsize=9)
        _legend(ax)
    _save(fig, paths[1])

    fig, axes = _grid(plt, len(files))
    for ax, fname in zip(axes, files):
        for label in labels:
            ctx, us = run.latency.get((fname, label), (np.zeros(0), np.zeros(0)))
            centers, med = _binned_median(ctx, us)
            if len(centers):
                ax.plot(centers, med, marker=".", label=label)
        ax.set_xscale("log")
        ax.set_xlabel("context tokens")
        ax.set_ylabel("proposer µs / step (median)")
        ax.set_title(fname, fontsize=9)
        _legend(ax)
    _save(fig, paths[2])
    return paths


def _grid(plt, n: int, cols: int = 3):
    """A figure with ``n`` axes in rows of ``cols``; unused cells are hidden."""
    cols = max(1, min(cols, n))
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 4 * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def _legend(ax) -> None:
    """A legend, or a note when nothing was drawn (e.g. only methods that never draft)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no drafts", ha="center", va="center", transform=ax.transAxes)


def _max_cats(run: ReplayRun, files: list[str]) -> int:
    return max((len({r["category"] for r in run.rows if r["file"] == f}) for f in files), default=1)


def _binned_median(ctx: np.ndarray, us: np.ndarray, bins: int = 20):
    """Median of ``us`` in log-spaced bins of ``ctx`` (bins with data only)."""
    if len(ctx) == 0:
        return np.zeros(0), np.zeros(0)
    edges = np.unique(np.geomspace(max(1, ctx.min()), max(2, ctx.max() + 1), bins + 1).astype(int))
    which = np.clip(np.searchsorted(edges, ctx, side="right") - 1, 0, len(edges) - 2)
    centers, med = [], []
    for b in range(len(edges) - 1):
        sel = us[which == b]
        if len(sel):
            centers.append(np.sqrt(edges[b] * edges[b + 1]))
            med.append(np.median(sel))
    return np.array(centers), np.array(med)


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
