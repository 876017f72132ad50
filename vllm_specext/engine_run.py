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
    """Run one job in this process.

    Args:
        job: ``{"prompts": list[str] | None, "chats": list[list[dict]] | None,
            "spec": dict | None, "model": str | None, "dtype": "float32",
            "max_tokens": int, "temperature": float, "seed": int, "n": int,
            "warmup": bool, "max_model_len": int, "sampling": dict (extra SamplingParams),
            "batch_size": int | None (prompts per ``generate`` call; None = all at once)}``.
            ``chats`` are rendered with the model's chat template.

    Returns:
        ``{"texts": [...], "token_ids": [[...]], "seconds": float (generate wall time),
        "output_tokens": int, "num_drafts", "num_draft_tokens", "num_accepted_tokens",
        "mean_acceptance_length", "tau", "tokens_per_s"}``. ``tau`` (output tokens per target
        step) is estimated as output / (output - accepted).
    """
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", DEFAULT_KV_CACHE_GIB)
    from vllm import LLM, SamplingParams

    from vllm_specext.model import default_model_path

    llm = LLM(model=job.get("model") or str(default_model_path()),
              dtype=job.get("dtype", "float32"), enforce_eager=True, seed=job.get("seed", 0),
              max_model_len=job.get("max_model_len", 4096),
              speculative_config=job.get("spec"), disable_log_stats=False)
    params = SamplingParams(temperature=job.get("temperature", 0.0),
                            max_tokens=job.get("max_tokens", 128), n=job.get("n", 1),
                            seed=job.get("request_seed"), **job.get("sampling", {}))
    if job.get("chats"):
        tok = llm.get_tokenizer()
        prompts = [tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True)
                   for c in job["chats"]]
    else:
        prompts = job["prompts"]
    if job.get("warmup", True):  # one-time costs (numba, first spec step) outside timing
        llm.generate(["Warm up: count 1 2 3 4 5 6 7 8"],
                     SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)
    before = llm.get_metrics()
    start = time.perf_counter()
    step = job.get("batch_size") or len(prompts)
    outs = [o for i in range(0, len(prompts), step)
            for o in llm.generate(prompts[i:i + step], params, use_tqdm=False)]
    seconds = time.perf_counter() - start
    after = llm.get_metrics()

    def delta(name: str) -> float:
        return _counter(after, name) - _counter(before, name)

    drafts = delta("vllm:spec_decode_num_drafts")
    draft_tokens = delta("vllm:spec_decode_num_draft_tokens")
    accepted = delta("vllm:spec_decode_num_accepted_tokens")
    token_ids = [list(c.token_ids) for o in outs for c in o.outputs]
    n_out = sum(len(t) for t in token_ids)
    return {
        "texts": [c.text for o in outs for c in o.outputs],
        "token_ids": token_ids,
        "seconds": seconds,
        "output_tokens": n_out,
        "tokens_per_s": n_out / seconds if seconds else 0.0,
        "num_drafts": int(drafts),
        "num_draft_tokens": int(draft_tokens),
        "num_accepted_tokens": int(accepted),
        "mean_acceptance_length": 1 + accepted / drafts if drafts else 1.0,
        "tau": n_out / (n_out - accepted) if n_out > accepted else 1.0,
    }


def generate_in_subprocess(job: dict[str, Any], timeout: float = 900) -> dict[str, Any]:
    """Run :func:`generate` in a fresh Python process (a fresh engine).

    Raises:
        RuntimeError: the child failed; the message carries the tail of its output.
    """
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        proc = subprocess.run([sys.executable, "-m", "vllm_specext.engine_run", out],
                              input=json.dumps(job), capture_output=True, text=True,
                              timeout=timeout)
        if proc.returncode != 0 or not os.path.exists(out):
            raise RuntimeError(f"engine run failed (exit {proc.returncode}):\n"
                               f"{proc.stderr[-4000:]}\n{proc.stdout[-2000:]}")
        with open(out) as f:
            return json.load(f)


def main() -> None:
    result = generate(json.loads(sys.stdin.read()))
    with open(sys.argv[1], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
