"""Validation of ``speculative_config`` for the vllm_specext methods.

Every method has a pydantic schema (``extra="forbid"``): the same keys are accepted by
``vllm serve --speculative-config``, ``LLM(speculative_config=...)`` and
:func:`vllm_specext.proposers.build_proposer`. Bad input raises
:class:`SpecExtConfigError` (a ``ValueError``) whose message names the key and the
allowed values, at config time.
"""
from __future__ import annotations

import logging
import typing
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

logger = logging.getLogger(__name__)

#: vLLM's hard cap on draft tokens per request per step (``MAX_SPEC_LEN``).
MAX_SPEC_LEN = 128


class SpecExtConfigError(ValueError):
    """An invalid speculative config; the message names the offending key(s)."""


class AdaptiveConfig(BaseModel):
    """Per-request adaptive draft length (see README, "Adaptive speculation")."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = True


class MethodConfig(BaseModel):
    """Keys shared by every method."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    METHOD: ClassVar[str] = ""
    #: False while the method is registered but not built yet.
    IMPLEMENTED: ClassVar[bool] = True

    method: str
    num_speculative_tokens: int = Field(8, ge=1, le=MAX_SPEC_LEN,
                                        description="k: most draft tokens per request per step")
    verify_strategy: Literal["standard", "greedy", "top_p", "target_match"] = "standard"
    accept_policy: Literal["normal", "accept_all", "reject_all"] = "normal"

    def proposer_kwargs(self) -> dict[str, Any]:
        """The keys a proposer constructor takes (everything but method/verify keys)."""
        return self.model_dump(exclude={"method", "verify_strategy", "accept_policy"})


class NgramConfig(MethodConfig):
    """Prompt lookup (Saxena 2023; vLLM ``ngram``) over an incremental n-gram index."""

    METHOD: ClassVar[str] = "ngram"
    prompt_lookup_min: int = Field(2, ge=1, le=64, description="shortest suffix n-gram to match")
    prompt_lookup_max: int = Field(5, ge=1, le=64, description="longest suffix n-gram to match")

    @model_validator(mode="after")
    def _min_le_max(self):
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                f"prompt_lookup_min ({self.prompt_lookup_min}) must be <= "
                f"prompt_lookup_max ({self.prompt_lookup_max})")
        return self


class NaiveConfig(MethodConfig):
    """The speculative code path with zero drafts (overhead/correctness baseline)."""

    METHOD: ClassVar[str] = "naive"


class SuffixConfig(MethodConfig):
    """SuffixDecoding (Oliaro et al. 2025; ArcticInference). Keys as in vLLM."""

    METHOD: ClassVar[str] = "suffix"
    IMPLEMENTED: ClassVar[bool] = False
    suffix_decoding_max_tree_depth: int = Field(24, ge=1, le=1024)
    suffix_decoding_max_cached_requests: int = Field(10000, ge=-1)
    suffix_decoding_max_spec_factor: float = Field(1.0, ge=0.0)
    suffix_decoding_min_token_prob: float = Field(0.1, ge=0.0, le=1.0)


class MemoryDecodingConfig(MethodConfig):
    """Trie of past prompts and outputs (PIA Lookahead, Zhao et al. KDD 2024; MindIE)."""

    METHOD: ClassVar[str] = "memory_decoding"
    IMPLEMENTED: ClassVar[bool] = False
    decoding_length: int = Field(16, ge=1, le=16)
    dynamic_algo: bool = False


class LookaheadConfig(MethodConfig):
    """Jacobi-iteration n-gram pool (Fu et al., ICML 2024; MindIE ``la``)."""

    METHOD: ClassVar[str] = "lookahead"
    IMPLEMENTED: ClassVar[bool] = False
    level: int = Field(4, ge=3, le=16)
    window: int = Field(5, ge=1, le=16)
    guess_set_size: int = Field(5, ge=1, le=16)


class MtpNgramConfig(MethodConfig):
    """MTP-head drafts extended by n-gram matching (FastDeploy ``mtp_strategy: with_ngram``)."""

    METHOD: ClassVar[str] = "mtp_ngram"
    IMPLEMENTED: ClassVar[bool] = False
    num_model_steps: int = Field(1, ge=1, le=MAX_SPEC_LEN)
    model: str | None = None
    prompt_lookup_min: int = Field(2, ge=1, le=64)
    prompt_lookup_max: int = Field(5, ge=1, le=64)


METHODS: dict[str, type[MethodConfig]] = {
    c.METHOD: c for c in (NgramConfig, SuffixConfig, MemoryDecodingConfig,
                          LookaheadConfig, MtpNgramConfig, NaiveConfig)
}


def _allowed(model: type[BaseModel], key: str) -> str:
    """Describe the allowed values of ``model.key`` from its annotation and bounds."""
    field = model.model_fields.get(key)
    if field is None:
        return ""
    ann = field.annotation
    if typing.get_origin(ann) is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(ann))
    lo = hi = None
    for m in field.metadata:
        lo = getattr(m, "ge", None) if getattr(m, "ge", None) is not None else lo
        hi = getattr(m, "le", None) if getattr(m, "le", None) is not None else hi
    tname = getattr(ann, "__name__", str(ann))
    if lo is not None and hi is not None:
        return f"{tname} in [{lo}, {hi}]"
    if lo is not None:
        return f"{tname} >= {lo}"
    if hi is not None:
        return f"{tname} <= {hi}"
    return tname


def _explain(method: str, model: type[MethodConfig], err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            allowed = ", ".join(sorted(model.model_fields))
            lines.append(f"unknown key {key!r} for method {method!r}; allowed keys: {allowed}")
        elif not key:  # model-level validator (contradictory keys)
            lines.append(e["msg"].removeprefix("Value error, "))
        else:
            allowed = _allowed(model, key)
            got = e.get("input")
            lines.append(f"{key!r}: {e['msg']} (got {got!r}); allowed: {allowed}")
    return f"invalid speculative_config for method {method!r}: " + "; ".join(lines)


def validate_config(config: dict[str, Any]) -> MethodConfig:
    """Validate a speculative config dict for one of our methods.

    Args:
        config: the ``speculative_config`` dict; must contain ``"method"``. Keys may use
            ``-`` or ``_``.

    Returns:
        The frozen, validated :class:`MethodConfig` subclass instance with defaults.

    Raises:
        SpecExtConfigError: unknown method, unknown key, wrong type, out-of-range or
            contradictory values, or a method that is registered but not implemented yet.
    """
    if not isinstance(config, dict):
        raise SpecExtConfigError(
            f"speculative_config must be a JSON object / dict, got {type(config).__name__}")
    config = {str(k).replace("-", "_"): v for k, v in config.items()}
    method = config.get("method")
    if method not in METHODS:
        raise SpecExtConfigError(
            f"unknown speculative method {method!r}; allowed: {', '.join(METHODS)}")
    model = METHODS[method]
    if not model.IMPLEMENTED:
        raise SpecExtConfigError(
            f"speculative method {method!r} is registered by vllm_specext but not "
            f"implemented yet; available now: "
            f"{', '.join(m for m, c in METHODS.items() if c.IMPLEMENTED)}")
    try:
        cfg = model(**config)
    except ValidationError as err:
        raise SpecExtConfigError(_explain(method, model, err)) from None
    if cfg.verify_strategy == "top_p" or cfg.accept_policy == "accept_all":
        logger.warning("vllm_specext: verify_strategy=%r / accept_policy=%r is lossy: outputs "
                       "differ from the target model's distribution", cfg.verify_strategy,
                       cfg.accept_policy)
    return cfg
