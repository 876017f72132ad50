"""Teacher-forced replay of ``ngram`` over real traces, to pick prompt_lookup_min/max.

Each request: the proposer starts with the tokenized prompt; each step it drafts up to
k tokens, the longest prefix equal to the recorded output is accepted, plus one bonus
token (the next recorded token). tau = output tokens / steps (1.0 = no speedup).
Drafting costs verification work, so each setting also gets a modelled speedup
``tau / (1 + c * drafted_per_step)``, where ``c`` is the cost of verifying one draft
token relative to a plain decode step (about 0 when decoding is memory-bound at small
batch, larger at high batch or on CPU).
Traces and tokenizers come from ``../shared`` (see ``shared/traces/README.md``).

Usage: python benchmarks/ngram_defaults.py [--k 8] [--limit 200]
       [--out benchmarks/results/ngram_defaults.json]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from vllm_specext.proposers.ngram import NgramProposer

SHARED = Path(__file__).resolve().parents[2] / "shared"
BOUNDS = [(1, 3), (2, 5), (3, 5), (5, 5)]
VICUNA_SYSTEM = ("A chat between a curious user and an artificial intelligence assistant. "
                 "The assistant gives helpful, detailed, and polite answers to the user's "
                 "questions.")


def cl100k():
    """tiktoken's cl100k_base, its ranks read from the shared file instead of the network."""
    import tiktoken
    import tiktoken_ext.openai_public as public
    from tiktoken.load import load_tiktoken_bpe
    path = str(SHARED / "tokenizers/cl100k/cl100k_base.tiktoken")
    public.load_tiktoken_bpe = lambda *_a, **_k: load_tiktoken_bpe(path)
    enc = tiktoken.Encoding(**public.cl100k_base())
    return lambda text: enc.encode(text, disallowed_special=())


def llama2():
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=str(SHARED / "tokenizers/llama2/tokenizer.model"))
    return sp.encode


def vicuna_prompt(messages: list[dict]) -> str:
    """FastChat vicuna_v1.1 (turns joined with ``</s>``), ending with ``ASSISTANT:``."""
    text = VICUNA_SYSTEM
    for m in messages:
        if m["role"] == "user":
            text += f" USER: {m['content']}"
        elif m["role"] == "assistant":
            text += f" ASSISTANT: {m['content']}</s>"
    return text + " ASSISTANT:"


#: file -> (tokenizer factory, prompt builder)
TRACES = {
    "llma_cnndm.jsonl": (cl100k, lambda r: r["prompt"]),
    "llma_rag.jsonl": (cl100k, lambda r: r["prompt"]),
    "openhands_agent_snapshot.jsonl": (cl100k, lambda r: r["prompt"]),
    "specbench_vicuna7b_vanilla_greedy.jsonl": (llama2, lambda r: vicuna_prompt(r["messages"])),
}


def replay(p: NgramProposer, requests: list[tuple[list[int], list[int]]]) -> dict:
    """Teacher-forced replay; returns tau, steps and tokens over all requests."""
    steps = tokens = drafted = accepted = 0
    for prompt, truth in requests:
        p.start_request("r", prompt)
        pos = 0
        while pos < len(truth):
            draft = p.propose(["r"])[0]
            a = 0
            while a < len(draft) and pos + a < len(truth) and draft[a] == truth[pos + a]:
                a += 1
            commit = truth[pos:pos + a + 1]
            p.update("r", commit)
            pos += len(commit)
            steps += 1
            drafted += len(draft)
            accepted += a
        tokens += len(truth)
        p.stop_request("r")
    return {"tau": tokens / max(steps, 1), "steps": steps, "tokens": tokens,
            "accept_rate": accepted / max(drafted, 1),
            "drafted_per_step": drafted / max(steps, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--limit", type=int, default=200, help="requests per trace file")
    ap.add_argument("--traces", nargs="+", default=list(TRACES))
    ap.add_argument("--bounds", nargs="+", default=[f"{lo},{hi}" for lo, hi in BOUNDS],
                    help="min,max pairs")
    ap.add_argument("--verify-cost", type=float, nargs="+", default=[0.02, 0.05, 0.1],
                    help="c values of the speedup model")
    ap.add_argument("--out", default="benchmarks/results/ngram_defaults.json")
    args = ap.parse_args()

    results = {}
    for name in args.traces:
        make_tok, build = TRACES[name]
        encode = make_tok()
        rows = [json.loads(line) for line in open(SHARED / "traces" / name)][: args.limit]
        reqs = [(encode(build(r)), encode(r["output"])) for r in rows]
        results[name] = {}
        for bounds in args.bounds:
            lo, hi = (int(x) for x in bounds.split(","))
            t0 = time.perf_counter()
            res = replay(NgramProposer(args.k, lo, hi), reqs)
            res["seconds"] = round(time.perf_counter() - t0, 2)
            res["model_speedup"] = {str(c): res["tau"] / (1 + c * res["drafted_per_step"])
                                    for c in args.verify_cost}
            results[name][bounds] = res
            model = " ".join(f"c={c}:{v:.3f}" for c, v in res["model_speedup"].items())
            print(f"{name[:24]:24s} ({lo},{hi}) tau={res['tau']:.3f} "
                  f"accept={res['accept_rate']:.3f} drafted/step={res['drafted_per_step']:.2f} "
                  f"speedup {model} [{len(reqs)} req]", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"k": args.k, "limit": args.limit, "results": results}, indent=1))
    for bounds in args.bounds:  # unweighted mean over the trace files
        rows = [results[n][bounds] for n in args.traces]
        tau = sum(r["tau"] for r in rows) / len(rows)
        model = " ".join(f"c={c}:{sum(r['model_speedup'][str(c)] for r in rows) / len(rows):.3f}"
                         for c in args.verify_cost)
        print(f"mean over files ({bounds}): tau={tau:.3f} {model}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
