"""Adaptive speculation offline: the e2e benchmark's batch-1 run, replayed on the default
model's own outputs with modelled step costs.

``e2e.py`` at batch 1 sends, to one engine per configuration, a warm-up copy chat and then
the first ``--prompts`` chats of each workload one at a time (``--max-tokens`` each). On the
project's 2-core VMs its ratios wander by up to +-10% between identical engines, more than
the differences between draft rules. This script replays that sequence without the engine:

1. once, the default model (SmolLM2-135M-Instruct, fp32, greedy, no speculation) generates
   every workload chat (256 tokens) and the warm-up chat (48 tokens); cached as JSON
   (``--outputs``, generated when missing);
2. for each method, one proposer (state kept across the whole sequence, as in the engine)
   drafts at every step; the drafts shown are chosen by the same code as in the engine
   (:func:`vllm_specext.adaptive.shown_drafts`, with its controller and measured cost
   model), the longest prefix equal to the recorded output is accepted, plus the bonus
   token;
3. each step takes a modelled time: 1 for a plain step, ``1 + fixed + per_token * drafts``
   for a verified one (``--costs``). The defaults span what in-process engines on the
   project's VMs measured at batch 1 (``benchmarks/README.md``, "Adaptive speculation"):
   a verified step of 3 and 5 tokens +19% and +17% over a plain one, of 9 tokens +32% to
   +109%; ``slope`` is the cost model of one e2e engine (``suffix``, summarization,
   2026-12-02): a plain step 89 ms, a verified one of 2, 3, 4 and 9 tokens 89-92, 101,
   113 and 148-155 ms, no fixed cost and ~8.5% of a step per draft token.

The reference, ``vllm_ngram``, is vLLM's rule: our ``ngram`` at vLLM's settings
(``prompt_lookup_min`` 2, ``prompt_lookup_max`` 5: the same drafts as vLLM's kernel on the
e2e workloads; README "Configuration keys") shown in full whenever it matches. Reported per workload
and cost: modelled tok/s relative to a plain step, tau, and each method's ratio to
``vllm_ngram``; JSON and a PNG (``--out``).

Usage::

    python benchmarks/adaptive_replay.py [--methods ngram,suffix,memory_decoding,lookahead]
        [--prompts 4] [--max-tokens 96] [--costs lo=0.12,0.035 hi=0.15,0.08 vhi=0.30,0.09 slope=0,0.085]
        [--startup-slowdown 1] [--outputs benchmarks/results/workload_outputs.json]
        [--out benchmarks/results/adaptive_replay.json]

``lookahead``'s Jacobi feedback needs the target model, so offline it drafts from its
n-gram pools and prompt lookup only.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from workloads import WORKLOADS, warmup_chats

from vllm_specext.adaptive import DraftLengthController, StepCostModel, shown_drafts
from vllm_specext.config import MethodConfig
from vllm_specext.proposers import build_proposer
from vllm_specext.replay.simulate import chain_accept

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
OUR_METHODS = ("ngram", "suffix", "memory_decoding", "lookahead")
DEFAULT_COSTS = ("lo=0.12,0.035", "hi=0.15,0.08", "vhi=0.30,0.09", "slope=0,0.085")
REFERENCE = "vllm_ngram"
GENERATED_TOKENS = 256
WARMUP_TOKENS = 48  # as e2e.py's warm-up


def generate_outputs(path: Path) -> dict:
    """Greedy outputs of the default model (fp32, no speculation) for every workload chat
    and one warm-up chat: ``{workload: [{"prompt": ids, "output": ids}, ...],
    "warmup": [...]}``, written to ``path``."""
    from vllm import SamplingParams

    from vllm_specext.engine_run import start_engine

    llm = start_engine({"spec": None, "enable_prefix_caching": False})
    tok = llm.get_tokenizer()

    def run(chats: list, max_tokens: int) -> list[dict]:
        prompts = [tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True)
                   for c in chats]
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens),
                            use_tqdm=False)
        return [{"prompt": list(o.prompt_token_ids), "output": list(o.outputs[0].token_ids)}
                for o in outs]

    data = {w: run(chats, GENERATED_TOKENS) for w, chats in WORKLOADS.items()}
    data["warmup"] = run(warmup_chats(1), WARMUP_TOKENS)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return data


def parse_cost(spec: str) -> tuple[str, float, float]:
    """``name=fixed,per_token`` -> ``(name, fixed, per_token)`` (both >= 0)."""
    name, sep, values = spec.partition("=")
    parts = values.split(",")
    try:
        fixed, per = (float(x) for x in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--costs {spec!r}: expected NAME=FIXED,PER_TOKEN") from None
    if not sep or not name or fixed < 0 or per < 0:
        raise argparse.ArgumentTypeError(f"--costs {spec!r}: expected NAME=FIXED,PER_TOKEN, "
                                         "both >= 0")
    return name, fixed, per


def replay_batch1(sequence: list[tuple[str, dict]], method: str, fixed: float, per: float,
                  k: int = 8, startup_slowdown: float = 1.0) -> dict[str, dict]:
    """One proposer over ``sequence`` (``(workload, {"prompt", "output"})`` in order), one
    request at a time, as the adapter drives it at batch 1.

    ``method`` is one of ours (adaptive on, its default keys) or :data:`REFERENCE`;
    ``startup_slowdown``: the cost model times the warm-up request's steps this many times
    slower than they are (an engine starting while others start on the same cores).
    Returns per workload ``{"tokens", "steps", "time" (plain steps), "speed" (tokens per
    plain-step time), "tau"}``; the warm-up request is not counted.
    """
    reference = method == REFERENCE
    p = build_proposer("ngram" if reference else method, num_speculative_tokens=k)
    keys = MethodConfig.model_fields  # the engine's defaults
    controller = (None if reference else
                  DraftLengthController(k, decay=keys["adaptive_decay"].default))
    cost_model = StepCostModel(margin=keys["adaptive_margin"].default)
    tally: dict[str, list[float]] = defaultdict(lambda: [0, 0, 0.0])
    for i, (workload, req) in enumerate(sequence):
        rid, truth = f"r{i}", req["output"]
        p.start_request(rid, req["prompt"])
        p.update(rid, truth[:1])  # the prefill step's token
        pos = 1
        while pos < len(truth):
            asks = controller is None or controller.proposes(rid)
            drafts = p.propose([rid], [k if asks else 0])
            if controller is not None:
                drafts = shown_drafts(controller, cost_model, [rid], drafts,
                                      p.last_kinds or [0], 1)
            draft = drafts[0]
            committed = truth[pos:pos + chain_accept(draft, truth, pos) + 1]
            seconds = 1.0 + (fixed + per * len(draft) if draft else 0.0)
            slow = startup_slowdown if workload == "warmup" else 1.0
            cost_model.observe(1 + len(draft), slow * seconds, bool(draft), rows=1)
            p.update(rid, committed)
            if controller is not None:
                controller.observe(rid, committed)
            t = tally[workload]
            t[0] += len(committed)
            t[1] += 1
            t[2] += seconds
            pos += len(committed)
        p.stop_request(rid, finished=True)
        if controller is not None:
            controller.forget(rid)
    tally.pop("warmup", None)
    return {w: {"tokens": t[0], "steps": t[1], "time": t[2], "speed": t[0] / t[2],
                "tau": t[0] / t[1]} for w, t in tally.items()}


def build_sequence(data: dict, prompts: int, max_tokens: int) -> list[tuple[str, dict]]:
    """e2e.py's batch-1 order: the warm-up chat, then each workload's first ``prompts``
    chats, outputs cut to ``max_tokens``."""
    seq = [("warmup", data["warmup"][0])]
    for w in WORKLOADS:
        seq += [(w, {"prompt": r["prompt"], "output": r["output"][:max_tokens]})
                for r in data[w][:prompts]]
    return seq


def plot(report: dict, path: Path) -> None:
    """Per cost, bars of each method's ratio to the reference per workload."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    costs = list(report["results"])
    fig, axes = plt.subplots(1, len(costs), figsize=(5 * len(costs), 4), squeeze=False)
    for ax, cost in zip(axes[0], costs):
        res = report["results"][cost]
        workloads = list(res[REFERENCE])
        methods = [m for m in res if m != REFERENCE]
        width = 0.8 / max(1, len(methods))
        for j, m in enumerate(methods):
            ax.bar([i + j * width for i in range(len(workloads))],
                   [res[m][w]["speed"] / res[REFERENCE][w]["speed"] for w in workloads],
                   width, label=m)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(workloads))])
        ax.set_xticklabels(workloads, rotation=20, ha="right", fontsize=8)
        ax.set_title(f"cost {cost}: modelled tok/s / {REFERENCE}", fontsize=9)
        ax.set_ylim(0.8, None)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--methods", default=",".join(OUR_METHODS), help="our methods, comma-separated")
    ap.add_argument("--prompts", type=int, default=4, help="chats per workload (e2e's --batch1-prompts)")
    ap.add_argument("--max-tokens", type=int, default=96, help="tokens per request (<= 256)")
    ap.add_argument("--costs", nargs="+", default=list(DEFAULT_COSTS), type=parse_cost,
                    help="step costs NAME=FIXED,PER_TOKEN: a verified step of n tokens "
                    "takes 1 + FIXED + PER_TOKEN * (n - 1) plain steps")
    ap.add_argument("--startup-slowdown", type=float, default=1.0,
                    help="the cost model times the warm-up request's steps this many times "
                    "slower (engines starting together on the same cores; >= 1)")
    ap.add_argument("--outputs", default=str(RESULTS / "workload_outputs.json"),
                    help="cached model outputs (generated with the engine when missing)")
    ap.add_argument("--out", default=str(RESULTS / "adaptive_replay.json"))
    args = ap.parse_args(argv)
    methods = [m for m in args.methods.split(",") if m]
    unknown = sorted(set(methods) - set(OUR_METHODS))
    if unknown or not methods:
        ap.error(f"--methods: unknown {unknown}; allowed: {', '.join(OUR_METHODS)}")
    if not 1 <= args.prompts <= 32 or not 2 <= args.max_tokens <= GENERATED_TOKENS:
        ap.error(f"--prompts in [1, 32], --max-tokens in [2, {GENERATED_TOKENS}]")
    if not args.startup_slowdown >= 1.0:
        ap.error(f"--startup-slowdown must be >= 1, got {args.startup_slowdown}")
    costs = [parse_cost(c) if isinstance(c, str) else c for c in args.costs]  # defaults
    outputs = Path(args.outputs)
    data = json.loads(outputs.read_text()) if outputs.exists() else generate_outputs(outputs)
    sequence = build_sequence(data, args.prompts, args.max_tokens)
    results: dict[str, dict] = {}
    for name, fixed, per in costs:
        res = {m: replay_batch1(sequence, m, fixed, per, startup_slowdown=args.startup_slowdown)
               for m in [REFERENCE] + methods}
        results[name] = res
        print(f"\ncost {name}: verified step = 1 + {fixed} + {per} x draft tokens "
              f"(plain step = 1); tok/s ratio to {REFERENCE} (tau)")
        print(f"{'workload':16s} {REFERENCE + ' tok/s':>16s}" + "".join(f" {m:>18s}" for m in methods))
        for w, ref in res[REFERENCE].items():
            print(f"{w:16s} {ref['speed']:10.3f} ({ref['tau']:.2f})" + "".join(
                f" {res[m][w]['speed'] / ref['speed']:11.3f} ({res[m][w]['tau']:.2f})"
                for m in methods))
    report = {"meta": {"command": " ".join(["benchmarks/adaptive_replay.py"] + sys.argv[1:]),
                       "prompts": args.prompts, "max_tokens": args.max_tokens,
                       "startup_slowdown": args.startup_slowdown,
                       "costs": {n: {"fixed": f, "per_token": p} for n, f, p in costs}},
              "results": results}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    plot(report, out.with_suffix(".png"))
    print(f"\nwrote {out} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
