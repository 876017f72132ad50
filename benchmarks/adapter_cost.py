"""The drafter's CPU time per step at a large batch, offline, with warm and cold caches.

In the engine the drafter (:class:`~vllm_specext.integration.adapter.SpecExtProposer`'s
``propose``: syncing each row's committed tokens into the proposer and the adaptive
controller, drafting, and the adaptive rule's decision) runs right after the target
model's forward pass, which streams the model's weights (0.5 GB in fp32 for the default
model) through the CPU's caches, so the drafter finds its state cold. This script drives
the adapter with a stand-in runner, ``--batch`` requests at once: Spec-Bench conversations
and their recorded answers (``shared/traces/specbench_vicuna7b_vanilla_greedy.jsonl``,
those whose answer holds at least ``2 x --steps`` tokens; each conversation rendered in
the default model's chat template and tokenized with its tokenizer, as the offline replay
does);
each step commits the shown draft's prefix that equals the recorded answer plus one bonus
token, and the cost model is fed a modelled step time (``--step-ms`` for a plain step plus
``--draft-token-ms`` per draft token; the defaults are within what batch 32 measured on
the project's 2-core CPU VMs: a plain 32-row step 120-170 ms, a draft token ~1.6-1.9 ms
more). With caches *cold*, a
buffer larger than the last-level cache (``--flush-mib``) is read before every timed call,
as the forward pass does.

Reports per method and cache state the median milliseconds per decode step of the whole
call (timed in batches of its own, without the part timers, whose ~70 calls a step would
add to it) and of its parts, timed in a second set of batches (``sync``: the rows' new
tokens into the proposer, of which ``update`` is the proposer's indexing and ``observe``
the controller's scoring; ``draft``: the proposer's ``propose``; ``decide``:
``vllm_specext.adaptive.shown_drafts``); medians of parts do not add up to the total's.
``filler_tokens``: tokens committed after a row's recorded answer ran out (a filler token,
its drafts rejected), which should be few. Writes JSON and a PNG bar chart (``--out``,
the chart next to it).

Usage::

    python benchmarks/adapter_cost.py [--methods naive,ngram,suffix,memory_decoding,lookahead]
        [--batch 32] [--steps 60] [--batches 3] [--out benchmarks/results/adapter_cost.json]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from vllm_specext.config import validate_config
from vllm_specext.integration import adapter
from vllm_specext.model import default_model_path
from vllm_specext.replay.simulate import chain_accept
from vllm_specext.replay.tokenizers import load_tokenizer
from vllm_specext.replay.traces import load_traces, tokenize_record

RESULTS = Path(__file__).resolve().parent / "results"
TRACE = (Path(__file__).resolve().parents[2] / "shared" / "traces"
         / "specbench_vicuna7b_vanilla_greedy.jsonl")
MAX_MODEL_LEN = 4096
#: timed parts, label: (owner's attribute path from the adapter, method name); a part's
#: time includes the parts it calls
PARTS = {"sync": ("", "_sync"), "update": ("proposer", "update"),
         "observe": ("controller", "observe"), "draft": ("proposer", "propose")}


def load_requests(tokenizer_path: Path, count: int, min_output: int
                  ) -> list[tuple[list[int], list[int]]]:
    """The first ``count`` (prompt ids, answer ids) pairs of the trace whose answer holds at
    least ``min_output`` tokens, tokenized as the offline replay does
    (:func:`vllm_specext.replay.traces.tokenize_record`: the whole conversation in the
    default model's own chat template, ``hf``).

    Raises:
        SystemExit: fewer such conversations than ``count``.
    """
    tok = load_tokenizer(str(tokenizer_path))
    requests = []
    for record in load_traces(TRACE):
        prompt, answer = tokenize_record(record, tok, "hf")
        if len(answer) >= min_output:
            requests.append((prompt, answer))
        if len(requests) == count:
            return requests
    raise SystemExit(f"{TRACE} holds {len(requests)} answers of >= {min_output} tokens; "
                     f"(--batches + 1) x --batch = {count} needed (one untimed batch)")


def _timed(fn: Callable, into: list[float]) -> Callable:
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            into[-1] += time.perf_counter() - start
    return timed


@contextlib.contextmanager
def timed_parts(drafter: adapter.SpecExtProposer,
                seconds: dict[str, list[float]]) -> Iterator[None]:
    """Time the parts of ``drafter``'s calls (:data:`PARTS` on its own objects, and
    ``decide``: :func:`~vllm_specext.adaptive.shown_drafts` as the adapter calls it):
    each call adds its seconds to ``seconds[label][-1]`` (the caller appends a 0.0 per
    step)."""
    for label, (path, name) in PARTS.items():
        owner = getattr(drafter, path) if path else drafter
        if owner is not None:
            setattr(owner, name, _timed(getattr(owner, name), seconds[label]))
    decide = adapter.shown_drafts
    adapter.shown_drafts = _timed(decide, seconds["decide"])
    try:
        yield
    finally:
        adapter.shown_drafts = decide


def run_batch(method: str, k: int, requests: list[tuple[list[int], list[int]]], steps: int,
              step_ms: float, draft_token_ms: float, flush: np.ndarray | None,
              seconds: dict[str, list[float]] | None = None) -> tuple[list[float], int]:
    """Prefill then ``steps`` decode steps of ``requests`` on a fresh adapter.

    Returns:
        ``(seconds of each decode step's propose call, filler tokens committed)``; with
        ``seconds`` (keys: every label of :data:`PARTS` and ``"decide"``), each part's
        seconds per step are appended there too (timed by wrappers on this adapter's
        objects, which are dropped with it).
    """
    spec = validate_config({"method": method, "num_speculative_tokens": k}).model_dump()
    cfg = SimpleNamespace(additional_config={"vllm_specext": spec},
                          model_config=SimpleNamespace(max_model_len=MAX_MODEL_LEN))
    drafter = adapter.SpecExtProposer(cfg)
    rows = len(requests)
    prompts = [p for p, _ in requests]
    batch = SimpleNamespace(req_ids=[f"{id(drafter)}-{i}" for i in range(rows)],
                            num_prompt_tokens=np.array([len(p) for p in prompts], np.int32))
    drafter.bind_runner(SimpleNamespace(input_batch=batch, requests={}))
    token_ids = np.zeros((rows, MAX_MODEL_LEN), np.int32)
    num_tokens = np.array([len(p) for p in prompts], np.int32)
    for i, p in enumerate(prompts):
        token_ids[i, :len(p)] = p
    drafts = drafter.propose([[] for _ in range(rows)], num_tokens, token_ids)
    with timed_parts(drafter, seconds) if seconds is not None else contextlib.nullcontext():
        return _decode(drafter, requests, token_ids, num_tokens, drafts, steps, step_ms,
                       draft_token_ms, flush, seconds)


def _decode(drafter: adapter.SpecExtProposer, requests: list, token_ids: np.ndarray,
            num_tokens: np.ndarray, drafts: list[list[int]], steps: int, step_ms: float,
            draft_token_ms: float, flush: np.ndarray | None,
            seconds: dict[str, list[float]] | None) -> tuple[list[float], int]:
    """The decode steps of :func:`run_batch`."""
    rows = len(requests)
    done = [0] * rows
    times = []
    filler = 0
    for _ in range(steps):
        sampled = []
        for i, (_, output) in enumerate(requests):
            accepted = chain_accept(drafts[i], output, done[i])
            new = output[done[i]:done[i] + accepted + 1]
            if not new:  # the answer ran out: a filler token, as in a request gone on
                new, filler = [0], filler + 1
            token_ids[i, num_tokens[i]:num_tokens[i] + len(new)] = new
            num_tokens[i] += len(new)
            done[i] += len(new)
            sampled.append(list(new))
        draft_tokens = sum(map(len, drafts))
        drafter.cost_model.observe(rows + draft_tokens,
                                   (step_ms + draft_token_ms * draft_tokens) / 1e3,
                                   draft_tokens > 0, rows)
        if flush is not None:
            flush.sum()
        if seconds is not None:
            for values in seconds.values():
                values.append(0.0)
        start = time.perf_counter()
        drafts = drafter.propose(sampled, num_tokens, token_ids)
        times.append(time.perf_counter() - start)
    return times, filler


def measure(method: str, k: int, requests: list, batch: int, steps: int, batches: int,
            step_ms: float, draft_token_ms: float, flush: np.ndarray | None) -> dict:
    """``{"ms": {part or "total": median ms per decode step}, "filler_tokens": n}`` over
    ``batches`` batches of ``batch`` requests, after one untimed batch that compiles the
    kernels: the total from batches run without the part timers, the parts from the same
    batches run again with them."""
    run_batch(method, k, requests[:batch], 4, step_ms, draft_token_ms, flush)
    total, filler = [], 0
    seconds: dict[str, list[float]] = {label: [] for label in (*PARTS, "decide")}
    for parts in (None, seconds):
        for b in range(1, batches + 1):
            times, n = run_batch(method, k, requests[b * batch:(b + 1) * batch], steps,
                                 step_ms, draft_token_ms, flush, parts)
            if parts is None:
                total += times
                filler += n
    ms = {label: round(1e3 * statistics.median(values), 4)
          for label, values in {**seconds, "total": total}.items()}
    return {"ms": ms, "filler_tokens": filler}


def plot(results: list[dict], path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(dict.fromkeys(r["method"] for r in results))
    fig, ax = plt.subplots(figsize=(7, 3.5))
    x = np.arange(len(methods))
    for j, caches in enumerate(("warm", "cold")):
        ms = [next(r["ms"]["total"] for r in results
                   if r["method"] == m and r["caches"] == caches) for m in methods]
        ax.bar(x + (j - 0.5) * 0.4, ms, 0.4, label=f"{caches} caches")
    ax.set_xticks(x, methods)
    ax.set_ylabel("ms per step (median)")
    ax.set_title(title, fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", default="naive,ngram,suffix,memory_decoding,lookahead",
                    help="comma-separated vllm_specext methods, each at its defaults")
    ap.add_argument("-k", "--num-speculative-tokens", type=int, default=8,
                    help="draft tokens per request and step at most")
    ap.add_argument("--batch", type=int, default=32, help="requests decoding at once")
    ap.add_argument("--steps", type=int, default=60, help="decode steps timed per batch")
    ap.add_argument("--batches", type=int, default=3, help="timed batches per method")
    ap.add_argument("--step-ms", type=float, default=130.0,
                    help="modelled plain step at --batch rows, ms (the cost model's input)")
    ap.add_argument("--draft-token-ms", type=float, default=1.6,
                    help="modelled extra step time per draft token, ms")
    ap.add_argument("--flush-mib", type=int, default=256,
                    help="buffer read before each cold call, MiB (> the last-level cache)")
    ap.add_argument("--out", type=Path, default=RESULTS / "adapter_cost.json",
                    help="JSON written here, the PNG chart next to it")
    args = ap.parse_args(argv)
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    if args.batch < 1 or args.steps < 1 or args.batches < 1 or args.flush_mib < 1:
        raise SystemExit("--batch, --steps, --batches and --flush-mib must be >= 1")
    methods = [m for m in args.methods.split(",") if m]
    for method in methods:  # a bad method or k fails here, before anything is measured
        validate_config({"method": method,
                         "num_speculative_tokens": args.num_speculative_tokens})
    requests = load_requests(default_model_path(), (args.batches + 1) * args.batch,
                             2 * args.steps)
    flush = np.ones(args.flush_mib << 18, dtype=np.float32)
    results = []
    for method in methods:
        for caches in ("warm", "cold"):
            result = measure(method, args.num_speculative_tokens, requests, args.batch,
                             args.steps, args.batches, args.step_ms, args.draft_token_ms,
                             flush if caches == "cold" else None)
            results.append({"method": method, "caches": caches, **result})
            print(f"{method:16s} {caches}: "
                  + "  ".join(f"{k} {v:.3f}" for k, v in result["ms"].items())
                  + f" ms/step; filler tokens {result['filler_tokens']}", flush=True)
    meta = {"command": " ".join(["python", "benchmarks/adapter_cost.py",
                                 *(sys.argv[1:] if argv is None else argv)]),
            **{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "started": started}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    chart = args.out.with_suffix(".png")
    plot(results, chart, f"drafter per step, batch {args.batch}, k={args.num_speculative_tokens}"
         f" (offline, stand-in runner)")
    print(f"wrote {args.out} and {chart}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
