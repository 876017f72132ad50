"""Where an in-process engine's step time goes: wall time per model-runner phase.

:func:`time_phases` wraps a few methods of the model runner (and of its model and
drafter) of an engine whose worker runs in the calling process, and returns the dict the
wrappers add to; the caller clears it before a step and reads it after.
:class:`~vllm_specext.engine_run.SteppedCell` keeps one such dict per step in its step
log when a cell asks for it (``benchmarks/e2e.py --phase-times``), so that two engines'
aligned steps can be compared phase by phase (``benchmarks/step_log.py --phases``): on
a step that verifies no draft in either engine, the model (``_model_forward`` and
``compute_logits``) does the same work in both, and its difference is the machine's
noise; the rest of the step is what the speculative path costs.

Keys (seconds unless said), nested as vLLM 0.32's ``GPUModelRunner`` (which the CPU
runner subclasses) nests them: ``execute_model`` holds ``_update_states``,
``_prepare_inputs``, ``_model_forward`` and ``compute_logits`` (the model's output
projection); ``sample_tokens`` holds ``propose`` (the drafter's, speculative engines
only) and the step's bookkeeping. ``draft_tokens`` (a count) is the draft tokens the
step verified. A method a vLLM lacks is not timed.
"""
from __future__ import annotations

import functools
import time
from typing import Any

#: model-runner methods timed, in the order a step calls them
RUNNER_PHASES = ("execute_model", "_update_states", "_prepare_inputs", "_model_forward",
                 "sample_tokens")
#: the runner attribute that holds an engine's timing dict once installed
_ATTR = "_specext_phase_seconds"
#: every timing dict made in this process (a worker in another process returns a copy)
_MADE: list[dict[str, float]] = []


def _timed(method: Any, name: str, seconds: dict[str, float]) -> Any:
    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - start
    return wrapper


def _counting_drafts(execute_model: Any, seconds: dict[str, float]) -> Any:
    """``execute_model(scheduler_output, ...)`` that also records the step's draft tokens."""
    @functools.wraps(execute_model)
    def wrapper(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        drafts = getattr(scheduler_output, "scheduled_spec_decode_tokens", None) or {}
        seconds["draft_tokens"] = (seconds.get("draft_tokens", 0)
                                   + sum(len(d) for d in drafts.values()))
        return execute_model(scheduler_output, *args, **kwargs)
    return wrapper


def _install(worker: Any) -> dict[str, float]:
    runner = worker.model_runner
    if hasattr(runner, _ATTR):
        return getattr(runner, _ATTR)
    seconds: dict[str, float] = {}
    for name in RUNNER_PHASES:
        if hasattr(runner, name):
            setattr(runner, name, _timed(getattr(runner, name), name, seconds))
    if hasattr(runner, "execute_model"):
        runner.execute_model = _counting_drafts(runner.execute_model, seconds)
    for owner, name in ((getattr(runner, "model", None), "compute_logits"),
                        (getattr(runner, "drafter", None), "propose")):
        if owner is not None and hasattr(owner, name):
            setattr(owner, name, _timed(getattr(owner, name), name, seconds))
    setattr(runner, _ATTR, seconds)
    _MADE.append(seconds)
    return seconds


def time_phases(llm: Any) -> dict[str, float]:
    """Time the model-runner phases of ``llm``'s worker (once per engine; later calls
    return the same dict).

    Args:
        llm: a ``vllm.LLM`` whose engine core and worker run in this process
            (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, one worker).

    Returns:
        ``{key: value}`` (module docstring), added to by every later call of a timed
        method; clear it before a step to read that step's phases.

    Raises:
        ValueError: the worker runs in another process (its timings would stay there).
    """
    seconds = llm.collective_rpc(_install)
    if len(seconds) != 1 or not any(seconds[0] is made for made in _MADE):
        raise ValueError("time_phases needs one worker in this process "
                         "(VLLM_ENABLE_V1_MULTIPROCESSING=0, no tensor parallelism)")
    return seconds[0]
