"""Worker-side patches of vLLM's V1 model runner (``GPUModelRunner``, which the CPU and
Ascend runners subclass).

* ``__init__``: bind our drafter to the runner (request ids, prompt lengths) and
  install the configured verify strategy.
* ``_update_states``: tell the drafter which requests finished, before vLLM drops them,
  and start timing the step (the adaptive cost model).

Applied lazily from the worker (``WorkerBase.__init__``) so that no runner module, and
so no device runtime, is imported in the API-server process.
"""
from __future__ import annotations

import functools
import logging

from vllm_specext.integration.adapter import SpecExtProposer

logger = logging.getLogger(__name__)


def _after_init(runner) -> None:
    drafter = getattr(runner, "drafter", None)
    if isinstance(drafter, SpecExtProposer):
        drafter.bind_runner(runner)
        cfg = drafter.config
        if cfg.get("verify_strategy", "standard") != "standard" or \
                cfg.get("accept_policy", "normal") != "normal":
            from vllm_specext.integration.verify_hook import install_verify

            install_verify(runner, cfg["verify_strategy"], cfg["accept_policy"])


def patch_model_runner() -> None:
    """Wrap ``GPUModelRunner.__init__`` and ``_update_states`` once (idempotent)."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    init = GPUModelRunner.__init__
    if getattr(init, "_specext_wrapped", False):
        return

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        _after_init(self)

    update_states = GPUModelRunner._update_states

    @functools.wraps(update_states)
    def _update_states(self, scheduler_output, *args, **kwargs):
        drafter = getattr(self, "drafter", None)
        if isinstance(drafter, SpecExtProposer):
            drafter.on_step_start(scheduler_output)
        return update_states(self, scheduler_output, *args, **kwargs)

    __init__._specext_wrapped = True
    GPUModelRunner.__init__ = __init__
    GPUModelRunner._update_states = _update_states


def patch_worker_base() -> None:
    """Defer :func:`patch_model_runner` to the first worker construction (idempotent)."""
    from vllm.v1.worker.worker_base import WorkerBase

    init = WorkerBase.__init__
    if getattr(init, "_specext_wrapped", False):
        return

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        patch_model_runner()
        init(self, *args, **kwargs)

    __init__._specext_wrapped = True
    WorkerBase.__init__ = __init__
