"""Where an in-process engine's step time goes: wall time per model-runner phase.

:func:`time_phases` wraps a few methods of the model runner (and of its drafter, if any)
of an engine whose worker runs in the calling process, and returns the dict the wrappers
add their seconds to; the caller clears it before a step and reads it after.
:class:`~vllm_specext.engine_run.SteppedCell` keeps one such dict per step in its step
log when a cell asks for it (``benchmarks/e2e.py --phase-times``), so that two engines'
aligned steps can be compared phase by phase (``benchmarks/step_log.py``): on one
undrafted step the model's forward pass does the same work in both, and its difference
is the machine's noise; the other phases' differences are what the speculative path
costs.

Phases (seconds, nested where vLLM nests them: ``execute_model`` holds
``_prepare_inputs`` and ``_model_forward``; ``sample_tokens`` holds ``propose``):
``_update_states``, ``_prepare_inputs``, ``_model_forward``, ``execute_model``,
``sample_tokens`` (vLLM 0.32's ``GPUModelRunner``, which the CPU runner subclasses; a
method a vLLM lacks is not timed) and ``propose`` (the drafter's, speculative engines
only).
"""
from __future__ import annotations

import functools
import time
from typing import Any

#: model-runner methods timed, in the order a step calls them
RUNNER_PHASES = ("_update_states", "_prepare_inputs", "_model_forward", "execute_model",
                 "sample_tokens")
#: the timing dict of each runner already wrapped (by id), so a second call reuses it
_INSTALLED: dict[int, dict[str, float]] = {}


def _timed(method: Any, name: str, seconds: dict[str, float]) -> Any:
    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - start
    return wrapper


def _install(worker: Any) -> dict[str, float]:
    runner = worker.model_runner
    if id(runner) in _INSTALLED:
        return _INSTALLED[id(runner)]
    seconds: dict[str, float] = {}
    for name in RUNNER_PHASES:
        if hasattr(runner, name):
            setattr(runner, name, _timed(getattr(runner, name), name, seconds))
    drafter = getattr(runner, "drafter", None)
    if drafter is not None and hasattr(drafter, "propose"):
        drafter.propose = _timed(drafter.propose, "propose", seconds)
    _INSTALLED[id(runner)] = seconds
    return seconds


def time_phases(llm: Any) -> dict[str, float]:
    """Time the model-runner phases of ``llm``'s worker (once per engine; later calls
    return the same dict).

    Args:
        llm: a ``vllm.LLM`` whose engine core and worker run in this process
            (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, one worker).

    Returns:
        ``{phase: seconds}``, added to by every later call of a timed method; clear it
        before a step to read that step's phases.

    Raises:
        ValueError: the worker runs in another process (its timings would stay there).
    """
    seconds = llm.collective_rpc(_install)
    # a worker in another process sends back a copy, not one of this process's dicts
    if len(seconds) != 1 or not any(seconds[0] is d for d in _INSTALLED.values()):
        raise ValueError("time_phases needs one worker in this process "
                         "(VLLM_ENABLE_V1_MULTIPROCESSING=0, no tensor parallelism)")
    return seconds[0]
