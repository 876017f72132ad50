"""Run vLLM offline (``LLM.generate``) for one speculative config in a fresh process.

A fresh engine per configuration keeps runs independent: no prefix-cache hits and no
cross-request proposer state carried from another configuration. Used by the demo,
the end-to-end tests and the benchmarks. :class:`EngineProcess` keeps such an engine
alive between cells, so that a benchmark can interleave several configurations' engines
cell by cell, or (with :class:`SteppedCell`) a fraction of a second at a time.

Command line (job JSON on stdin, result JSON written to OUT.json)::

    echo '{"spec": {"method": "ngram"}, "prompts": ["..."]}' | python -m vllm_specext.engine_run OUT.json
"""
from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any

from vllm_specext.integration.decision_log import DECISION_LOG_ENV
from vllm_specext.phase_times import time_phases

DEFAULT_KV_CACHE_GIB = "2"


#: vLLM's histogram observed once per request per decode step that produced tokens
_ITL = "vllm:inter_token_latency_seconds"


def _counter(metrics: list, name: str) -> float:
    """Sum of a vLLM metric's values across engines (0 when absent); for a histogram,
    its observation count."""
    total = 0.0
    for m in metrics:
        if m.name == name:
            total += (getattr(m, "value", None) or getattr(m, "count", 0) or 0)
    return total


def start_engine(job: dict[str, Any]) -> Any:
    """Create the ``vllm.LLM`` of a job's engine keys (see :func:`generate`), warm it up
    (unless ``job["warmup"]`` is false) and freeze its workers' start-up heap.

    ``job["in_process"]`` true runs the engine core in this process
    (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), as :class:`SteppedCell` needs.

    The CPU KV cache (``VLLM_CPU_KVCACHE_SPACE``, GiB) is ``job["kv_cache_gib"]`` when
    given, else the environment's value, else 2.
    """
    if "kv_cache_gib" in job:
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(job["kv_cache_gib"])
    if job.get("in_process"):  # the engine core steps only when the caller calls step()
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", DEFAULT_KV_CACHE_GIB)
    from vllm import LLM, SamplingParams

    from vllm_specext.model import default_model_path

    llm = LLM(model=job.get("model") or str(default_model_path()),
              dtype=job.get("dtype", "float32"), enforce_eager=True, seed=job.get("seed", 0),
              max_model_len=job.get("max_model_len", 4096),
              enable_prefix_caching=job.get("enable_prefix_caching", True),
              speculative_config=job.get("spec"), disable_log_stats=False,
              **({"max_num_seqs": job["max_num_seqs"]} if job.get("max_num_seqs") else {}))
    if job.get("warmup", True):  # one-time costs (numba, first spec step) outside timing
        llm.generate(["Warm up: count 1 2 3 4 5 6 7 8"],
                     SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)
    # Every configuration, no speculation included, runs with its workers' start-up heap
    # frozen (what a vllm_specext drafter does by itself), so that a ~0.4 s full garbage
    # collection does not land in one configuration's timing and not in another's.
    llm.collective_rpc("specext_freeze_gc")
    return llm


def generate(job: dict[str, Any]) -> dict[str, Any]:
    """Start one engine and run a job (or each of ``job["cells"]``) in this process.

    Args:
        job: engine keys ``{"spec": dict | None, "model": str | None, "dtype": "float32",
            "seed": int, "max_model_len": int, "enable_prefix_caching": bool,
            "warmup": bool, "kv_cache_gib": int, "in_process": bool, "max_num_seqs": int
            (most requests running at once; default: vLLM's)}`` plus either the keys of
            one cell or ``"cells": [cell, ...]``.
            A cell: ``{"prompts": list[str] | None, "chats": list[list[dict]] | None
            (rendered with the model's chat template), "max_tokens": int,
            "max_tokens_each": list[int] | None (one per prompt, instead of
            ``max_tokens``), "temperature": float, "n": int, "request_seed": int | None,
            "sampling": dict (extra SamplingParams), "batch_size": int | None (prompts per
            ``generate`` call; None = all at once)}``.

    Returns:
        One result per cell (``{"cells": [...]}`` when cells were given), each
        ``{"texts", "token_ids", "seconds" (generate wall time), "output_tokens",
        "tokens_per_s", "ttft_s" and "tpot_s" (per-request lists, seconds), "num_drafts",
        "num_draft_tokens", "num_accepted_tokens", "mean_acceptance_length", "steps",
        "tau"}``. ``steps``: target steps summed over the requests, one prefill step each
        plus their decode steps, which vLLM's ``inter_token_latency`` histogram counts
        (one observation per request per step that gave it tokens); ``tau`` (output
        tokens per target step) = output / steps. Not output / (output - accepted):
        vLLM counts drafts accepted past a request's ``max_tokens``, which the output
        drops (that estimate is the fallback where the histogram is missing).
    """
    llm = start_engine(job)
    if "cells" in job:
        return {"cells": [_run_cell(llm, cell) for cell in job["cells"]]}
    return _run_cell(llm, job)


def _sampling_params(cell: dict[str, Any], count: int) -> list[Any]:
    """One ``SamplingParams`` per prompt of ``cell`` (``count`` prompts): its
    ``max_tokens``, or the prompt's entry of ``max_tokens_each``.

    Raises:
        ValueError: ``max_tokens_each`` does not hold one entry per prompt.
    """
    from vllm import SamplingParams

    lengths = cell.get("max_tokens_each") or [cell.get("max_tokens", 128)] * count
    if len(lengths) != count:
        raise ValueError(f"max_tokens_each has {len(lengths)} entries for {count} prompts")
    return [SamplingParams(temperature=cell.get("temperature", 0.0), max_tokens=n,
                           n=cell.get("n", 1), seed=cell.get("request_seed"),
                           **cell.get("sampling", {})) for n in lengths]


def _prompts(llm: Any, cell: dict[str, Any]) -> list[str]:
    """The cell's prompts, chats rendered with the model's chat template."""
    if cell.get("chats"):
        tok = llm.get_tokenizer()
        return [tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True)
                for c in cell["chats"]]
    return cell["prompts"]


def _run_cell(llm: Any, cell: dict[str, Any]) -> dict[str, Any]:
    prompts = _prompts(llm, cell)
    params = _sampling_params(cell, len(prompts))
    before = llm.get_metrics()
    start = time.perf_counter()
    step = cell.get("batch_size") or len(prompts)
    outs = [o for i in range(0, len(prompts), step)
            for o in llm.generate(prompts[i:i + step], params[i:i + step], use_tqdm=False)]
    seconds = time.perf_counter() - start
    ttft, tpot = [], []
    for o in outs:
        m = o.metrics
        if m is None or not m.first_token_ts:
            continue
        ttft.append(m.first_token_latency)
        n = len(o.outputs[0].token_ids)
        if n > 1:
            tpot.append((m.last_token_ts - m.first_token_ts) / (n - 1))
    return _cell_result([c.text for o in outs for c in o.outputs],
                        [list(c.token_ids) for o in outs for c in o.outputs],
                        seconds, ttft, tpot, before, llm.get_metrics())


def _cell_result(texts: list[str], token_ids: list[list[int]], seconds: float,
                 ttft: list[float], tpot: list[float], before: list,
                 after: list) -> dict[str, Any]:
    """A cell's result dict (see :func:`generate`) from its outputs, timings and the
    engine's metrics before and after it."""
    def delta(name: str) -> float:
        return _counter(after, name) - _counter(before, name)

    drafts = delta("vllm:spec_decode_num_drafts")
    accepted = delta("vllm:spec_decode_num_accepted_tokens")
    n_out = sum(len(t) for t in token_ids)
    if any(m.name == _ITL for m in after):
        steps = delta(_ITL) + len(token_ids)
    else:  # a vLLM without the histogram: every accepted token counted as output
        steps = n_out - accepted
    return {
        "texts": texts,
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
        "steps": int(steps),
        "tau": n_out / steps if steps > 0 else 1.0,
    }


class SteppedCell:
    """A cell's requests, all added to an in-process engine at once and advanced a slice
    of engine steps at a time; only the engine's own work (``add_request``, ``step``) is
    timed.

    This lets a benchmark interleave several engines' cells slice by slice (e.g. 0.3 s
    each), so that the machine's speed, which drifts by a few percent over 5-20 s on a
    shared VM, is the same for every engine it compares. The result equals
    :func:`_run_cell`'s for one ``generate()`` of all the prompts, with ``seconds``, TTFT
    and TPOT counted in engine time (TTFT from the cell's start; pauses between slices
    excluded), plus ``queued_seconds`` and ``queued_tokens``: the engine time and output
    tokens of the steps that ran while some request of the cell still waited for its
    first token. With more requests than running slots (``max_num_seqs``) that is the
    part of the cell in which a freed slot takes a waiting request, as in a server with
    a steady queue; in a closed batch it is only the prefill. And ``step_log``: one
    ``[seconds, output tokens, requests unfinished after it]`` per engine step, in order,
    so that engines that ran a cell on the same schedule can be compared step by step;
    with ``cell["phase_times"]`` true each entry has a fourth item, the step's seconds per
    model-runner phase (:func:`~vllm_specext.phase_times.time_phases`).

    Args:
        llm: a ``vllm.LLM`` made by :func:`start_engine` with ``job["in_process"]`` true.
        cell: as in :func:`generate` (``batch_size`` is ignored: every prompt at once).

    Raises:
        ValueError: the engine core runs in its own process (it would keep stepping
            between slices).
    """

    def __init__(self, llm: Any, cell: dict[str, Any]):
        from vllm.sampling_params import RequestOutputKind

        if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0":
            raise ValueError("SteppedCell needs an in-process engine core "
                             "(start_engine with job['in_process'] true)")
        self._llm = llm
        self._before = llm.get_metrics()
        prompts = _prompts(llm, cell)
        params = _sampling_params(cell, len(prompts))
        for p in params:
            p.output_kind = RequestOutputKind.DELTA
        self._ids = [f"stepped-{id(self)}-{i}" for i in range(len(prompts))]
        self._tokens: dict[str, list[int]] = {r: [] for r in self._ids}
        self._texts: dict[str, list[str]] = {r: [] for r in self._ids}
        self._first: dict[str, float] = {}
        self._last: dict[str, float] = {}
        self._queued_seconds = 0.0  # engine time and output tokens of the steps run
        self._queued_tokens = 0  # while a request still waited for its first token
        self._steps: list[tuple] = []  # see step_log
        self._phases = time_phases(llm) if cell.get("phase_times") else None
        start = time.perf_counter()
        for rid, prompt, p in zip(self._ids, prompts, params):
            llm.llm_engine.add_request(rid, prompt, p)
        self.seconds = time.perf_counter() - start

    def advance(self, seconds: float) -> dict[str, Any] | None:
        """Run engine steps for about ``seconds`` of engine time (at least one step).

        Returns:
            The cell's result once every request has finished, else None.
        """
        engine = self._llm.llm_engine
        spent = 0.0
        while engine.has_unfinished_requests() and (spent == 0.0 or spent < seconds):
            queued = len(self._first) < len(self._ids)
            if self._phases is not None:
                self._phases.clear()
            start = time.perf_counter()
            outputs = engine.step()
            took = time.perf_counter() - start
            spent += took
            self.seconds += took
            new_tokens = 0
            for out in outputs:
                if out.request_id not in self._tokens or not out.outputs:
                    continue
                new = out.outputs[0]
                if new.token_ids:
                    self._first.setdefault(out.request_id, self.seconds)
                    self._last[out.request_id] = self.seconds
                self._tokens[out.request_id].extend(new.token_ids)
                self._texts[out.request_id].append(new.text)
                new_tokens += len(new.token_ids)
            step = (took, new_tokens, engine.get_num_unfinished_requests())
            self._steps.append(step if self._phases is None else (*step, dict(self._phases)))
            if queued:
                self._queued_seconds += took
                self._queued_tokens += new_tokens
        if engine.has_unfinished_requests():
            return None
        return self._result()

    def _result(self) -> dict[str, Any]:
        tpot = [(self._last[r] - self._first[r]) / (len(self._tokens[r]) - 1)
                for r in self._ids if len(self._tokens[r]) > 1]
        result = _cell_result(["".join(self._texts[r]) for r in self._ids],
                              [self._tokens[r] for r in self._ids], self.seconds,
                              [self._first[r] for r in self._ids if r in self._first], tpot,
                              self._before, self._llm.get_metrics())
        return {**result, "queued_seconds": self._queued_seconds,
                "queued_tokens": self._queued_tokens, "step_log": self._steps}


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


class EngineProcess:
    """One engine (:func:`start_engine` of ``job``) alive in a spawned child process,
    running cells (see :func:`generate`) one at a time on request.

    The caller's ``__main__`` needs an ``if __name__ == "__main__":`` guard (spawn).
    Construction returns at once; :meth:`wait_ready` waits for the engine.
    """

    def __init__(self, job: dict[str, Any]):
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, job), name="specext-engine")
        self._proc.start()
        child.close()

    def _receive(self, timeout: float) -> Any:
        if not self._conn.poll(timeout):
            raise TimeoutError(f"engine gave no answer within {timeout:.0f} s")
        status, payload = self._conn.recv()
        if status == "error":
            raise RuntimeError(f"engine failed:\n{payload}")
        return payload

    def wait_ready(self, timeout: float = 900) -> None:
        """Block until the engine is up.

        Raises:
            RuntimeError: the engine failed to start (message: the child's traceback).
            TimeoutError: no answer within ``timeout`` seconds.
        """
        self._receive(timeout)

    def run(self, cell: dict[str, Any], timeout: float = 3600) -> dict[str, Any]:
        """Run one cell and return its result (keys as :func:`generate`'s).

        Raises:
            RuntimeError: the cell failed (its engine has shut down).
            TimeoutError: no result within ``timeout`` seconds.
        """
        self._conn.send(("run", cell))
        return self._receive(timeout)

    def begin(self, cell: dict[str, Any], timeout: float = 600) -> None:
        """Add a cell's requests (a :class:`SteppedCell`; the job needs ``"in_process":
        True``) without stepping; :meth:`advance` runs it.

        Raises:
            RuntimeError: the engine failed (it has shut down), or is not in-process.
            TimeoutError: no answer within ``timeout`` seconds.
        """
        self._conn.send(("begin", cell))
        self._receive(timeout)

    def advance(self, seconds: float, timeout: float = 600) -> dict[str, Any] | None:
        """Advance the begun cell by about ``seconds`` of engine time.

        Returns:
            The cell's result (keys as :func:`generate`'s) once it has finished, else None.

        Raises:
            RuntimeError, TimeoutError: as :meth:`begin`.
        """
        self._conn.send(("advance", seconds))
        return self._receive(timeout)

    def stop(self) -> None:
        """Ask the engine to shut down, without waiting (see :meth:`close`)."""
        if not self._conn.closed:
            try:
                self._conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            self._conn.close()

    def close(self, timeout: float = 120) -> None:
        """Shut the engine down and wait for its processes to exit (killed after
        ``timeout`` s). Calling :meth:`stop` on several engines first lets them shut
        down in parallel."""
        self.stop()
        self._proc.join(timeout)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()


def _serve(conn: Any, job: dict[str, Any]) -> None:
    """Child side of :class:`EngineProcess`: start the engine, then answer commands
    (``("run", cell)``, ``("begin", cell)``, ``("advance", seconds)``) until ``None``
    arrives; any exception is sent back as ``("error", traceback)``."""
    llm = None
    try:
        llm = start_engine(job)
        conn.send(("ready", None))
        stepped = None
        while (message := conn.recv()) is not None:
            command, arg = message
            if command in ("run", "begin") and os.environ.get(DECISION_LOG_ENV):
                # which cell the decision log's next steps belong to (cell["label"])
                llm.collective_rpc("specext_mark_log", args=(arg.get("label", command),))
            if command == "run":
                conn.send(("ok", _run_cell(llm, arg)))
            elif command == "begin":
                stepped = SteppedCell(llm, arg)
                conn.send(("ok", None))
            elif command == "advance":
                if stepped is None:
                    raise RuntimeError("advance before begin: no cell to advance")
                conn.send(("ok", stepped.advance(arg)))
            else:
                raise ValueError(f"unknown engine command {command!r}")
    except Exception:  # reported to the parent, which decides what to do
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()
        # A multiprocessing child ends with os._exit, which skips the atexit finalizer
        # that stops the engine-core and worker processes: stop them here.
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if hasattr(core, "shutdown"):
            core.shutdown()


def main() -> None:
    result = generate(json.loads(sys.stdin.read()))
    with open(sys.argv[1], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
