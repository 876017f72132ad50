"""Per-step CPU cost of the ``ngram`` proposer vs vLLM's ``NgramProposer`` kernel.

For each batch size B and context length L, B requests start with L-token contexts
(random tokens with copied spans, so some suffixes match). Each step commits
``--commit`` tokens per request and drafts k tokens:

* ours: ``update()`` per request + one batched ``propose()`` (the whole API path);
  the one-time prompt indexing is reported separately (ms per batch, ns per prompt
  token), with the number of steps after which it is paid back against vLLM's kernel;
* vLLM: ``batch_propose_numba`` (KMP rescan of every context; vLLM pins it to one numba
  thread by default) and ``NgramProposer.batch_propose`` (kernel + its Python wrapper).

Usage: python benchmarks/ngram_cost.py [--steps 30] [--out benchmarks/results/ngram_cost.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np


def make_context(rng: np.random.Generator, n: int, vocab: int = 32000) -> np.ndarray:
    """Random tokens where half the 64-token chunks copy an earlier chunk."""
    toks = rng.integers(0, vocab, size=n, dtype=np.int32)
    for start in range(128, n - 64, 64):
        if rng.random() < 0.5:
            src = int(rng.integers(0, start - 64))
            toks[start:start + 64] = toks[src:src + 64]
    return toks


def bench_ours(contexts, future, k, lo, hi, steps, commit):
    from vllm_specext.proposers.ngram import NgramProposer
    warm = NgramProposer(k, lo, hi)  # first use of the typed lists compiles their methods
    warm.start_request("w", contexts[0][:100])
    warm.propose(["w"])
    p = NgramProposer(k, lo, hi)
    ids = [f"r{i}" for i in range(len(contexts))]
    t0 = time.perf_counter()
    for rid, ctx in zip(ids, contexts):
        p.start_request(rid, ctx)
    p.propose(ids)  # indexes the prompts
    index_s = time.perf_counter() - t0
    upd, prop = [], []
    for s in range(steps):
        t0 = time.perf_counter()
        for i, rid in enumerate(ids):
            p.update(rid, future[i, s * commit:(s + 1) * commit])
        t1 = time.perf_counter()
        p.propose(ids)
        t2 = time.perf_counter()
        upd.append(t1 - t0)
        prop.append(t2 - t1)
    total_tokens = sum(len(c) for c in contexts)
    index_bytes = p.state_nbytes() - sum(b.nbytes for b in p.tokens.values())
    return {
        "ours_update_ms": 1e3 * statistics.median(upd),
        "ours_propose_ms": 1e3 * statistics.median(prop),
        "ours_step_ms": 1e3 * statistics.median(u + q for u, q in zip(upd, prop)),
        "ours_step_mean_ms": 1e3 * statistics.mean(u + q for u, q in zip(upd, prop)),
        "ours_prompt_index_ms": 1e3 * index_s,
        "ours_prompt_index_ns_per_token": 1e9 * index_s / total_tokens,
        "ours_index_bytes_per_token": index_bytes / (total_tokens + len(ids) * steps * commit),
    }


def bench_vllm(contexts, future, k, lo, hi, steps, commit):
    from numba import set_num_threads
    from vllm.v1.spec_decode.ngram_proposer import NgramProposer, batch_propose_numba
    nb, length = len(contexts), len(contexts[0])
    max_len = length + steps * commit + k + 1
    token_ids = np.zeros((nb, max_len), dtype=np.int32)
    for i, ctx in enumerate(contexts):
        token_ids[i, :length] = ctx
    num_tokens = np.full(nb, length, dtype=np.int32)
    # the wrapper without __init__ (which needs a VllmConfig): same attributes
    prop = NgramProposer.__new__(NgramProposer)
    prop.min_n, prop.max_n, prop.k, prop.max_model_len = lo, hi, k, max_len
    prop.valid_ngram_draft = np.zeros((nb, k), dtype=np.int32)
    prop.valid_ngram_num_drafts = np.zeros(nb, dtype=np.int32)
    prop.num_tokens_threshold = 8192
    prop.num_numba_thread_available = 1  # vLLM: min(1, cpu_count // 2) // tp
    set_num_threads(1)
    valid = list(range(nb))
    draft = np.zeros((nb, k), dtype=np.int32)
    ndraft = np.zeros(nb, dtype=np.int32)
    batch_propose_numba(valid, num_tokens, token_ids, lo, hi, max_len, k, draft, ndraft)  # jit
    kern, full = [], []
    for s in range(steps):
        token_ids[:, num_tokens[0]:num_tokens[0] + commit] = future[:, s * commit:(s + 1) * commit]
        num_tokens += commit
        t0 = time.perf_counter()
        batch_propose_numba(valid, num_tokens, token_ids, lo, hi, max_len, k, draft, ndraft)
        t1 = time.perf_counter()
        prop.batch_propose(nb, valid, num_tokens, token_ids, k)
        t2 = time.perf_counter()
        kern.append(t1 - t0)
        full.append(t2 - t1)
    return {"vllm_kernel_ms": 1e3 * statistics.median(kern),
            "vllm_batch_propose_ms": 1e3 * statistics.median(full)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 32, 256])
    ap.add_argument("--context", type=int, nargs="+", default=[2048, 32768])
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--min-n", type=int, default=2)
    ap.add_argument("--max-n", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--commit", type=int, default=3, help="tokens committed per step")
    ap.add_argument("--no-vllm", action="store_true", help="skip the vLLM kernel")
    ap.add_argument("--out", default="benchmarks/results/ngram_cost.json")
    args = ap.parse_args()

    rng = np.random.default_rng(0)
    rows = []
    for length in args.context:
        for nb in args.batch:
            contexts = [make_context(rng, length) for _ in range(nb)]
            future = np.stack([np.concatenate([c[-200:], c[:200]])[: args.steps * args.commit]
                               for c in contexts])
            row = {"batch": nb, "context": length}
            row.update(bench_ours(contexts, future, args.k, args.min_n, args.max_n,
                                  args.steps, args.commit))
            if not args.no_vllm:
                row.update(bench_vllm(contexts, future, args.k, args.min_n, args.max_n,
                                      args.steps, args.commit))
                row["speedup_vs_kernel"] = row["vllm_kernel_ms"] / row["ours_step_ms"]
                row["speedup_vs_batch_propose"] = row["vllm_batch_propose_ms"] / row["ours_step_ms"]
                saved = row["vllm_kernel_ms"] - row["ours_step_ms"]  # per step, whole batch
                row["break_even_steps"] = (row["ours_prompt_index_ms"] / saved if saved > 0
                                           else None)
            print(json.dumps({key: round(v, 4) if isinstance(v, float) else v
                              for key, v in row.items()}), flush=True)
            rows.append(row)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {key: v for key, v in vars(args).items() if key != "out"}
    meta.update(cpu=platform.processor() or platform.machine(), cpu_count=os.cpu_count(),
                numba_threads=1)
    out.write_text(json.dumps({"config": meta, "results": rows}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
