"""Hand the step's draft tokens to the scheduler with the model output: no second RPC.

With synchronous scheduling vLLM's engine core asks the workers for the drafts in a
separate call after every step (``EngineCore.post_step`` ->
``executor.take_draft_token_ids()``): one more round trip to the worker process per step,
even when nothing was drafted. Measured on the 2-core CPU machine (``py-spy`` of the
engine core, ``naive`` at batch 32 on code editing) that call took ~0.8% of the step,
most of the gap between ``naive`` and no speculation there; on a GPU, with steps of a few
milliseconds, a round trip weighs more.

Our drafter's drafts are ready when ``sample_tokens`` returns, so:

* worker (:func:`attach_drafts`, from the ``sample_tokens`` wrapper in
  :mod:`vllm_specext.integration.runner`): the runner's ``take_draft_token_ids()`` result
  rides on the returned ``ModelRunnerOutput`` as attribute :data:`HANDOFF_ATTR` (pickled
  with it to the engine core);
* engine core (:func:`patch_engine_core`): ``Scheduler.update_from_output`` keeps that
  attribute, and ``EngineCore.post_step`` applies it instead of calling the workers.

Only for a vllm_specext drafter, synchronous scheduling and one pipeline stage (no batch
queue, whose structured-output path takes the drafts itself); anything else, or an
output without the attribute, takes vLLM's path unchanged. The worker's own draft state
is left as it was, so vLLM's call still returns the same drafts if it is ever made.
"""
from __future__ import annotations

import functools
from typing import Any

#: Attribute of ``ModelRunnerOutput`` carrying the step's ``DraftTokenIds`` (or None).
HANDOFF_ATTR = "specext_draft_token_ids"
_STASH_ATTR = "_specext_handoff"
_MISSING = object()


def hands_off(runner: Any) -> bool:
    """Whether ``runner`` (a V1 model runner with a vllm_specext drafter) sends its drafts
    with the model output: synchronous scheduling and a single pipeline stage."""
    parallel = getattr(getattr(runner, "vllm_config", None), "parallel_config", None)
    return (not getattr(runner, "use_async_scheduling", True)
            and getattr(parallel, "pipeline_parallel_size", 2) == 1)


def attach_drafts(runner: Any, output: Any) -> Any:
    """Attach ``runner.take_draft_token_ids()`` to ``output`` (a ``ModelRunnerOutput``
    returned by ``sample_tokens``) and return ``output``.

    vLLM's shared empty output and any other output type are returned untouched.
    """
    from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput

    if type(output) is ModelRunnerOutput and output is not EMPTY_MODEL_RUNNER_OUTPUT:
        setattr(output, HANDOFF_ATTR, runner.take_draft_token_ids())
    return output


def patch_engine_core() -> None:
    """Wrap ``Scheduler.update_from_output`` and ``EngineCore.post_step`` once
    (idempotent; harmless in processes that run no engine core)."""
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core import EngineCore

    post_step = EngineCore.post_step
    if getattr(post_step, "_specext_wrapped", False):
        return
    update_from_output = Scheduler.update_from_output

    @functools.wraps(update_from_output)
    def _update_from_output(self, scheduler_output, model_runner_output, *args, **kwargs):
        drafts = getattr(model_runner_output, HANDOFF_ATTR, _MISSING)
        out = update_from_output(self, scheduler_output, model_runner_output, *args, **kwargs)
        if drafts is not _MISSING:
            setattr(self, _STASH_ATTR, drafts)
        return out

    @functools.wraps(post_step)
    def _post_step(self, model_executed: bool, *args, **kwargs):
        drafts = self.scheduler.__dict__.pop(_STASH_ATTR, _MISSING)
        if drafts is _MISSING:
            return post_step(self, model_executed, *args, **kwargs)
        if drafts is not None and model_executed:
            self.scheduler.update_draft_token_ids(drafts)
        return None

    _post_step._specext_wrapped = True
    Scheduler.update_from_output = _update_from_output
    EngineCore.post_step = _post_step
