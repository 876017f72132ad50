"""``memory_decoding`` vs PIA's reference trie (``lookahead_cache.py``) on real traces.

Each file of ``shared/traces`` is replayed in file order with cross-request state kept,
teacher-forced (draft, accept the longest prefix equal to the recorded output, plus one
bonus token; :func:`vllm_specext.replay.simulate.replay`), at k = 8 and 16. The chain
modes run in lockstep, each request through every mode before the next
(:func:`~vllm_specext.replay.simulate.replay_interleaved`), so their step times share
the machine's load:

* ``ours``: :class:`MemoryDecodingProposer` single-branch draft (the engine's draft);
* ``ours_dynamic``: the same with ``dynamic_algo`` (wasted = drafted - accepted);
* ``pia``: PIA's ``LookaheadCache.one_get`` single branch at its example defaults
  (``decoding_length=64``, ``branch_length=12`` (raised to k when k > 12), query of the
  last 2 tokens, mode ``mix``, stop words ``, . <space>``), fed as in PIA's
  ``lookahead_generation``: the prompt with ``put(mode='input')``, outputs with
  ``stream_put``;
* ``naive``: no drafts, the cost floor of the replay's ``propose`` + ``update`` path;
* ``*_tree``: multi-branch drafts of at most ``--tree-budget`` nodes and depth k
  (ours: :meth:`MemoryDecodingProposer.propose_tree`; PIA: ``hier_get``), accepted
  along the longest matching root-to-leaf path.

Per step time = ``propose`` + ``update`` (PIA: ``one_get``/``hier_get`` + ``stream_put``),
µs, median and p99. ``start_request`` + ``stop_request`` are timed too (PIA ``put`` of
the prompt and the final ``stream_put``; ours counts a finished request in its trie at
stop, not per step): µs per request and, with the step times, µs per step amortized.
Also measured: the time to start a request with a 32k-token prompt and draft once
(ours; PIA ``put``), and trie bytes per node / per counted token.

PIA's code is not part of this project: pass the path of its ``lookahead_cache.py``
from a checkout outside the repository (``--pia``); it is loaded by file path.

Usage::

    git --git-dir=<mirror of alipay/PainlessInferenceAcceleration> archive HEAD \\
        lookahead/lookahead/common/lookahead_cache.py | tar -x -C /tmp/pia
    python benchmarks/memory_vs_pia.py \\
        --pia /tmp/pia/lookahead/lookahead/common/lookahead_cache.py \\
        [--limit N] [--files llma_rag.jsonl ...] [--out benchmarks/results/memory_vs_pia.json]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import time
from pathlib import Path

import numpy as np

from vllm_specext.proposers.base import Proposer
from vllm_specext.proposers.memory_decoding import MemoryDecodingProposer
from vllm_specext.proposers.naive import NaiveProposer
from vllm_specext.replay.runner import load_streams
from vllm_specext.replay.simulate import Request, replay_interleaved

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
TOK = SHARED / "tokenizers"
#: tokenizer per request model / file name (``shared/traces/README.md``)
TOKENIZER_RULES = [
    f"vicuna={TOK / 'llama2' / 'tokenizer.model'}",
    f"mistral={TOK / 'mistral' / 'mistral_instruct_tokenizer_240323.model.v3'}",
    f"qwen={TOK / 'qwen' / 'qwen.tiktoken'}",
    f"{TOK / 'cl100k' / 'cl100k_base.tiktoken'}",
]
ALL_MODES = ["naive", "ours", "ours_dynamic", "pia", "ours_tree", "pia_tree"]
PIA_DECODING_LENGTH = 64
PIA_BRANCH_LENGTH = 12
PIA_QUERY = 2


def trace_files(ap: argparse.ArgumentParser, traces: str, names: list[str] | None
                ) -> list[Path]:
    """The ``*.jsonl`` files of directory ``traces`` (those named in ``names`` if given);
    an argparse error if ``traces`` is not a directory or nothing matches."""
    if not Path(traces).is_dir():
        ap.error(f"--traces {traces}: not a directory of *.jsonl trace files")
    files = sorted(Path(traces).glob("*.jsonl"))
    if names:
        missing = sorted(set(names) - {f.name for f in files})
        if missing:
            ap.error(f"--files: not in {traces}: {', '.join(missing)} "
                     f"(there: {', '.join(f.name for f in files)})")
        files = [f for f in files if f.name in names]
    if not files:
        ap.error(f"--traces {traces}: no *.jsonl files")
    return files


def load_pia(path: str):
    """PIA's ``LookaheadCache`` class, loaded from a file outside this repository."""
    spec = importlib.util.spec_from_file_location("pia_lookahead_cache", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.LookaheadCache


class PiaProposer(Proposer):
    """PIA's trie behind the :class:`Proposer` API (driven as ``lookahead_generation``
    drives it, one request at a time, ``idx=0``)."""

    method = "pia"

    def __init__(self, k: int, cache_cls, stop_words: set[int]):
        super().__init__(k)
        self.cache = cache_cls(eos_ids=(), stop_words=stop_words)
        self.branch_length = max(PIA_BRANCH_LENGTH, k)

    def _on_start(self, req_id):
        prompt = self.tokens[req_id].view().tolist()
        self.cache.put(prompt[1:], branch_length=self.branch_length + 1, mode="input", idx=0)

    def _on_update(self, req_id, old_len):
        new = self.tokens[req_id].view()[old_len:].tolist()
        self.cache.stream_put(new, branch_length=self.branch_length + 1, final=False,
                              mode="output", idx=0)

    def _on_stop(self, req_id, finished):
        self.cache.stream_put([], branch_length=self.branch_length + 1, final=True,
                              mode="output", idx=0)

    def _propose_one(self, req_id, max_tokens):
        q = self.tokens[req_id].view()[-PIA_QUERY:].tolist()
        ids, _, _ = self.cache.one_get(q, decoding_length=PIA_DECODING_LENGTH,
                                       branch_length=self.branch_length,
                                       min_output_size=PIA_DECODING_LENGTH // 2,
                                       mode="mix", idx=0)
        return list(ids[1:1 + max_tokens])

    def propose_tree(self, req_id, budget, max_depth):
        q = self.tokens[req_id].view()[-PIA_QUERY:].tolist()
        ids, mask, _ = self.cache.hier_get(q, decoding_length=budget + 1, branch_length=max_depth,
                                           min_output_size=max((budget + 1) // 2, 1),
                                           mode="mix", idx=0)
        n = len(ids) - 1
        par = np.full(n, -1, dtype=np.int32)
        for i in range(1, n + 1):
            anc = np.nonzero(np.asarray(mask)[i, 1:i])[0]
            par[i - 1] = anc[-1] if len(anc) else -1
        return np.asarray(ids[1:], dtype=np.int32), par


def pia_stop_words(tokenizer) -> set[int]:
    """Ids of ``,`` ``.`` and space, PIA's example stop words."""
    return {tokenizer.encode_text(s)[-1] for s in (",", ".", " ") if tokenizer.encode_text(s)}


def replay_tree(requests, make, k, budget):
    """Teacher-forced replay of tree drafts: the longest root-to-node path equal to
    the next true tokens is accepted, plus a bonus token. Returns (output tokens,
    µs per step)."""
    p = make()
    steps = tokens = 0
    us = []
    for req in requests:
        truth = list(req.output)
        p.start_request(req.key, req.prompt)
        pos = 0
        while pos < len(truth):
            t0 = time.perf_counter_ns()
            tok, par = p.propose_tree(req.key, budget, k)
            t1 = time.perf_counter_ns()
            a, node = 0, -1
            while pos + a < len(truth):
                nxt = [i for i in range(len(tok)) if par[i] == node and tok[i] == truth[pos + a]]
                if not nxt:
                    break
                node = nxt[0]
                a += 1
            emit = a + 1 if pos + a < len(truth) else a
            t2 = time.perf_counter_ns()
            p.update(req.key, truth[pos:pos + emit])
            us.append((t1 - t0 + time.perf_counter_ns() - t2) / 1e3)
            steps += 1
            tokens += emit
            pos += emit
        p.stop_request(req.key, finished=True)
    return tokens, us


def timed_lifecycle(p: Proposer, sink: list[int]) -> Proposer:
    """Add the ns spent in ``p.start_request`` / ``p.stop_request`` to ``sink[0]`` /
    ``sink[1]`` (wraps the bound methods of this instance)."""
    start, stop = p.start_request, p.stop_request

    def start_request(req_id, prompt_token_ids):
        t0 = time.perf_counter_ns()
        start(req_id, prompt_token_ids)
        sink[0] += time.perf_counter_ns() - t0

    def stop_request(req_id, finished=True):
        t0 = time.perf_counter_ns()
        stop(req_id, finished)
        sink[1] += time.perf_counter_ns() - t0

    p.start_request, p.stop_request = start_request, stop_request
    return p


def summarize(results, lifecycle_ns: list[int]) -> dict:
    """Tau, draft counts and step times of one mode; ``lifecycle_ns``: total ns in
    start_request / stop_request over the same requests."""
    us = np.concatenate([r.step_us for r in results])
    steps = sum(r.steps for r in results)
    out_tokens = sum(r.output_tokens for r in results)
    drafted = sum(r.drafted for r in results)
    accepted = sum(r.accepted for r in results)
    n = max(len(results), 1)
    return {"tau": out_tokens / max(steps, 1), "steps": steps, "drafted": drafted,
            "accepted": accepted, "wasted": drafted - accepted,
            "us_median": float(np.median(us)), "us_p99": float(np.percentile(us, 99)),
            "start_us_per_request": lifecycle_ns[0] / 1e3 / n,
            "stop_us_per_request": lifecycle_ns[1] / 1e3 / n,
            "us_per_step_amortized": (float(us.sum()) + sum(lifecycle_ns) / 1e3)
            / max(steps, 1)}


def prompt_insertion(requests: list[Request], pia_cls, n_tokens: int = 32768,
                     repeats: int = 5) -> dict:
    """Start a request with an ``n_tokens`` prompt (real prompts concatenated) on a warm
    proposer and draft once (ours indexes the prompt lazily, in that first draft);
    PIA: ``put`` of the same prompt. Medians over ``repeats`` fresh requests, ms."""
    toks: list[int] = []
    while len(toks) < n_tokens:
        for r in requests:
            toks += list(r.prompt)
    toks = toks[:n_tokens]
    ours = MemoryDecodingProposer(8)
    start, first, pia_put = [], [], []
    for i in range(repeats + 1):  # the first round warms up (JIT)
        t0 = time.perf_counter()
        ours.start_request(f"long{i}", toks)
        t1 = time.perf_counter()
        ours.propose([f"long{i}"])
        t2 = time.perf_counter()
        ours.stop_request(f"long{i}", finished=False)
        if i:
            start.append(1e3 * (t1 - t0))
            first.append(1e3 * (t2 - t0))
            if pia_cls is not None:
                pia = PiaProposer(8, pia_cls, set())
                t0 = time.perf_counter()
                pia.start_request("long", toks)
                pia_put.append(1e3 * (time.perf_counter() - t0))
    out = {"prompt_tokens": n_tokens, "ours_start_ms": float(np.median(start)),
           "ours_start_and_first_draft_ms": float(np.median(first))}
    if pia_put:
        out["pia_put_ms"] = float(np.median(pia_put))
    return out


def _maker(mode: str, k: int, pia_cls, stop: set[int]):
    if mode.startswith("pia"):
        return lambda: PiaProposer(k, pia_cls, stop)
    if mode == "naive":
        return lambda: NaiveProposer(k)
    return lambda: MemoryDecodingProposer(k, dynamic_algo=(mode == "ours_dynamic"))


def run_file(path: Path, pia_cls, limit, ks, budget, cache, modes) -> dict:
    streams = load_streams(path, TOKENIZER_RULES, (), limit, cache)
    by_name = {t.name: t for t in cache.values()}
    res: dict = {"requests": sum(len(s.requests) for s in streams),
                 "tokenizers": [s.tokenizer for s in streams]}
    chain_modes = [m for m in modes if not m.endswith("_tree")]
    for k in ks:
        row: dict = {}
        results: dict[str, list] = {m: [] for m in chain_modes}
        lifecycle = {m: [0, 0] for m in chain_modes}
        for s in streams:
            stop = pia_stop_words(by_name[s.tokenizer])
            sinks = {m: [0, 0] for m in chain_modes}  # the replaying proposer's (made last)

            def timed_make(mode, sinks=sinks, stop=stop):
                make = _maker(mode, k, pia_cls, stop)

                def made():
                    sinks[mode] = [0, 0]
                    return timed_lifecycle(make(), sinks[mode])
                return made

            for m, r in replay_interleaved(s.requests, {m: timed_make(m) for m in chain_modes},
                                           k).items():
                results[m] += r
                lifecycle[m] = [a + b for a, b in zip(lifecycle[m], sinks[m])]
        for m in chain_modes:
            row[m] = summarize(results[m], lifecycle[m])
        for mode in (m for m in modes if m.endswith("_tree")):
            tree_steps, tree_tokens, tree_us = 0, 0, []
            for s in streams:
                make = _maker(mode, k, pia_cls, pia_stop_words(by_name[s.tokenizer]))
                tokens, us = replay_tree(s.requests, make, k, budget)
                tree_steps += len(us)
                tree_tokens += tokens
                tree_us += us
            row[mode] = {"tau": tree_tokens / max(tree_steps, 1), "budget": budget,
                         "max_depth": k, "us_median": float(np.median(tree_us)),
                         "us_p99": float(np.percentile(tree_us, 99))}
        if "ours" in row and "pia" in row:
            row["tau_ratio_vs_pia"] = row["ours"]["tau"] / row["pia"]["tau"]
            row["speedup_vs_pia_median"] = row["pia"]["us_median"] / row["ours"]["us_median"]
            row["speedup_vs_pia_amortized"] = (row["pia"]["us_per_step_amortized"]
                                               / row["ours"]["us_per_step_amortized"])
        if "ours_tree" in row and "pia_tree" in row:
            row["tree_tau_ratio_vs_pia"] = row["ours_tree"]["tau"] / row["pia_tree"]["tau"]
        if "ours_dynamic" in row and "ours" in row:
            row["dynamic_tau_change"] = row["ours_dynamic"]["tau"] / row["ours"]["tau"] - 1
            row["dynamic_wasted_change"] = (row["ours_dynamic"]["wasted"]
                                            / max(row["ours"]["wasted"], 1) - 1)
        res[f"k{k}"] = row
    res["memory"] = memory_use(streams, max(ks))
    return res


def memory_use(streams, k: int) -> dict:
    """Trie size after counting every request of the file (first tokenizer stream;
    the trie counts outputs and the prompts' last ``branch_length - 1`` tokens), and
    the per-request state bytes per context token of the longest request."""
    p = MemoryDecodingProposer(k)
    per_token = 0.0
    for r in streams[0].requests:
        p.start_request(r.key, r.prompt)
        p.update(r.key, list(r.output))
        p.propose([r.key])
        per_token = max(per_token, p.state[r.key].nbytes / len(p.tokens[r.key]))
        p.stop_request(r.key)
    counted = p.trie.count(())
    return {"trie_nodes": p.trie.num_nodes, "trie_bytes": p.trie.nbytes,
            "trie_bytes_per_node_of_capacity": p.trie.nbytes / int(p.trie.arena[1]),
            "trie_prunes": p.trie.num_prunes, "counted_tokens": counted,
            "trie_bytes_per_counted_token": p.trie.nbytes / max(counted, 1),
            "request_state_bytes_per_context_token_max": per_token}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pia", help="path of PIA's lookahead_cache.py (outside this repo)")
    ap.add_argument("--traces", default=str(SHARED / "traces"),
                    help="directory of *.jsonl traces (default: ../shared/traces)")
    ap.add_argument("--files", nargs="*", help="trace file names in --traces (default: all)")
    ap.add_argument("--limit", type=int, default=None, help="requests per file (default: all)")
    ap.add_argument("--k", type=int, nargs="*", default=[8, 16],
                    help="draft caps (default: 8 16)")
    ap.add_argument("--tree-budget", type=int, default=PIA_DECODING_LENGTH,
                    help=f"tree draft nodes (default: {PIA_DECODING_LENGTH})")
    ap.add_argument("--modes", nargs="*", choices=ALL_MODES,
                    help="default: all, the pia ones only with --pia")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "memory_vs_pia.json"),
                    help="JSON report (default: benchmarks/results/memory_vs_pia.json)")
    args = ap.parse_args()
    files = trace_files(ap, args.traces, args.files)
    if args.pia and not Path(args.pia).is_file():
        ap.error(f"--pia {args.pia}: no such file")
    if args.modes and not args.pia and any(m.startswith("pia") for m in args.modes):
        ap.error("modes pia / pia_tree need --pia (PIA's lookahead_cache.py)")
    pia_cls = load_pia(args.pia) if args.pia else None
    modes = args.modes or [m for m in ALL_MODES if args.pia or not m.startswith("pia")]
    cache: dict = {}
    report = {"machine": platform.processor() or platform.machine(), "limit": args.limit,
              "ks": args.k, "modes": modes, "pia": {"decoding_length": PIA_DECODING_LENGTH,
                                                     "branch_length": PIA_BRANCH_LENGTH,
                                                     "max_query_length": PIA_QUERY},
              "files": {}}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    first_reqs = None
    for f in files:
        t0 = time.time()
        res = run_file(f, pia_cls, args.limit, args.k, args.tree_budget, cache, modes)
        report["files"][f.name] = res
        for k in args.k:
            row = res[f"k{k}"]
            print(f"{f.name} k={k}: " + "  ".join(
                f"{m} tau {row[m]['tau']:.3f} {row[m]['us_median']:.2f}us" for m in modes),
                f"ratio {row.get('tau_ratio_vs_pia', float('nan')):.3f}",
                f"speedup {row.get('speedup_vs_pia_median', float('nan')):.1f}", flush=True)
        print(f"  ({time.time() - t0:.0f} s)", flush=True)
        if first_reqs is None:
            first_reqs = load_streams(f, TOKENIZER_RULES, (), args.limit, cache)[0].requests
        out.write_text(json.dumps(report, indent=1))
    if first_reqs:
        report["prompt_32k"] = prompt_insertion(first_reqs, pia_cls)
        print("prompt_32k", report["prompt_32k"])
    out.write_text(json.dumps(report, indent=1))
    print("wrote", out)


if __name__ == "__main__":
    main()
