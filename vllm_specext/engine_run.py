"""Run vLLM offline (``LLM.generate``) for one speculative config in a fresh process.

A fresh engine per configuration keeps runs independent: no prefix-cache hits and no
cross-request proposer state carried from another configuration. Used by the demo,
the end-to-end tests and the benchmarks.

Command line (job JSON on stdin, result JSON written to OUT.json)::

    echo '{"spec": {"method": "ngram"}, "prompts": ["..."]}' | python -m vllm_specext.engine_run OUT.json
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

DEFAULT_KV_CACHE_GIB = "2"


def _counter(metrics: list, name: str) -> float:
    """Sum of a vLLM metric's values across engines (0 when absent)."""
    total = 0.0
    for m in metrics:
        if m.name == name:
            total += getattr(m, "value", 0) or 0
    return total


def generate(job: dict[str, Any]) -> dict[str, Any]:
    """Start one engine and run a job (or each of ``job["cells"]``) in this process.

    Args:
        job: engine keys ``{"spec": dict | None, "model": str | None, "dtype": "float32",
            "seed": int, "max_model_len": int, "enable_prefix_caching": bool,
            "warmup": bool}`` plus either the keys of one cell or ``"cells": [cell, ...]``.
            A cell: ``{"prompts": list[str] | None, "chats": list[list[dict]] | None
            (rendered with the model's chat template), "max_tokens": int,
            "temperature": float, "n": int, "request_seed": int | None, "sampling": dict
            (extra SamplingParams), "batch_size": int | None (prompts per ``generate`` call;
            None = all at once)}``.

    Returns:
        One result per cell (``{"cells": [...]}`` when cells were given), each
        ``{"texts", "token_ids", "seconds" (generate wall time), "output_tokens",
        "tokens_per_s", "ttft_s" and "tpot_s" (per-request lists, seconds), "num_drafts",
        "num_draft_tokens", "num_accepted_tokens", "mean_acceptance_length", "tau"}``;
        ``tau`` (output tokens per target step) is estimated as output / (output - accepted).
    """
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", DEFAULT_KV_CACHE_GIB)
    from vllm import LLM, SamplingParams

    from vllm_specext.model import default_model_path

    llm = LLM(model=job.get("model") or str(default_model_path()),
              dtype=job.get("dtype", "float32"), enforce_eager=True, seed=job.get("seed", 0),
              max_model_len=job.get("max_model_len", 4096),
              enable_prefix_caching=job.get("enable_prefix_caching", True),
              speculative_config=job.get("spec"), disable_log_stats=False)
    if job.get("warmup", True):  # one-time costs (numba, first spec step) outside timing
        llm.generate(["Warm up: count 1 2 3 4 5 6 7 8"],
                     SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)
    # Every configuration, no speculation included, runs with its workers' start-up heap
    # frozen (what a vllm_specext drafter does by itself), so that a ~0.4 s full garbage
    # collection does not land in one configuration's timing and not in another's.
    llm.collective_rpc("specext_freeze_gc")
    if "cells" in job:
        return {"cells": [_run_cell(llm, cell) for cell in job["cells"]]}
    return _run_cell(llm, job)


def _run_cell(llm: Any, cell: dict[str, Any]) -> dict[str, Any]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=cell.get("temperature", 0.0),
                            max_tokens=cell.get("max_tokens", 128), n=cell.get("n", 1),
                            seed=cell.get("request_seed"), **cell.get("sampling", {}))
    if cell.get("chats"):
        tok = llm.get_tokenizer()
        prompts = [tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True)
                   for c in cell["chats"]]
    else:
        prompts = cell["prompts"]
    before = llm.get_metrics()
    start = time.perf_counter()
    step = cell.get("batch_size") or len(prompts)
    outs = [o for i in range(0, len(prompts), step)
            for o in llm.generate(prompts[i:i + step], params, use_tqdm=False)]
    seconds = time.perf_counter() - start
    after = llm.get_metrics()

    def delta(name: str) -> float:
        return _counter(after, name) - _counter(before, name)

    drafts = delta("vllm:spec_decode_num_drafts")
    accepted = delta("vllm:spec_decode_num_accepted_tokens")
    token_ids = [list(c.token_ids) for o in outs for c in o.outputs]
    n_out = sum(len(t) for t in token_ids)
    ttft, tpot = [], []
    for o in outs:
        m = o.metrics
        if m is None or not m.first_token_ts:
            continue
        ttft.append(m.first_token_latency)
        n = len(o.outputs[0].token_ids)
        if n > 1:
            tpot.append((m.last_token_ts - m.first_token_ts) / (n - 1))
    return {
        "texts": [c.text for o in outs for c in o.outputs],
        "token_ids": token_ids,
        "seconds": seconds,
        "output_tokens": n_out,
        "tokens_per_s": n_out / seconds if seconds else 0.0,
        "ttft_s": ttft,
        "tpot_s": tpot,
        "num_drafts": int(drafts),
        "num_draft_tokens": int(delta("vllm:spec_decode_num_draft_tokens")),
        "num_accepted_tokens": int(accepted),
        "mean_acceptance_length": 1 + accepted / drafts if drafts else 1.0,
        "tau": n_out / (n_out - accepted) if n_out > accepted else 1.0,
    }


def run_json_child(args: list[str], job: dict[str, Any], timeout: float = 900) -> dict[str, Any]:
    """Run ``python <args> <result path>`` with ``job`` as JSON on stdin and return the
    JSON the child wrote to the result path.

    Raises:
        RuntimeError: the child failed; the message carries the tail of its output.
        subprocess.TimeoutExpired: it ran longer than ``timeout`` seconds.
    """
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        proc = subprocess.run([sys.executable, *args, out], input=json.dumps(job),
                              capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0 or not os.path.exists(out):
            raise RuntimeError(f"child {args} failed (exit {proc.returncode}):\n"
                               f"{proc.stderr[-6000:]}\n{proc.stdout[-2000:]}")
        with open(out) as f:
            return json.load(f)


def generate_in_subprocess(job: dict[str, Any], timeout: float = 900) -> dict[str, Any]:
    """Run :func:`generate` in a fresh Python process (a fresh engine); errors as
    :func:`run_json_child`."""
    return run_json_child(["-m", "vllm_specext.engine_run"], job, timeout)


def main() -> None:
    result = generate(json.loads(sys.stdin.read()))
    with open(sys.argv[1], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
