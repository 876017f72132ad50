"""Per-step verification time: ``vllm_specext.verify.verify_drafts`` vs vLLM's
``rejection_sample``, same inputs, interleaved, in one process.

For every batch size B, draft length k and vocabulary V it times one verification step
of B requests with k drafts each (about half of the drafts equal the target argmax) in
three batch kinds: all greedy, all random (temperature 1, logits already processed) and
mixed (half greedy). Each measurement is the median of ``--reps`` calls (more, up to 50,
for points that take under 0.1 s; ``reps // 2`` above ``--big``); vLLM and ours alternate
call by call. Writes ``benchmarks/results/verify_cost.json`` and prints the
ratio table (ours / vLLM: below 1 means faster).

    python benchmarks/verify_cost.py                   # full grid, CPU
    python benchmarks/verify_cost.py --batch 1 16 --k 4 --vocab 49152 --reps 3
    python benchmarks/verify_cost.py --device cuda     # same table on a GPU
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from vllm_specext.verify import verify_drafts

KINDS = ("greedy", "random", "mixed")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _inputs(batch: int, k: int, vocab: int, kind: str, device: torch.device, seed: int):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    num = batch * k
    logits = torch.randn(num, vocab, generator=gen).mul_(3.0).to(device)
    argmax = logits.argmax(-1).cpu()
    drafts = torch.where(torch.rand(num, generator=gen) < 0.5, argmax,
                         torch.randint(0, vocab, (num,), generator=gen)).to(torch.int32)
    cu = torch.arange(1, batch + 1, dtype=torch.int32) * k
    bonus = torch.randint(0, vocab, (batch, 1), generator=gen)
    greedy = torch.zeros(batch, dtype=torch.bool)
    if kind == "greedy":
        greedy[:] = True
    elif kind == "mixed":
        greedy[: batch // 2] = True
    return logits, drafts.to(device), cu.to(device), bonus.to(device), greedy.to(device)


def _vllm_metadata(greedy: torch.Tensor):
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    batch, device = greedy.shape[0], greedy.device
    all_greedy, all_random = bool(greedy.all()), not bool(greedy.any())
    return SamplingMetadata(
        temperature=None if all_greedy else torch.where(greedy, 0.0, 1.0).to(device),
        all_greedy=all_greedy, all_random=all_random, top_p=None, top_k=None,
        generators={}, max_num_logprobs=None, no_penalties=True, prompt_token_ids=None,
        frequency_penalties=torch.zeros(batch, device=device),
        presence_penalties=torch.zeros(batch, device=device),
        repetition_penalties=torch.ones(batch, device=device),
        output_token_ids=[[] for _ in range(batch)], allowed_token_ids_mask=None,
        bad_words_token_ids={}, logitsprocs=LogitsProcessors())


def _time(fn, device: torch.device) -> float:
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0


def run(args) -> list[dict]:
    from vllm.platforms import current_platform

    current_platform.register_triton_kernel_overrides()
    import vllm.v1.sample.rejection_sampler as rs

    device = torch.device(args.device)
    rows = []
    for vocab in args.vocab:
        for batch in args.batch:
            for k in args.k:
                for kind in KINDS:
                    logits, drafts, cu, bonus, greedy = _inputs(batch, k, vocab, kind, device,
                                                               seed=batch * 1000 + k)
                    meta = _vllm_metadata(greedy)
                    nums = [k] * batch
                    is_greedy = True if meta.all_greedy else (False if meta.all_random
                                                               else greedy)

                    def vllm_step():
                        rs.rejection_sample(drafts, nums, k, cu, None, logits, bonus, meta)

                    def our_step():
                        verify_drafts(drafts, cu, logits, bonus, is_greedy, {},
                                      num_draft_tokens=nums, max_spec_len=k)

                    # warm-up; cheap points get more calls (up to ~0.5 s each) for a stable
                    # median on a shared machine, big ones only reps // 2
                    warm = max(_time(vllm_step, device), _time(our_step, device))
                    if batch * k * vocab >= args.big:
                        reps = max(1, args.reps // 2)
                    else:
                        reps = min(50, max(args.reps, int(0.5 / warm)))
                    t_vllm, t_ours = [], []
                    for _ in range(reps):
                        t_vllm.append(_time(vllm_step, device))
                        t_ours.append(_time(our_step, device))
                    row = dict(batch=batch, k=k, vocab=vocab, kind=kind, reps=reps,
                               vllm_ms=1e3 * statistics.median(t_vllm),
                               ours_ms=1e3 * statistics.median(t_ours))
                    row["ratio"] = row["ours_ms"] / row["vllm_ms"]
                    rows.append(row)
                    print(f"V={vocab:>6} B={batch:>3} k={k:>2} {kind:>6}: vLLM "
                          f"{row['vllm_ms']:9.2f} ms  ours {row['ours_ms']:9.2f} ms  "
                          f"ratio {row['ratio']:.3f}", flush=True)
                    del logits
    return rows


def _table(rows: list[dict]) -> str:
    """Ratio table (ours / vLLM), one line per (V, B, k), one column per batch kind."""
    lines = [f"{'vocab':>7} {'B':>4} {'k':>3} " + " ".join(f"{k:>8}" for k in KINDS)]
    by_key: dict[tuple, dict] = {}
    for r in rows:
        by_key.setdefault((r["vocab"], r["batch"], r["k"]), {})[r["kind"]] = r["ratio"]
    for (vocab, batch, k), ratios in by_key.items():
        cells = " ".join(f"{ratios[kind]:8.3f}" if kind in ratios else f"{'-':>8}"
                         for kind in KINDS)
        lines.append(f"{vocab:>7} {batch:>4} {k:>3} {cells}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--k", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--vocab", type=int, nargs="+", default=[49152, 151936])
    parser.add_argument("--reps", type=int, default=5, help="timed calls per point (median)")
    parser.add_argument("--big", type=float, default=2e8,
                        help="B*k*V above which only reps//2 calls are timed")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parent / "results" / "verify_cost.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = run(args)
    table = _table(rows)
    print("\nratio ours / vLLM (median per-step time; < 1 = ours faster)\n" + table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    import vllm

    meta = dict(device=args.device, threads=args.threads, torch=torch.__version__,
                vllm=getattr(vllm, "__version__", "?"), machine=platform.machine(),
                processor=platform.processor(), reps=args.reps)
    args.out.write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
