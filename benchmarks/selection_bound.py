"""How far could choosing among proposers go? The per-step selection oracle on real traces.

Each candidate proposer is probed at *every* output position of each trace file
(:func:`vllm_specext.replay.simulate.accept_lengths`: requests in file order, state kept
across requests, one true token fed per position), which gives ``a_c[g]``, the tokens its
draft at position ``g`` would have had accepted. A set ``S`` of candidates is then
replayed teacher-forced as if, at every step, a selector with hindsight drafted the
candidate whose draft is accepted furthest: a step at ``g`` emits
``max_{c in S} a_c[g]`` tokens plus the bonus token
(:func:`vllm_specext.replay.oracle.oracle_steps` on the element-wise maximum). For a
single candidate this is its own tau, probed (within about 1% of
:func:`~vllm_specext.replay.simulate.replay`'s, since the candidate's statistics see
one-token steps).

So the union's tau bounds any proposer that picks, step by step, one of these candidates'
drafts (learned weights, confidence rules, voting between them): a target above it needs
draft tokens that no candidate offers, not a better choice between them.

Candidates: our methods at their defaults (``--methods``), PIA's reference trie at its
example defaults (``--pia``, as in ``memory_vs_pia.py``) and ArcticInference's suffix
cache at vLLM's defaults (``--arctic``, as in ``suffix_vs_arctic.py``; needs
``arctic-inference``).

Usage::

    python benchmarks/selection_bound.py [--files llma_cnndm.jsonl ...] [--k 8] [--limit N]
        [--methods memory_decoding,suffix] [--arctic]
        [--pia <PIA>/lookahead/lookahead/common/lookahead_cache.py] [--out benchmarks/results/selection_bound.json]

Writes the JSON and a PNG beside it (``.png``): per file, each candidate's tau and the
union of all candidates.
"""
from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import time
from pathlib import Path

import numpy as np
from memory_vs_pia import (SHARED, TOKENIZER_RULES, PiaProposer, load_pia, pia_stop_words,
                           trace_files)
from suffix_vs_arctic import VLLM_DEFAULTS, ArcticProposer

from vllm_specext.config import SpecExtConfigError
from vllm_specext.proposers import build_proposer
from vllm_specext.replay.oracle import oracle_steps
from vllm_specext.replay.runner import load_streams
from vllm_specext.replay.simulate import accept_lengths

ROOT = Path(__file__).resolve().parents[1]


def makers(methods: list[str], k: int, pia_cls, stop_words: set[int], arctic: bool) -> dict:
    """Candidate name -> proposer factory (``num_speculative_tokens = k``)."""
    out = {m: (lambda m=m: build_proposer(m, num_speculative_tokens=k)) for m in methods}
    if pia_cls is not None:
        out["pia"] = lambda: PiaProposer(k, pia_cls, stop_words)
    if arctic:
        out["arctic"] = lambda: ArcticProposer(k, **VLLM_DEFAULTS)
    return out


def union_steps(lengths: list[list[np.ndarray]], k: int) -> int:
    """Steps of the selection oracle over candidates' accept lengths (``lengths[c][r]``:
    candidate ``c``, request ``r``), summed over the requests."""
    return sum(oracle_steps(np.maximum.reduce([c[r] for c in lengths]), 0, len(lengths[0][r]),
                            k) for r in range(len(lengths[0])))


def run_file(path: Path, k: int, methods: list[str], pia_cls, arctic: bool,
             cache: dict, limit: int | None = None) -> dict:
    """Per candidate and per union of two or more candidates: tau over the file's
    streams (output tokens / steps, summed); also the probing seconds per candidate."""
    tokens = 0
    steps: dict[str, int] = {}
    seconds: dict[str, float] = {}
    streams = load_streams(path, TOKENIZER_RULES, (), limit, cache)
    by_name = {t.name: t for t in cache.values()}
    for stream in streams:
        reqs = stream.requests
        tokens += sum(len(r.output) for r in reqs)
        cands = makers(methods, k, pia_cls, pia_stop_words(by_name[stream.tokenizer]), arctic)
        lengths = {}
        for name, make in cands.items():
            t0 = time.perf_counter()
            lengths[name] = accept_lengths(reqs, make, k)
            seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - t0
        names = list(cands)
        for size in range(1, len(names) + 1):
            for combo in itertools.combinations(names, size):
                key = "+".join(combo)
                steps[key] = steps.get(key, 0) + union_steps([lengths[c] for c in combo], k)
    return {"output_tokens": tokens, "tau": {c: tokens / s for c, s in steps.items()},
            "probe_seconds": seconds}


def plot(report: dict, path: Path) -> None:
    """Bars per file: each candidate's tau and the union of all candidates."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = list(report["files"])
    if not files:
        return
    first = report["files"][files[0]]["tau"]
    singles = [c for c in first if "+" not in c]
    bars = singles + (["+".join(singles)] if len(singles) > 1 else [])
    width = 0.8 / len(bars)
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(files)), 4))
    for i, b in enumerate(bars):
        ax.bar(np.arange(len(files)) + i * width,
               [report["files"][f]["tau"][b] for f in files], width,
               label="oracle over all" if "+" in b else b)
    ax.set_xticks(np.arange(len(files)) + 0.4 - width / 2)
    ax.set_xticklabels([f.removesuffix(".jsonl") for f in files], rotation=20, ha="right",
                       fontsize=8)
    ax.set_ylabel(f"tau (k = {report['k']})")
    ax.set_title("Per-step selection oracle over proposers (teacher-forced traces)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--traces", default=str(SHARED / "traces"),
                    help="directory of *.jsonl traces (default: ../shared/traces)")
    ap.add_argument("--files", nargs="*", help="trace file names in --traces (default: all)")
    ap.add_argument("--k", type=int, default=8, help="draft cap (default: 8)")
    ap.add_argument("--limit", type=int, default=None, help="requests per file (default: all)")
    ap.add_argument("--methods", default="memory_decoding,suffix",
                    help="our methods, comma-separated, at their default parameters "
                    "(default: memory_decoding,suffix)")
    ap.add_argument("--pia", help="path of PIA's lookahead_cache.py (outside this repo)")
    ap.add_argument("--arctic", action="store_true",
                    help="add ArcticInference's suffix cache at vLLM's defaults")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "selection_bound.json"),
                    help="JSON report (default: benchmarks/results/selection_bound.json)")
    args = ap.parse_args(argv)
    methods = [m for m in args.methods.split(",") if m]
    if args.k < 1:
        ap.error(f"--k {args.k}: must be >= 1")
    if not methods and not args.pia and not args.arctic:
        ap.error("no candidates: give --methods, --pia or --arctic")
    if args.arctic and importlib.util.find_spec("arctic_inference") is None:
        ap.error("--arctic needs arctic-inference (see suffix_vs_arctic.py)")
    for m in methods:
        try:
            build_proposer(m, num_speculative_tokens=args.k)
        except SpecExtConfigError as err:
            ap.error(f"--methods: {err}")
    if args.pia and not Path(args.pia).is_file():
        ap.error(f"--pia {args.pia}: no such file")
    files = trace_files(ap, args.traces, args.files)
    pia_cls = load_pia(args.pia) if args.pia else None
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {"k": args.k, "limit": args.limit, "methods": methods, "pia": bool(pia_cls),
              "arctic": args.arctic, "files": {}}
    cache: dict = {}
    for f in files:
        res = run_file(f, args.k, methods, pia_cls, args.arctic, cache, args.limit)
        report["files"][f.name] = res
        print(f.name, "  ".join(f"{c} {t:.3f}" for c, t in res["tau"].items()), flush=True)
        out.write_text(json.dumps(report, indent=1))
    plot(report, out.with_suffix(".png"))
    print("wrote", out, out.with_suffix(".png"))


if __name__ == "__main__":
    main()
