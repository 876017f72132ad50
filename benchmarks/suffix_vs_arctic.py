"""``suffix`` (ours, numpy/numba) vs ArcticInference's ``SuffixDecodingCache``, side by side.

Every file of ``../shared/traces`` is replayed teacher-forced (draft, accept the longest
prefix equal to the recorded output, + 1 bonus token, update; see
:mod:`vllm_specext.replay.simulate`) at k = 8, requests in file order with the
cross-request state kept. A file recorded from several models is replayed as one stream
per model (one server each), with that model's tokenizer; the file's tau sums them.
Each configuration replays a stream with a fresh proposer (after a throwaway warm-up).

Configurations:

* ``arctic_vllm``: Arctic at vLLM's defaults (depth 24, 10000 cached, factor 1.0,
  min_prob 0.1), driven as vLLM's ``SuffixDecodingProposer`` drives it;
* ``arctic_vllm_tree8``: its tree draft (``use_tree_spec``) of k nodes;
* ``ours_same``: ours with those same explicit parameters (and our default
  ``rejected_tail``, which Arctic has no key for);
* ``ours_default``: ours at the ``SuffixConfig`` defaults;
* ``ours_default_tree8`` / ``ours_default_tree32``: the tree draft of ``ours_default``
  (``propose_tree`` with k / 4k nodes, branches <= k deep), accepted along the longest
  matching root path (tree verification).

Per configuration: tau (output tokens / steps), wasted draft tokens per step (drafted -
accepted: verification work a longer draft costs the engine, which replay's tau does not
charge), proposer µs per step (``propose`` + ``update``, median / p99), µs in
``stop_request`` per step, peak bytes of proposer state and bytes of the global tree per
token it holds (ours: arrays allocated; Arctic: its own ``estimate_memory``), and for ours
the learned local weight at the end of each stream. ``--curve`` adds per-step cost
against context length (1k .. 64k tokens).

Usage: python benchmarks/suffix_vs_arctic.py [--limit 100] [--files a,b] [--curve]
       [--out benchmarks/results/suffix_vs_arctic.json]
Needs ``arctic-inference`` (see ``shared/notes/vllm-cpu.md``, Install step 4), ``tiktoken``
and ``sentencepiece``.
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from vllm_specext.proposers import build_proposer
from vllm_specext.proposers.base import Proposer
from vllm_specext.proposers.suffix import SuffixProposer
from vllm_specext.replay.simulate import Request, replay
from vllm_specext.replay.tokenizers import load_tokenizer
from vllm_specext.replay.traces import load_traces, tokenize_record

SHARED = Path(__file__).resolve().parents[2] / "shared"
TOK = SHARED / "tokenizers"
#: tokenizer per trace file (``shared/traces/README.md``); a dict maps model-name keys
FILE_TOKENIZERS: dict[str, str | dict[str, str]] = {
    "specbench_vicuna7b_vanilla_greedy": str(TOK / "llama2/tokenizer.model"),
    "codeqwen_evalplus_greedy": str(TOK / "qwen/qwen.tiktoken"),
    "mtbench_qwen2_mistral_vllm_greedy": {
        "qwen": str(TOK / "qwen/qwen.tiktoken"),
        "mistral": str(TOK / "mistral/mistral_instruct_tokenizer_240323.model.v3")},
    "llma_rag": str(TOK / "cl100k/cl100k_base.tiktoken"),
    "llma_cnndm": str(TOK / "cl100k/cl100k_base.tiktoken"),
    "openhands_agent_snapshot": str(TOK / "cl100k/cl100k_base.tiktoken"),
}
VLLM_DEFAULTS = {"suffix_decoding_max_tree_depth": 24,
                 "suffix_decoding_max_cached_requests": 10000,
                 "suffix_decoding_max_spec_factor": 1.0,
                 "suffix_decoding_min_token_prob": 0.1}


class ArcticProposer(Proposer):
    """Arctic's ``SuffixDecodingCache`` behind the core proposer API, called as vLLM's
    ``SuffixDecodingProposer`` calls it (context = the last ``max_tree_depth`` tokens)."""

    method = "arctic_suffix"

    def __init__(self, num_speculative_tokens: int, suffix_decoding_max_tree_depth: int,
                 suffix_decoding_max_cached_requests: int,
                 suffix_decoding_max_spec_factor: float,
                 suffix_decoding_min_token_prob: float):
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        super().__init__(num_speculative_tokens)
        self.depth = suffix_decoding_max_tree_depth
        self.factor = suffix_decoding_max_spec_factor
        self.min_prob = suffix_decoding_min_token_prob
        self.cache = SuffixDecodingCache(self.depth, suffix_decoding_max_cached_requests)

    def _on_start(self, req_id: str) -> None:
        self.cache.start_request(req_id, self.tokens[req_id].view())

    def _on_update(self, req_id: str, old_len: int) -> None:
        self.cache.add_active_response(req_id, self.tokens[req_id].view()[old_len:])

    def _on_stop(self, req_id: str, finished: bool) -> None:
        self.cache.stop_request(req_id)

    def _propose_one(self, req_id: str, max_tokens: int) -> list[int]:
        ctx = self.tokens[req_id].view()[-self.depth:]
        return self.cache.speculate(req_id, ctx, max_spec_tokens=max_tokens,
                                    max_spec_factor=self.factor,
                                    min_token_prob=self.min_prob).token_ids

    def propose_tree(self, req_id: str, budget: int) -> tuple[np.ndarray, np.ndarray]:
        """Arctic's ``use_tree_spec`` draft of ``budget`` nodes (no separate depth cap)."""
        ctx = self.tokens[req_id].view()[-self.depth:]
        d = self.cache.speculate(req_id, ctx, max_spec_tokens=budget,
                                 max_spec_factor=self.factor, min_token_prob=self.min_prob,
                                 use_tree_spec=True)
        return np.asarray(d.token_ids, np.int32), np.asarray(d.parents, np.int32)

    def state_nbytes(self) -> int:
        """Token buffers plus Arctic's estimate of its request trees (the global tree is
        reported once per stream: estimating it walks the whole tree)."""
        return super().state_nbytes() + sum(t.estimate_memory()
                                            for t in self.cache._local_trees.values())

    def global_bytes(self) -> int:
        """Arctic's own estimate of its global tree's memory."""
        return self.cache._global_tree.estimate_memory()


def tokenizer_for(file: str, model: str) -> str:
    spec = FILE_TOKENIZERS[file]
    if isinstance(spec, str):
        return spec
    for key, path in spec.items():
        if key in model.lower():
            return path
    raise KeyError(f"no tokenizer for model {model!r} of {file}")


def load_streams(file: str, limit: int | None) -> dict[str, list[Request]]:
    """The first ``limit`` requests of a trace file, tokenized, split by model."""
    tokenizers: dict[str, object] = {}
    streams: dict[str, list[Request]] = defaultdict(list)
    for rec in load_traces(SHARED / "traces" / f"{file}.jsonl", limit):
        path = tokenizer_for(file, rec.model)
        tk = tokenizers.setdefault(path, load_tokenizer(path))
        prompt, output = tokenize_record(rec, tk)
        if output:
            streams[rec.model].append(Request(f"{rec.line}", rec.category, prompt, output))
    return dict(streams)


def make_configs(k: int) -> dict[str, tuple]:
    """name -> (proposer factory, tree budget: 0 for chain drafts)."""
    return {
        "arctic_vllm": (lambda: ArcticProposer(k, **VLLM_DEFAULTS), 0),
        f"arctic_vllm_tree{k}": (lambda: ArcticProposer(k, **VLLM_DEFAULTS), k),
        "ours_same": (lambda: SuffixProposer(k, **VLLM_DEFAULTS), 0),
        "ours_default": (lambda: build_proposer("suffix", num_speculative_tokens=k), 0),
        f"ours_default_tree{k}": (lambda: build_proposer("suffix", num_speculative_tokens=k), k),
        f"ours_default_tree{4 * k}": (lambda: build_proposer("suffix", num_speculative_tokens=k),
                                      4 * k),
    }


def run_stream(requests: list[Request], k: int) -> dict[str, dict]:
    """Replay one stream through every configuration (a fresh proposer each)."""
    acc: dict[str, dict] = {}
    for name, (factory, tree_budget) in make_configs(k).items():
        stop_us: list[float] = []
        made: list[Proposer] = []

        def make(factory=factory, stop_us=stop_us, made=made):
            p = factory()
            p.stop_request = _timed_stop(p, stop_us)
            made.append(p)
            return p

        res = replay(requests, make, k, tree_budget=tree_budget)
        a = acc[name] = {"out": sum(r.output_tokens for r in res),
                         "steps": sum(r.steps for r in res),
                         "drafted": sum(r.drafted for r in res),
                         "accepted": sum(r.accepted for r in res),
                         "us": [r.step_us for r in res], "stop_us": stop_us,
                         "bytes": max(r.state_bytes for r in res)}
        p = made[-1]
        if isinstance(p, SuffixProposer):
            g = p.global_cache
            a["global"] = [g.nbytes, g.stored_tokens, g.tree.num_nodes]
            a["local_weight"] = [p.local_weight]
        elif not tree_budget:  # Arctic caches every output: its cap exceeds any stream
            a["global"] = [p.global_bytes(), sum(len(r.output) for r in requests), None]
    return acc


def _timed_stop(p: Proposer, sink: list[float]):
    """``p.stop_request`` that records its µs (warm-up requests excluded)."""
    stop = type(p).stop_request

    def timed(req_id: str, finished: bool = True) -> None:
        t0 = time.perf_counter_ns()
        stop(p, req_id, finished)
        if req_id != "__warmup__":
            sink.append((time.perf_counter_ns() - t0) / 1e3)
    return timed


def merge(total: dict, acc: dict) -> None:
    """Add one stream's accumulators to a file's."""
    for key, val in acc.items():
        if key == "bytes":
            total[key] = max(total.get(key, 0), val)
        elif key == "global":
            old = total.get(key, [0, 0, 0])
            total[key] = [None if o is None or v is None else o + v for o, v in zip(old, val)]
        else:
            total[key] = total.get(key, type(val)()) + val


def summarize(acc: dict) -> dict:
    us = np.concatenate(acc["us"]) if acc["us"] else np.zeros(0)
    out = {"output_tokens": acc["out"], "steps": acc["steps"],
           "tau": acc["out"] / acc["steps"] if acc["steps"] else None,
           "wasted_per_step": (acc["drafted"] - acc["accepted"]) / max(acc["steps"], 1),
           "acceptance_rate": acc["accepted"] / max(acc["drafted"], 1),
           "us_median": float(np.median(us)), "us_p99": float(np.percentile(us, 99)),
           "stop_us_per_step": float(np.sum(acc["stop_us"]) / acc["steps"]),
           "state_bytes_peak": acc["bytes"]}
    if "local_weight" in acc:
        out["local_weight_final"] = acc["local_weight"]  # per stream
    if "global" in acc:
        nbytes, tokens, nodes = acc["global"]
        out["global_bytes_per_cached_token"] = nbytes / max(tokens, 1)
        if nodes is not None:
            out["global_nodes_per_cached_token"] = nodes / max(tokens, 1)
    return out


def context_curve(k: int, lengths=(1024, 4096, 16384, 65536), steps: int = 200) -> dict:
    """Per-step propose + update µs (median) at a given context length: a prompt of
    ``L`` real tokens (OpenHands prompts, repeated), then ``steps`` steps committing
    2 tokens each from the following text."""
    reqs = [r for s in load_streams("openhands_agent_snapshot", None).values() for r in s]
    text = np.concatenate([np.asarray(list(r.prompt) + list(r.output), np.int32) for r in reqs])
    curve = {}
    for L in lengths:
        need = L + 2 * steps
        toks = np.resize(text, need)
        row = {}
        for name, p in (("arctic_vllm", ArcticProposer(k, **VLLM_DEFAULTS)),
                        ("ours_default", build_proposer("suffix", num_speculative_tokens=k))):
            p.start_request("c", toks[:L])
            times = []
            for s in range(steps):
                t0 = time.perf_counter_ns()
                p.propose(["c"])
                p.update("c", toks[L + 2 * s: L + 2 * s + 2])
                times.append((time.perf_counter_ns() - t0) / 1e3)
            t0 = time.perf_counter_ns()
            p.stop_request("c", finished=False)
            row[name] = {"us_median": float(np.median(times)),
                         "us_p99": float(np.percentile(times, 99))}
        curve[str(L)] = row
        print(f"context {L:6d}: " + "  ".join(f"{n} {v['us_median']:.1f} µs"
                                               for n, v in row.items()), flush=True)
    return curve


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", default=",".join(FILE_TOKENIZERS))
    ap.add_argument("--limit", type=int, default=None, help="first N requests per file")
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--curve", action="store_true", help="also cost vs context length")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results/suffix_vs_arctic.json"))
    args = ap.parse_args()
    report = {"k": args.k, "limit": args.limit,
              "machine": platform.processor() or platform.machine(),
              "ours_defaults": _defaults(), "files": {}}
    for file in args.files.split(","):
        t0 = time.time()
        per_model = {}
        total: dict[str, dict] = {}
        for model, reqs in load_streams(file, args.limit).items():
            acc = run_stream(reqs, args.k)
            per_model[model] = {n: summarize(a) for n, a in acc.items()}
            for n, a in acc.items():
                merge(total.setdefault(n, {}), a)
        summary = {n: summarize(a) for n, a in total.items()}
        base = summary["arctic_vllm"]["tau"]
        for s in summary.values():
            s["tau_vs_arctic"] = s["tau"] / base if base else None
        report["files"][file] = {"all": summary, "per_model": per_model}
        print(f"{file} ({time.time() - t0:.0f} s)")
        for n, s in summary.items():
            mem = (f"  {s['global_bytes_per_cached_token']:5.0f} B/cached token"
                   if "global_bytes_per_cached_token" in s else "")
            print(f"  {n:19s} tau {s['tau']:.3f} ({s['tau_vs_arctic']:.3f}x)  "
                  f"wasted {s['wasted_per_step']:4.2f}/step  "
                  f"{s['us_median']:5.1f} µs med {s['us_p99']:6.1f} p99  "
                  f"stop {s['stop_us_per_step']:4.1f} µs/step{mem}", flush=True)
    if args.curve:
        report["context_curve"] = context_curve(args.k)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"wrote {out}")


def _defaults() -> dict:
    from vllm_specext.config import SuffixConfig
    return SuffixConfig(method="suffix").proposer_kwargs()


if __name__ == "__main__":
    main()
