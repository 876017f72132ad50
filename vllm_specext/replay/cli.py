"""``vllm-specext replay``: score proposers on recorded traces without a GPU.

Example (the README's measured table)::

    vllm-specext replay --traces ../shared/traces/llma_rag.jsonl \\
        --tokenizer ../shared/tokenizers/cl100k/cl100k_base.tiktoken \\
        --methods ngram,suffix --k 4,8 --param ngram.prompt_lookup_min=1,2 \\
        --out replay_out --recommend

``--tokenizer`` and ``--template`` take ``SPEC`` (all requests) or ``PATTERN=SPEC``
rules, repeated; the first rule whose PATTERN is a case-insensitive substring of the
request's ``model`` or of the file name wins (e.g. ``--tokenizer Mistral=m.model.v3
--tokenizer Qwen=qwen.tiktoken``). Exit status: 0 ok, 2 bad arguments or inputs.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from vllm_specext.replay.report import format_recommendations, format_table, recommend, write_report
from vllm_specext.replay.runner import run_replay
from vllm_specext.replay.simulate import DEFAULT_MS_PER_EXTRA_TOKEN, DEFAULT_STEP_MS, CostModel
from vllm_specext.replay.sweep import ReplayError, available_methods, expand_configs
from vllm_specext.replay.traces import TEMPLATES, TraceError


def _int_list(text: str, low: int = 1) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < low:
        raise argparse.ArgumentTypeError(f"values must be >= {low}, got {text!r}")
    return values


def _int_list0(text: str) -> list[int]:
    return _int_list(text, low=0)


def build_parser() -> argparse.ArgumentParser:
    """The ``replay`` argument parser (also used by the top-level CLI for ``--help``)."""
    p = argparse.ArgumentParser(
        prog="vllm-specext replay",
        description="Replay recorded (prompt, output) traces through speculative proposers "
                    "(teacher-forced, greedy acceptance) and report tau, acceptance, proposer "
                    "cost, the retrieval-oracle bound and a modelled speedup.")
    p.add_argument("--traces", nargs="+", required=True, metavar="FILE.jsonl",
                   help="JSONL traces (schema: shared/traces/README.md), replayed in file order")
    p.add_argument("--tokenizer", action="append", required=True, metavar="[PATTERN=]SPEC",
                   help="HF tokenizer dir / tokenizer.json, sentencepiece .model, or tiktoken BPE "
                        "file (prefix hf:/sp:/tiktoken: to force); repeat with PATTERN= to pick "
                        "by model or file name")
    p.add_argument("--template", action="append", default=[], metavar="[PATTERN=]NAME",
                   help=f"chat template for 'messages' traces: auto (default: by model name, else "
                        f"the tokenizer's own), {', '.join(TEMPLATES)}")
    p.add_argument("--methods", default="all",
                   help="comma-separated methods, or 'all' (every implemented one; default)")
    p.add_argument("--k", type=_int_list, default=[8], metavar="K1,K2",
                   help="draft caps (num_speculative_tokens) to sweep (default 8)")
    p.add_argument("--param", action="append", default=[], metavar="[METHOD.]KEY=V1,V2",
                   help="speculative_config key values to sweep (cartesian product)")
    p.add_argument("--tree-budget", type=_int_list0, default=[0], metavar="N1,N2",
                   help="also replay multi-branch drafts of N nodes for methods that have "
                        "propose_tree (offline only: vLLM verifies chains); 0 = chain (default)")
    p.add_argument("--cold", action="store_true",
                   help="fresh proposer per request (no cross-request state)")
    p.add_argument("--limit", type=int, default=None, metavar="N",
                   help="replay only the first N requests of each file")
    p.add_argument("--out", metavar="DIR", help="write replay.json, replay.csv and PNG plots here")
    p.add_argument("--step-ms", type=float, default=DEFAULT_STEP_MS,
                   help=f"modelled ms of a verification step with no drafts (default "
                        f"{DEFAULT_STEP_MS}: SmolLM2-135M bf16 batch 1 on the project's CPU, "
                        f"shared/notes/vllm-cpu.md)")
    p.add_argument("--ms-per-extra-token", type=float, default=DEFAULT_MS_PER_EXTRA_TOKEN,
                   help=f"modelled ms per draft token verified (default "
                        f"{DEFAULT_MS_PER_EXTRA_TOKEN}: (50.5-33.2)/16 from the same table)")
    p.add_argument("--recommend", action="store_true",
                   help="print the best configuration per file and category (modelled speedup)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return p


def _progress(enabled: bool) -> Callable[[int], Callable[[], None]] | None:
    """A progress-bar factory: tqdm if installed, else a plain stderr counter."""
    if not enabled:
        return None

    def start(total: int) -> Callable[[], None]:
        try:
            from tqdm import tqdm
        except ImportError:
            done = [0]

            def tick() -> None:
                done[0] += 1
                if done[0] % 50 == 0 or done[0] == total:
                    print(f"\rreplayed {done[0]}/{total} requests", end="", file=sys.stderr,
                          flush=True)
                    if done[0] == total:
                        print(file=sys.stderr)
            return tick
        bar = tqdm(total=total, unit="req", desc="replay", file=sys.stderr, leave=False)
        return lambda: bar.update(1)
    return start


def main(argv: list[str] | None = None) -> int:
    """Run ``vllm-specext replay`` with ``argv`` (default ``sys.argv[1:]``).

    Returns:
        The exit status: 0 ok, 2 bad arguments or inputs (message on stderr).
    """
    args = build_parser().parse_args(argv)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    try:
        if args.limit is not None and args.limit < 1:
            raise ReplayError("--limit must be >= 1")
        if methods == ["all"]:
            _, skipped = available_methods()
            for method, why in skipped.items():
                print(f"note: skipping {method}: {why}", file=sys.stderr)
        configs = expand_configs(methods, args.param, args.k, args.tree_budget)
        cost = CostModel(args.step_ms, args.ms_per_extra_token)
        run = run_replay(args.traces, configs, args.tokenizer, args.template, args.limit,
                         args.cold, cost, _progress(not args.no_progress))
    except (ReplayError, TraceError, OSError) as err:
        print(f"vllm-specext replay: error: {err}", file=sys.stderr)
        return 2
    print(format_table(run.rows))
    if args.recommend:
        print("\nRecommended (highest modelled speedup per file and category):")
        print(format_recommendations(recommend(run.rows)))
    if args.out:
        meta = {"argv": list(sys.argv[1:] if argv is None else argv),
                "cost_model": {"step_ms": cost.step_ms,
                               "ms_per_extra_token": cost.ms_per_extra_token,
                               "source": "shared/notes/vllm-cpu.md, verification cost table "
                                         "(SmolLM2-135M bf16 batch 1)"
                               if cost == CostModel() else "command line"},
                "cold": args.cold, "limit": args.limit,
                "configs": [c.label for c in configs]}
        paths = write_report(run, args.out, meta)
        print(f"\nwrote {', '.join(str(p) for p in paths)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
