"""In-process vLLM engines for the engine tests: several engines, one after another, in
one child process.

The child runs vLLM without an engine-core or worker process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``, the ``uni`` executor), so a test module pays the
vLLM import once and each engine starts in seconds instead of a server's minute; only
one engine exists at a time. The parent calls :func:`run_job`; the child imports the
test module by path and calls its ``engine_job(job) -> dict`` (JSON in, JSON out),
which uses :func:`open_engine`, :func:`drive`, :func:`idle_state` and
:func:`close_engine`.

Everything but :func:`run_job` runs in the child: it imports vLLM, and in-process
engines must not run in the pytest process (they pin its threads).
"""
from __future__ import annotations

import gc
import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

_engines_opened = 0


def run_job(module_file: str, job: dict, timeout: float = 1200) -> dict:
    """Run ``engine_job(job)`` of the module at ``module_file`` in a fresh Python process.

    Raises:
        RuntimeError: the child failed (the message carries the tail of its output).
    """
    from vllm_specext.engine_run import run_json_child

    return run_json_child([__file__, module_file], job, timeout)


# ---------------------------------------------------------------------- child side
def open_engine(spec: dict | None, **kwargs: Any) -> Any:
    """An in-process ``LLM`` on the default model (fp32, eager, seed 0).

    ``kwargs`` go to ``LLM`` (e.g. ``max_model_len``, ``num_gpu_blocks_override``).
    """
    global _engines_opened
    from vllm import LLM
    from vllm.platforms import current_platform

    from vllm_specext.model import default_model_path

    if _engines_opened:
        # Each worker start rescans every loaded module to install vLLM's CPU kernel
        # overrides; the first scan installed them for the process, and a rescan trips
        # over numba's lazy wrappers once a proposer has loaded numba (see conftest.py).
        current_platform.register_triton_kernel_overrides = lambda: None
    _engines_opened += 1
    args = {"model": str(default_model_path()), "dtype": "float32", "enforce_eager": True,
            "seed": 0, "max_model_len": 2048, "distributed_executor_backend": "uni",
            "disable_log_stats": False, "speculative_config": spec, **kwargs}
    return LLM(**args)


def close_engine(llm: Any) -> None:
    """Shut the engine down and free its memory."""
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


def chat_prompt(llm: Any, content: str) -> dict:
    """A one-message chat rendered with the model's template, as token ids (what the
    server's chat endpoint feeds the engine)."""
    tok = llm.get_tokenizer()
    text = tok.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                   add_generation_prompt=True)
    return {"prompt_token_ids": tok(text, add_special_tokens=False)["input_ids"]}


def sampling_params(spec: dict) -> Any:
    """``SamplingParams`` from a JSON-able dict: ``SamplingParams`` keywords plus
    ``"json_schema"`` (structured output) and ``"stream"`` (delta outputs)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

    kw = dict(spec)
    if "json_schema" in kw:
        kw["structured_outputs"] = StructuredOutputsParams(json=kw.pop("json_schema"))
    if kw.pop("stream", False):
        kw["output_kind"] = RequestOutputKind.DELTA
    return SamplingParams(**kw)


def _logprobs(entries: Any) -> list | None:
    if entries is None:
        return None
    return [None if e is None else {str(t): lp.logprob for t, lp in e.items()}
            for e in entries]


def drive(llm: Any, requests: list[dict], max_steps: int = 100_000) -> dict[str, dict]:
    """Add requests to the engine and step it until all are done.

    Args:
        requests: ``{"id": str, "prompt": str | dict (e.g. :func:`chat_prompt`),
            "params": dict for :func:`sampling_params`, "abort_after_steps": int
            (optional: abort the request after that many engine steps)}``.

    Returns:
        ``{id: {"choices": [{"index", "token_ids", "text", "finish_reason",
        "stop_reason", "logprobs"}], "prompt_logprobs", "deltas": [[text, token_ids]]
        (streamed requests), "aborted": bool}}``; a streamed request's choice holds its
        concatenated deltas.
    """
    engine = llm.llm_engine
    out: dict[str, dict] = {}
    for r in requests:
        engine.add_request(r["id"], r["prompt"], sampling_params(r["params"]))
        out[r["id"]] = {"choices": {}, "prompt_logprobs": None, "deltas": [], "aborted": False,
                        "stream": bool(r["params"].get("stream"))}
    aborts = {r["id"]: r["abort_after_steps"] for r in requests if r.get("abort_after_steps")}
    steps = 0
    while engine.has_unfinished_requests() and steps < max_steps:
        for o in engine.step():
            rec = out[o.request_id]
            if o.prompt_logprobs is not None:
                rec["prompt_logprobs"] = _logprobs(o.prompt_logprobs)
            for c in o.outputs:
                ch = rec["choices"].setdefault(c.index, {"index": c.index, "token_ids": [],
                                                         "text": "", "logprobs": []})
                if rec["stream"]:
                    rec["deltas"].append([c.text, list(c.token_ids)])
                    ch["text"] += c.text
                    ch["token_ids"] += list(c.token_ids)
                    ch["logprobs"] += _logprobs(c.logprobs) or []
                else:
                    ch.update(text=c.text, token_ids=list(c.token_ids),
                              logprobs=_logprobs(c.logprobs))
                ch.update(finish_reason=c.finish_reason, stop_reason=c.stop_reason)
        steps += 1
        for rid, after in list(aborts.items()):
            if steps >= after:
                engine.abort_request([rid])
                out[rid]["aborted"] = True
                del aborts[rid]
    for rec in out.values():
        rec["choices"] = [rec["choices"][i] for i in sorted(rec["choices"])]
    return out


def debug_states(llm: Any) -> list[dict | None]:
    """Each worker's ``specext_debug_state()`` (see ``integration/runner.py``)."""
    return llm.collective_rpc("specext_debug_state")


def idle_state(llm: Any, max_steps: int = 5) -> list[dict | None]:
    """The drafter state once vLLM has told the runner about the last finished requests
    (one engine step after they finished): steps the idle engine until no worker's
    proposer tracks a request, at most ``max_steps`` times."""
    states = debug_states(llm)
    for _ in range(max_steps):
        if all(s is None or (not s["active_requests"] and not s["request_keys"])
               for s in states):
            break
        llm.llm_engine.step()
        time.sleep(0.05)
        states = debug_states(llm)
    return states


def counter(llm: Any, name: str) -> float:
    """Sum of one of vLLM's counters (``vllm:...``, without ``_total``)."""
    return sum(getattr(m, "value", 0) or 0 for m in llm.get_metrics() if m.name == name)


def _child_main() -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    # vLLM's worker process runs torch on one thread; in-process, two OpenMP threads on a
    # busy 2-core machine spin against each other (a batch took 20x longer).
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    module_file, out = sys.argv[1], sys.argv[2]
    sys.path.insert(0, str(Path(module_file).parent))
    spec = importlib.util.spec_from_file_location("engine_job_module", module_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = module.engine_job(json.loads(sys.stdin.read()))
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    _child_main()
