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
  num_tokens_no_spec, token_ids_cpu)``, which ``SpecExtProposer.propose`` takes as is
  (drafts capped to the budget). ``NgramProposer.__init__`` (numba warm-up,
  ``[max_num_seqs, K]`` buffers) never runs; ``dummy_run`` (called on any drafter by
  ``_dummy_run``) and ``load_model`` are no-ops.
* **mtp_ngram.** vllm-ascend's MTP drafter is left in place;
  :func:`~vllm_specext.integration.mtp_hybrid.patch_propose` wraps
  ``NPUModelRunner.propose_draft_token_ids`` (which never calls vLLM's) so that its MTP
  branch hands ``drafter._propose(num_speculative_tokens=min(m, K))``; vllm-ascend's
  ``take_draft_token_ids`` calls vLLM's, where mtp_hybrid extends the drafts to ``K``.
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
  bad words, temperature/top-k/top-p and logprobs. The 310P sampler
  (``AscendRejectionSampler310``, in a module without ``rejection_sample``) delegates to
  ``AscendRejectionSampler.forward``; the hook finds that module through the class
  hierarchy (:func:`~vllm_specext.integration.verify_hook.rejection_module`).

Use: install vllm-ascend and vllm-specext in one environment; :func:`patch_ascend` is
called from the worker (``WorkerBase.__init__``), :func:`check_engine_args` from the
config front door, :func:`warn_missing_ascend_plugins` from ``register()``.
``VLLM_PLUGINS``, when set, filters platform plugins too, so it must list vllm-ascend's
plugins with ours, e.g. ``VLLM_PLUGINS=ascend,ascend_kv_connector,ascend_model_loader,
ascend_service_profiling,ascend_model,vllm_specext`` (or leave it unset to load all
installed plugins); a warning names the missing ones.

Versions (feature-detected, not by version number): vllm-ascend 0.24 to 0.30 and main
(main tracks vLLM 0.27.x and vLLM main; 0.30 tracks vLLM 0.30): ``NPUModelRunner.
_get_drafter``, the n-gram ``propose`` with a leading ``num_speculative_tokens``, a
``propose_draft_token_ids`` with a ``scheduler_output`` parameter (``mtp_ngram``), and a
``rejection_sample`` with ``ori_target_logits``. vllm-ascend 0.23 calls
``propose(sampled_token_ids)`` only and is refused with a clear error.

Limits (each refused with an error naming the setting): vllm-ascend's own verification
modes (``enable_reduce_sample``, ``rejection_sampler_config.enable_block_verify`` /
``enable_entropy_verify``) together with our verify hook; the V2 NPU runner
(``VLLM_USE_V2_MODEL_RUNNER=1``), where vllm_specext cannot be reached; ``mtp_ngram`` with
pipeline parallelism.
"""
from __future__ import annotations

import functools
import importlib.util
import inspect
import logging
import os
from importlib.metadata import entry_points
from typing import Any

from vllm_specext.config import SpecExtConfigError
from vllm_specext.integration.adapter import SpecExtProposer
from vllm_specext.integration.engine_config import ADAPTER_CLASS, ADDITIONAL_CONFIG_KEY

logger = logging.getLogger(__name__)

_ASCEND_LOGITS = "target_logits_or_tuple"  # vllm-ascend <= 0.29's name of target_logits
_VLLM_LOGITS = "target_logits"
_RAW_LOGITS = "ori_target_logits"  # only read by vllm-ascend's entropy verify
_DRAFT_BUDGET = "num_speculative_tokens"  # first parameter of the n-gram propose
_V2_ENV = "VLLM_USE_V2_MODEL_RUNNER"
_PLUGIN_GROUPS = ("vllm.platform_plugins", "vllm.general_plugins")
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


def check_engine_args(engine_args: Any, specext: dict[str, Any]) -> None:
    """Refuse, at config time, what vllm_specext cannot run on Ascend (no-op elsewhere).

    Called by the config front door for every config that carries vllm_specext settings
    (a method of ours, or our verify keys with a vLLM method).

    Args:
        engine_args: vLLM's ``EngineArgs`` (``pipeline_parallel_size`` is read).
        specext: the validated ``additional_config["vllm_specext"]`` dict.

    Raises:
        SpecExtConfigError: ``VLLM_USE_V2_MODEL_RUNNER`` set: vllm-ascend then builds its
            V2 runner (``vllm_ascend.worker.v2``), whose ``init_speculator`` knows only its
            model-based speculators (MTP, EAGLE, DFlash, DSpark) and whose sampler our
            verify hook does not reach. Or ``mtp_ngram`` with pipeline parallelism:
            vllm-ascend then sends drafts in the step output, past
            ``take_draft_token_ids`` where the n-gram extension runs.
    """
    if not ascend_platform_active():
        return
    import vllm.envs as envs

    if getattr(envs, _V2_ENV, None):
        raise SpecExtConfigError(
            f"{_V2_ENV} is set: vllm-ascend's V2 NPU model runner has no hook for vllm_specext "
            "(it builds only its own MTP/EAGLE/DFlash/DSpark speculators, and our verify "
            f"strategies need the V1 sampler); unset {_V2_ENV} (or set it to 0) to use "
            "vllm-ascend's V1 NPUModelRunner")
    if specext.get("method") == "mtp_ngram" and \
            (getattr(engine_args, "pipeline_parallel_size", 1) or 1) > 1:
        raise SpecExtConfigError(
            "speculative method 'mtp_ngram' on Ascend needs pipeline_parallel_size=1 "
            "(with pipeline parallelism vllm-ascend returns the MTP drafts in the step "
            "output, before the n-gram extension runs); got pipeline_parallel_size="
            f"{engine_args.pipeline_parallel_size}")


def missing_ascend_plugins(allowed: list[str] | None = None) -> list[str]:
    """vllm-ascend's vLLM plugins that ``VLLM_PLUGINS`` leaves out.

    ``VLLM_PLUGINS`` filters platform plugins as well as general ones, so a list that
    names ``vllm_specext`` but not ``ascend`` starts vLLM without its Ascend platform.

    Args:
        allowed: the ``VLLM_PLUGINS`` names (default: the environment variable split at
            commas, as vLLM does; unset means every plugin loads).

    Returns:
        Sorted entry-point names of the installed vllm-ascend (groups
        ``vllm.platform_plugins`` and ``vllm.general_plugins``) missing from ``allowed``;
        ``[]`` when ``VLLM_PLUGINS`` is unset or vllm-ascend is not installed.
    """
    if allowed is None:
        env = os.environ.get("VLLM_PLUGINS")
        if env is None:
            return []
        allowed = env.split(",")
    names = {ep.name for group in _PLUGIN_GROUPS for ep in entry_points(group=group)
             if ep.module.split(".")[0] == "vllm_ascend"}
    return sorted(names - set(allowed))


def warn_missing_ascend_plugins() -> list[str]:
    """Log a warning naming the vllm-ascend plugins ``VLLM_PLUGINS`` leaves out (see
    :func:`missing_ascend_plugins`); called from the plugin's ``register()``.

    Returns:
        The missing plugin names (``[]``: nothing logged).
    """
    missing = missing_ascend_plugins()
    if missing:
        listed = os.environ["VLLM_PLUGINS"]
        logger.warning(
            "vllm_specext: VLLM_PLUGINS=%s leaves out vllm-ascend's plugin(s) %s. "
            "VLLM_PLUGINS filters platform plugins too: without 'ascend' vLLM does not run "
            "on Ascend (and vllm_specext cannot hook its NPU runner). List them as well, "
            "e.g. VLLM_PLUGINS=%s, or unset VLLM_PLUGINS", listed, ",".join(missing),
            ",".join([*missing, *(n for n in listed.split(",") if n)]))
    return missing


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
    n-gram base's ``__init__`` never runs). The n-gram branch's call
    ``propose(num_spec_tokens_to_schedule, sampled, num_tokens_no_spec, token_ids_cpu)``
    goes to ``SpecExtProposer.propose``, which caps drafts to that budget.

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

    doc = ("SpecExtProposer for vllm-ascend's NPUModelRunner (an AscendNgramProposer for "
           "its isinstance dispatch; built by vllm_specext.integration.ascend).")
    return type("SpecExtAscendProposer", (SpecExtProposer, AscendNgramProposer),
                {"__module__": __name__, "__doc__": doc})


def patch_npu_model_runner(cls: type) -> None:
    """Wrap ``cls._get_drafter``, ``cls.__init__``, ``cls.load_model`` and, for
    ``mtp_ngram``, ``cls.propose_draft_token_ids`` once (idempotent).

    Args:
        cls: vllm-ascend's ``NPUModelRunner`` (or a subclass defining these methods).
    """
    from vllm_specext.integration.mtp_hybrid import patch_propose

    patch_propose(cls)  # False (no scheduler_output): mtp_hybrid refuses mtp_ngram there
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
        RuntimeError: from ``install_verify``, for a sampler whose ``forward`` reaches
            no compatible ``rejection_sample`` (the 310P sampler's ``forward`` reaches
            ``AscendRejectionSampler``'s through ``super()``, so it is supported).
    """
    from vllm_specext.integration.verify_hook import install_verify, rejection_module

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
        cover_rejection_sample(rejection_module(sampler))
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
