"""Time of the drafter's ``propose`` call inside the engine, per step, next to the step time.

One in-process engine per method (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, one OpenMP thread,
so the worker runs in this process and its calls can be timed) on the default model, fp32,
greedy, k = 8. A warm-up call, then the first ``--batch`` prompts of a workload in one
``chat()`` call. ``SpecExtProposer.propose`` (sync, drafting, adaptive trimming: everything
the drafter does per step) is wrapped with a timer.

Reports per method: wall time of the timed call (s), steps (propose calls), median propose
time over the steps with at least 3/4 of the batch decoding (ms) and its share of the mean
step time; the first call's time (ms: the prefill step's, where the drafter starts the new
requests and indexes their prompts) and its share of the median TTFT (vLLM's per-request
``first_token_latency``), i.e. what index building adds to the first token. Writes JSON
(``--out``).

Usage::

    python benchmarks/propose_cost.py [--methods naive,ngram,suffix,memory_decoding,lookahead]
        [--workload open_chat] [--batch 32] [--max-tokens 96] [--out benchmarks/results/propose_cost.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from vllm_specext.engine_run import run_json_child

RESULTS = Path(__file__).resolve().parent / "results"


def measure(method: str, workload: str, batch: int, max_tokens: int) -> dict:
    """Run one engine in this process and time its drafter (call in a fresh process)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from vllm import LLM, SamplingParams
    from workloads import WORKLOADS

    from vllm_specext.integration.adapter import SpecExtProposer
    from vllm_specext.model import default_model_path

    calls: list[tuple[float, int]] = []
    untimed = SpecExtProposer.propose

    def timed(self, *args, **kwargs):
        start = time.perf_counter()
        drafts = untimed(self, *args, **kwargs)
        calls.append((time.perf_counter() - start, sum(1 for _ in drafts)))
        return drafts

    SpecExtProposer.propose = timed
    llm = LLM(model=str(default_model_path()), dtype="float32", enforce_eager=True, seed=0,
              max_model_len=4096, enable_prefix_caching=False,
              speculative_config={"method": method, "num_speculative_tokens": 8},
              disable_log_stats=False)  # per-request metrics (TTFT)
    chats = WORKLOADS[workload][:batch]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    llm.chat(chats[:2], params)
    calls.clear()
    start = time.perf_counter()
    outs = llm.chat(chats, params)
    wall = time.perf_counter() - start
    full = [s for s, rows in calls if rows >= 0.75 * batch]
    median = statistics.median(full) if full else float("nan")
    ttft = statistics.median(o.metrics.first_token_latency for o in outs)
    return {"method": method, "wall_s": wall, "steps": len(calls),
            "propose_median_ms": 1000 * median,
            "share_of_mean_step": median / (wall / max(len(calls), 1)),
            "first_propose_ms": 1000 * calls[0][0], "ttft_median_ms": 1000 * ttft,
            "first_propose_share_of_ttft": calls[0][0] / ttft}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--methods", default="naive,ngram,suffix,memory_decoding,lookahead")
    ap.add_argument("--workload", default="open_chat")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--out", type=Path, default=RESULTS / "propose_cost.json")
    ap.add_argument("--child", help=argparse.SUPPRESS)  # result path (run_json_child)
    args = ap.parse_args()
    if args.child:
        job = json.loads(sys.stdin.read())
        Path(args.child).write_text(json.dumps(measure(**job)))
        return
    os.environ["OMP_NUM_THREADS"] = "1"  # inherited by each child engine
    rows = []
    for method in args.methods.split(","):
        job = {"method": method, "workload": args.workload, "batch": args.batch,
               "max_tokens": args.max_tokens}
        r = run_json_child([__file__, "--child"], job)
        rows.append(r)
        print(f"{method:16s} {r['steps']:4d} steps  {r['wall_s']:6.2f} s  propose "
              f"{r['propose_median_ms']:.3f} ms/step  {100 * r['share_of_mean_step']:.1f}% of a step"
              f"  first {r['first_propose_ms']:.3f} ms  "
              f"{100 * r['first_propose_share_of_ttft']:.2f}% of TTFT {r['ttft_median_ms']:.0f} ms")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"workload": args.workload, "batch": args.batch,
                                    "max_tokens": args.max_tokens, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
