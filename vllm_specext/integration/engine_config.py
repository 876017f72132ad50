"""The config front door (process 0): turn our methods into vLLM's ``custom_class``.

``EngineArgs.create_speculative_config`` is the single place where both
``vllm serve --speculative-config`` and ``LLM(speculative_config=...)`` become a
``SpeculativeConfig``. We wrap it: a dict whose ``method`` is one of ours is validated
with :func:`vllm_specext.config.validate_config` (clear errors at start-up), stored in
``additional_config["vllm_specext"]`` (which travels to every engine and worker
process), and rewritten to vLLM's built-in ``custom_class`` method pointing at
:class:`vllm_specext.integration.adapter.SpecExtProposer`. That gives the V1 runner
(the CPU runner, and the V2->V1 fallback on GPU), no draft KV cache and synchronous
scheduling, with no change to vLLM's pydantic schema.

``{"method": "ngram", "use_builtin": true, ...}`` (or ``"suffix"``) passes the dict to
vLLM's own implementation (minus ``use_builtin``), for A/B comparisons. With any vLLM
method, our verify keys (``verify_strategy``, ``accept_policy``, ``verify_top_p``) are
split off into ``additional_config["vllm_specext"]`` and applied by the worker.
"""
from __future__ import annotations

import functools
from typing import Any

from vllm_specext.config import (METHODS, MtpNgramConfig, SpecExtConfigError, VerifyConfig,
                                 close_method, resolve_aliases, validate_config,
                                 validate_verify_config)

ADAPTER_CLASS = "vllm_specext.integration.adapter.SpecExtProposer"
ADDITIONAL_CONFIG_KEY = "vllm_specext"
#: our methods that vLLM also implements (reachable with ``"use_builtin": true``)
BUILTIN_TWINS = frozenset({"ngram", "suffix"})


def normalise(spec: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Rewrite a user speculative-config dict for vLLM.

    Args:
        spec: the user's dict (keys with ``-`` or ``_``).

    Returns:
        ``(vllm_dict, specext_config)``: the dict vLLM's ``SpeculativeConfig`` gets and,
        for our methods, the validated config to put in ``additional_config``
        (``None`` when the dict is not ours).

    Raises:
        vllm_specext.config.SpecExtConfigError: our method with invalid keys/values.
    """
    spec = resolve_aliases(spec)  # '-' keys, MindIE plugin_params, FastDeploy mtp_strategy
    builtin = spec.pop("use_builtin", False)
    if not isinstance(builtin, bool):
        raise SpecExtConfigError(f"'use_builtin': got {builtin!r}; allowed: true or false")
    if builtin and spec.get("method") not in BUILTIN_TWINS:
        raise SpecExtConfigError(f"'use_builtin' applies to methods {sorted(BUILTIN_TWINS)} "
                                 f"(vLLM's own implementations), not {spec.get('method')!r}")
    if not builtin and close_method(spec.get("method")):
        validate_config(spec)  # raises "did you mean ...": vLLM's check lists only its own
    if builtin or spec.get("method") not in METHODS:  # vLLM's method, maybe our verify keys
        verify = {k: spec.pop(k) for k in VerifyConfig.KEYS & set(spec)}
        if builtin:
            _check_builtin_keys(spec)
        return spec, (validate_verify_config(verify).model_dump() if verify else None)
    cfg = validate_config(spec)
    if cfg.method == MtpNgramConfig.METHOD:  # vLLM's own MTP drafter, extended in the worker
        from vllm_specext.integration.mtp_hybrid import vllm_speculative_config

        return vllm_speculative_config(cfg), cfg.model_dump()
    vllm_spec = {"method": "custom_class", "model": ADAPTER_CLASS,
                 "num_speculative_tokens": cfg.num_speculative_tokens}
    return vllm_spec, cfg.model_dump()


def _check_builtin_keys(spec: dict[str, Any]) -> None:
    """Refuse, naming them, keys of ours that vLLM's own ``ngram`` / ``suffix`` would not
    take (e.g. ``adaptive``, ``rejected_tail``), instead of vLLM's generic pydantic error.
    Skipped where vLLM's ``SpeculativeConfig`` fields cannot be read."""
    try:
        from vllm.config import SpeculativeConfig
    except ImportError:
        return
    fields = (getattr(SpeculativeConfig, "__dataclass_fields__", None)
              or getattr(SpeculativeConfig, "model_fields", None))
    ours = sorted(set(spec) - set(fields or spec))
    if ours:
        raise SpecExtConfigError(
            f"'use_builtin': true hands the config to vLLM's own {spec.get('method')!r}, "
            f"which has no key(s) {ours}; drop them, or drop 'use_builtin' to use "
            "vllm_specext's implementation")


def patch_engine_args() -> None:
    """Wrap ``EngineArgs.create_speculative_config`` once (idempotent)."""
    from vllm.engine.arg_utils import EngineArgs

    original = EngineArgs.create_speculative_config
    if getattr(original, "_specext_wrapped", False):
        return

    @functools.wraps(original)
    def create_speculative_config(self, *args, **kwargs):
        if self.speculative_config is not None and not isinstance(self.speculative_config, dict):
            raise SpecExtConfigError(
                "speculative_config must be a JSON object / dict such as "
                f'{{"method": "ngram", "num_speculative_tokens": 8}}, got '
                f"{type(self.speculative_config).__name__} {self.speculative_config!r}")
        if isinstance(self.speculative_config, dict):
            vllm_spec, specext = normalise(self.speculative_config)
            self.speculative_config = vllm_spec
            if specext is not None:
                from vllm_specext.integration.ascend import check_engine_args

                check_engine_args(self, specext)  # V2 runner, mtp_ngram + PP on Ascend
                self.additional_config = dict(self.additional_config or {})
                self.additional_config[ADDITIONAL_CONFIG_KEY] = specext
            if (specext or {}).get("method") == MtpNgramConfig.METHOD:
                from vllm_specext.integration.mtp_hybrid import require_sync_v1

                require_sync_v1(self)
        return original(self, *args, **kwargs)

    create_speculative_config._specext_wrapped = True
    EngineArgs.create_speculative_config = create_speculative_config
