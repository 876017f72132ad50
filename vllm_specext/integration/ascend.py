"""Ascend NPU support through vllm-ascend (patch P7 of ``notes/vllm-integration.md``).

On Ascend, vllm-ascend is vLLM's platform plugin and brings its own V1 runner,
``NPUModelRunner(GPUModelRunner)``. ``GPUModelRunner.__init__`` runs first (vLLM builds our
``custom_class`` drafter there and :mod:`vllm_specext.integration.runner` installs our
verify hook), then ``NPUModelRunner._set_up_drafter`` replaces both the drafter and the
rejection sampler. :func:`patch_npu_model_runner` keeps vllm_specext in charge:

* **Drafter.** ``_set_up_drafter`` calls the method ``self._get_drafter()``
  (``vllm_ascend.spec_decode.get_spec_decode_method``, which raises for ``custom_class``).
  We wrap that method: a config that the front door routed to
  :class:`~vllm_specext.integration.adapter.SpecExtProposer` gets
  ``ascend_proposer_class()(vllm_config, runner)``; every other config (vLLM's own
  methods, ``mtp_ngram``'s MTP drafter) goes to vllm-ascend's factory unchanged.
* **Call shape.** ``NPUModelRunner.propose_draft_token_ids`` dispatches with
  ``isinstance``. Our drafter class derives from ``(SpecExtProposer, AscendNgramProposer)``
  so it takes the n-gram branch, ``propose(num_spec_tokens_to_schedule, sampled_token_ids,
  num_tokens_no_spec, token_ids_cpu)``; drafts are cut to ``num_spec_tokens_to_schedule``.
  ``NgramProposer.__init__`` (numba warm-up, ``[max_num_seqs, K]`` buffers) never runs;
  ``dummy_run`` (called on any drafter by ``_dummy_run``) and ``load_model`` are no-ops.
* **Verification.** ``AscendRejectionSampler.forward`` calls vllm-ascend's module-level
  ``rejection_sample(..., ori_target_logits=...)`` (its logits parameter is
  ``target_logits_or_tuple`` up to vllm-ascend 0.29), and vllm-ascend's worker patch
  rebinds vLLM's ``rejection_sample`` to it. Before the runner is built,
  :func:`adapt_rejection_sample` puts an adapter with vLLM's parameter names in front of
  that function in both modules, so
  :func:`~vllm_specext.integration.verify_hook.install_verify` works on either sampler.
  After ``NPUModelRunner.__init__`` (and again before ``load_model``, for subclasses such
  as the 310P runner that rebind the sampler in their own ``__init__``),
  :func:`finish_runner` moves the verify hook to the sampler vllm-ascend bound and
  :func:`cover_rejection_sample` adds a front that drops ``ori_target_logits`` (read only
  by vllm-ascend's entropy verify) and unpacks ``(logits, None)`` tuples, so our kernel
  runs. vllm-ascend's ``forward`` keeps bonus sampling, ``prepare_sampling``, penalties,
  bad words, temperature/top-k/top-p and logprobs.

Use: install vllm-ascend and vllm-specext in one environment; :func:`patch_ascend` is
called from the worker (``WorkerBase.__init__``). ``VLLM_PLUGINS``, when set, filters
platform plugins too, so it must list vllm-ascend's plugins with ours, e.g.
``VLLM_PLUGINS=ascend,ascend_kv_connector,ascend_model_loader,ascend_service_profiling,
ascend_model,vllm_specext`` (or leave it unset to load all installed plugins).

Versions (feature-detected, not by version number): vllm-ascend 0.24 to 0.30 and main
(main tracks vLLM 0.27.x and vLLM main; 0.30 tracks vLLM 0.30): ``NPUModelRunner.
_get_drafter``, the n-gram ``propose`` with a leading ``num_speculative_tokens``, and a
``rejection_sample`` with ``ori_target_logits``. vllm-ascend 0.23 calls
``propose(sampled_token_ids)`` only and is refused with a clear error.

Limits: vllm-ascend's own verification modes (``enable_reduce_sample``,
``rejection_sampler_config.enable_block_verify`` / ``enable_entropy_verify``) cannot be
combined with our verify hook (SpecExtConfigError). The opt-in V2 NPU runner is not
patched. On the 310P runner, drafting works but a verify strategy other than
``standard``/``normal`` fails at start-up (its sampler's ``forward`` lives in a module
without ``rejection_sample``, which ``install_verify`` rejects).
"""
from __future__ import annotations

import functools
import importlib.util
import inspect
import logging
from typing import Any

import numpy as np

from vllm_specext.config import SpecExtConfigError
from vllm_specext.integration.adapter import SpecExtProposer
from vllm_specext.integration.engine_config import ADAPTER_CLASS, ADDITIONAL_CONFIG_KEY

logger = logging.getLogger(__name__)

_ASCEND_LOGITS = "target_logits_or_tuple"  # vllm-ascend <= 0.29's name of target_logits
_VLLM_LOGITS = "target_logits"
_RAW_LOGITS = "ori_target_logits"  # only read by vllm-ascend's entropy verify
_DRAFT_BUDGET = "num_speculative_tokens"  # first parameter of the n-gram propose
_REJECTION_MODULES = ("vllm.v1.sample.rejection_sampler", "vllm_ascend.sample.rejection_sampler")


def ascend_platform_active() -> bool:
    """True when vllm-ascend is installed and is vLLM's current platform."""
    if importlib.util.find_spec("vllm_ascend") is None:
        return False
    from vllm.platforms import current_platform

    return type(current_platform).__module__.split(".")[0] == "vllm_ascend"


def patch_ascend() -> bool:
    """Patch vllm-ascend's ``NPUModelRunner`` when the Ascend platform is active.

    Idempotent and cheap otherwise; call it in worker processes (the runner module imports
    the NPU runtime).

    Returns:
        True when the Ascend runner was patched, False on any other platform.
    """
    if not ascend_platform_active():
        return False
    from vllm_ascend.worker.model_runner_v1 import NPUModelRunner

    patch_npu_model_runner(NPUModelRunner)
    return True


def routes_to_specext(vllm_config: Any) -> bool:
    """True when vLLM's speculative config is the front door's ``custom_class`` pointing
    at :class:`SpecExtProposer` (so the drafter must be ours)."""
    spec = getattr(vllm_config, "speculative_config", None)
    return (spec is not None and getattr(spec, "method", None) == "custom_class"
            and getattr(spec, "model", None) == ADAPTER_CLASS)


@functools.cache
def ascend_proposer_class() -> type:
    """Our drafter class for ``NPUModelRunner``: ``SpecExtProposer`` behaviour that passes
    vllm-ascend's ``isinstance(drafter, AscendNgramProposer)`` routing.

    Constructed as ``cls(vllm_config, runner)`` (``SpecExtProposer.__init__``; the
    n-gram base's ``__init__`` never runs).

    Raises:
        RuntimeError: a vllm-ascend whose n-gram ``propose`` does not take the draft
            budget first (vllm-ascend 0.23 and older call ``propose(sampled_token_ids)``).
    """
    from vllm_ascend.spec_decode.ngram_proposer import AscendNgramProposer

    params = list(inspect.signature(AscendNgramProposer.propose).parameters)
    if params[1:2] != [_DRAFT_BUDGET]:
        raise RuntimeError(
            f"vllm_specext: this vllm-ascend calls AscendNgramProposer.propose{tuple(params)}"
            f"; vllm_specext needs the call with a leading {_DRAFT_BUDGET!r} "
            "(vllm-ascend >= 0.24)")

    def propose(self, *args: Any, **kwargs: Any) -> list[list[int]]:
        """``SpecExtProposer.propose``, each draft cut to ``num_speculative_tokens``
        (the scheduler's ``num_spec_tokens_to_schedule``, <= K under dynamic K)."""
        budget = kwargs.pop(_DRAFT_BUDGET, None)
        if budget is None and args and isinstance(args[0], (int, np.integer)):
            budget, args = args[0], args[1:]
        drafts = SpecExtProposer.propose(self, *args, **kwargs)
        if budget is None or budget >= self.k:
            return drafts
        return [d[:budget] for d in drafts]

    doc = ("SpecExtProposer for vllm-ascend's NPUModelRunner (an AscendNgramProposer for "
           "its isinstance dispatch; built by vllm_specext.integration.ascend).")
    return type("SpecExtAscendProposer", (SpecExtProposer, AscendNgramProposer),
                {"__module__": __name__, "__doc__": doc, "propose": propose})


def patch_npu_model_runner(cls: type) -> None:
    """Wrap ``cls._get_drafter``, ``cls.__init__`` and ``cls.load_model`` once (idempotent).

    Args:
        cls: vllm-ascend's ``NPUModelRunner`` (or a subclass defining these methods).
    """
    get_drafter = getattr(cls, "_get_drafter", None)
    if get_drafter is None:
        logger.warning("vllm_specext: this vllm-ascend's %s has no _get_drafter(); "
                       "vllm_specext methods are not available on Ascend", cls.__name__)
        return
    if getattr(cls.__dict__.get("_get_drafter"), "_specext_wrapped", False):
        return
    init, load_model = cls.__init__, cls.load_model

    @functools.wraps(get_drafter)
    def _get_drafter(self):
        if routes_to_specext(self.vllm_config):
            return ascend_proposer_class()(self.vllm_config, self)
        return get_drafter(self)

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        vllm_config = args[0] if args else kwargs.get("vllm_config")
        if ADDITIONAL_CONFIG_KEY in (getattr(vllm_config, "additional_config", None) or {}):
            adapt_rejection_modules()  # vllm-ascend's worker patches have run by now
        init(self, *args, **kwargs)
        finish_runner(self)

    @functools.wraps(load_model)
    def load_model_(self, *args, **kwargs):
        finish_runner(self)  # a subclass may have rebound the sampler after our __init__
        return load_model(self, *args, **kwargs)

    _get_drafter._specext_wrapped = True
    cls._get_drafter = _get_drafter
    cls.__init__ = __init__
    cls.load_model = load_model_


def finish_runner(runner: Any) -> None:
    """Point our hooks at the drafter and sampler the NPU runner ended up with.

    A verify hook installed during ``GPUModelRunner.__init__`` (on vLLM's sampler, which
    vllm-ascend then replaced) is installed again, with the same settings, on
    ``runner.rejection_sampler``; a :class:`SpecExtProposer` drafter is bound to the runner.
    Idempotent (no work while the sampler is the one already hooked).

    Raises:
        SpecExtConfigError: a verify hook together with one of vllm-ascend's own
            verification modes in ``additional_config``.
        RuntimeError: from ``install_verify``, for a sampler whose module has no
            compatible ``rejection_sample``.
    """
    from vllm_specext.integration.verify_hook import install_verify

    hook = getattr(runner, "specext_verify_hook", None)
    sampler = getattr(runner, "rejection_sampler", None)
    if hook is not None and sampler is not None and \
            runner.__dict__.get("_specext_hooked_sampler") is not sampler:
        modes = ascend_verify_modes(runner.vllm_config)
        if modes:
            raise SpecExtConfigError(
                f"verify_strategy={hook.spec.strategy!r} / accept_policy="
                f"{hook.spec.accept_policy!r} cannot be combined with vllm-ascend's "
                f"{', '.join(modes)} (additional_config): both replace draft verification; "
                "remove one of them")
        new = install_verify(runner, hook.spec.strategy, hook.spec.accept_policy,
                             top_p=hook.spec.top_p,
                             allow_request_override=hook.allow_request_override)
        new.keep_target_tokens = hook.keep_target_tokens
        cover_rejection_sample(inspect.getmodule(type(sampler).forward))
        runner._specext_hooked_sampler = sampler
    drafter = getattr(runner, "drafter", None)
    if isinstance(drafter, SpecExtProposer):
        drafter.bind_runner(runner)


def ascend_verify_modes(vllm_config: Any) -> list[str]:
    """vllm-ascend's own verification modes switched on in ``additional_config``."""
    extra = getattr(vllm_config, "additional_config", None) or {}
    sampler_cfg = extra.get("rejection_sampler_config") or {}
    modes = ["enable_reduce_sample"] if extra.get("enable_reduce_sample") else []
    return modes + [f"rejection_sampler_config.{key}"
                    for key in ("enable_block_verify", "enable_entropy_verify")
                    if sampler_cfg.get(key)]


def adapt_rejection_modules() -> None:
    """:func:`adapt_rejection_sample` on vLLM's and vllm-ascend's sampler modules."""
    for name in _REJECTION_MODULES:
        adapt_rejection_sample(importlib.import_module(name))


def adapt_rejection_sample(module: Any) -> bool:
    """Give vllm-ascend's ``module.rejection_sample`` vLLM's parameter names (idempotent).

    vllm-ascend's function is recognised by its ``ori_target_logits`` parameter; up to
    vllm-ascend 0.29 it calls vLLM's ``target_logits`` ``target_logits_or_tuple``. The
    adapter's signature is the original's with that name changed to ``target_logits``; it
    passes every call through unchanged and marks the function for
    :func:`cover_rejection_sample`.

    Returns:
        True when the module's function was vllm-ascend's and is now adapted.
    """
    original = getattr(module, "rejection_sample", None)
    if original is None or getattr(original, "_specext_ascend_original", None) is not None:
        return False
    sig = inspect.signature(original)
    if _RAW_LOGITS not in sig.parameters:
        return False

    @functools.wraps(original)
    def rejection_sample(*args, **kwargs):
        if _VLLM_LOGITS in kwargs and _ASCEND_LOGITS in sig.parameters:
            kwargs[_ASCEND_LOGITS] = kwargs.pop(_VLLM_LOGITS)
        return original(*args, **kwargs)

    rejection_sample.__signature__ = sig.replace(parameters=[
        p.replace(name=_VLLM_LOGITS) if p.name == _ASCEND_LOGITS else p
        for p in sig.parameters.values()])
    rejection_sample._specext_ascend_original = original
    module.rejection_sample = rejection_sample
    return True


def cover_rejection_sample(module: Any) -> None:
    """Put vllm-ascend's call shape in front of the verify hook's ``rejection_sample``.

    ``AscendRejectionSampler.forward`` always passes ``ori_target_logits`` (which the hook
    would take for an unsupported mode) and, up to vllm-ascend 0.29, ``(logits, None)``
    tuples for greedy batches; the front drops the first and unpacks the second, so the
    hook sees vLLM's call. Reduce-sample candidates ``(logits, indices)`` go to
    vllm-ascend's function untouched. Idempotent; keeps the hook's attributes, so a later
    ``install_verify`` sees the module as already wrapped.
    """
    hooked = getattr(module, "rejection_sample", None)
    original = getattr(hooked, "_specext_ascend_original", None)
    if original is None or getattr(hooked, "_specext_ascend_front", False):
        return
    sig = inspect.signature(original)
    name = _ASCEND_LOGITS if _ASCEND_LOGITS in sig.parameters else _VLLM_LOGITS

    @functools.wraps(hooked)
    def rejection_sample(*args, **kwargs):
        bound = sig.bind(*args, **kwargs)
        logits = bound.arguments[name]
        if isinstance(logits, tuple):
            logits, indices = logits
            if indices is not None:
                return original(*args, **kwargs)
            bound.arguments[name] = logits
        bound.arguments.pop(_RAW_LOGITS, None)
        return hooked(*bound.args, **bound.kwargs)

    rejection_sample._specext_ascend_front = True
    module.rejection_sample = rejection_sample
