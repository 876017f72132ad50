"""Validation of ``speculative_config`` for the vllm_specext methods.

Every method has a pydantic schema (``extra="forbid"``): the same keys are accepted by
``vllm serve --speculative-config``, ``LLM(speculative_config=...)`` and
:func:`vllm_specext.proposers.build_proposer`. Bad input raises
:class:`SpecExtConfigError` (a ``ValueError``) whose message names the key and the
allowed values, at config time.
"""
from __future__ import annotations

import difflib
import json
import logging
import typing
from typing import Any, ClassVar, Literal

from pydantic import (BaseModel, ConfigDict, Field, ValidationError, field_validator,
                      model_validator)

logger = logging.getLogger(__name__)

#: vLLM's hard cap on draft tokens per request per step (``MAX_SPEC_LEN``).
MAX_SPEC_LEN = 128


class SpecExtConfigError(ValueError):
    """An invalid speculative config; the message names the offending key(s)."""


class VerifyConfig(BaseModel):
    """How drafts are verified (see :mod:`vllm_specext.verify`). These keys also work with
    vLLM's own methods, e.g. ``{"method": "eagle", ..., "verify_strategy": "greedy"}``."""

    # NaN and inf are refused in every float key (an infinite factor would silently
    # turn drafting off, a NaN bound compares false everywhere)
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    verify_strategy: Literal["standard", "greedy", "top_p", "target_match"] = Field(
        "standard", description="standard (vLLM's rule, lossless), greedy, target_match "
        "(lossless), top_p (lossy; FastDeploy spelling 'topp' accepted)")
    accept_policy: Literal["normal", "accept_all", "reject_all"] = Field(
        "normal", description="accept_all is lossy (an upper bound); reject_all emits one "
        "token per step (an overhead baseline)")
    verify_top_p: float = Field(0.9, gt=0.0, le=1.0,
                                description="nucleus mass of verify_strategy='top_p'")

    @field_validator("verify_strategy", mode="before")
    @classmethod
    def _fastdeploy_spelling(cls, v):
        return "top_p" if v == "topp" else v

    #: the keys of this class, for splitting them off a vLLM method's dict
    KEYS: ClassVar[frozenset[str]] = frozenset(
        {"verify_strategy", "accept_policy", "verify_top_p"})


class MethodConfig(VerifyConfig):
    """Keys shared by every method."""

    METHOD: ClassVar[str] = ""
    #: False while the method is registered but not built yet.
    IMPLEMENTED: ClassVar[bool] = True

    method: str
    num_speculative_tokens: int = Field(8, ge=1, le=MAX_SPEC_LEN,
                                        description="k: most draft tokens per request per step")
    adaptive: bool = Field(True, description="adapt each request's draft length to its "
                           "measured acceptance and the measured cost of a draft token")
    adaptive_threshold: float | None = Field(
        None, ge=0.0, le=1.0, description="fixed emission probability a draft token must "
        "beat, with no batch-level check; None = measured online from the step-time cost model")
    adaptive_decay: float = Field(0.8, gt=0.0, lt=1.0,
                                  description="weight of acceptance history per observation")
    adaptive_margin: float = Field(
        1.5, ge=1.0, le=4.0, description="how many times its measured cost a draft must be "
        "expected to return before it is shown (1.0 = break-even)")
    adaptive_drain: bool = Field(
        False, description="with no request waiting, value a request's accepted tokens by "
        "its share of finishing last, read from the max_tokens it has left (False: every "
        "accepted token is worth a decode row, as while requests queue; off by default: "
        "it lost up to 7% of tok/s at batch 32 in the e2e benchmark)")
    adaptive_verified_scale: int = Field(
        3, ge=0, le=64, description="verified-step sizes whose latest steps, within 32 "
        "decode steps, rescale the whole verified-step cost curve (their median level); "
        "0 = off, each size learns only from its own steps")

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, v, info):
        """``true`` is not a count or a rate (pydantic's lax mode would read it as 1)."""
        field = cls.model_fields.get(info.field_name)
        if isinstance(v, bool) and field is not None:
            types = {field.annotation, *typing.get_args(field.annotation)}
            if bool not in types and types & {int, float}:
                raise ValueError("must be a number, not a boolean")
        return v

    #: keys consumed by the engine layer, not by proposer constructors
    ENGINE_KEYS: ClassVar[frozenset[str]] = VerifyConfig.KEYS | frozenset({
        "method", "adaptive", "adaptive_threshold", "adaptive_decay", "adaptive_margin",
        "adaptive_drain", "adaptive_verified_scale"})

    def proposer_kwargs(self) -> dict[str, Any]:
        """The keys a proposer constructor takes (everything but engine-layer keys)."""
        return self.model_dump(exclude=set(self.ENGINE_KEYS))


def _rejected_tail_field() -> Any:
    """The ``rejected_tail`` key of the methods that find nothing in some steps."""
    return Field(2, ge=0, le=MAX_SPEC_LEN, description=(
        "where the proposer finds nothing, draft up to this many tokens of the request's "
        "last draft past the token the target model replaced (vllm_specext.proposers."
        "rejected_tail; 0: off). Replay at k = 8 (Spec-Bench, MT-Bench, CNN/DM, OpenHands): "
        "2 gives tau +0.4% to +0.7% with the modelled speedup unchanged (-0.15% to +0.1%); the "
        "whole tail (k) +0.5% to +1.0% tau but 0.6-1.0 more wasted draft tokens per step "
        "and -1.0% to -1.9% modelled speedup"))


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
    """SuffixDecoding (Oliaro et al. 2025; ArcticInference) with voting drafts (see
    :mod:`vllm_specext.proposers.suffix`). Keys and meanings as vLLM's; FastDeploy spells
    them the same way (``fastdeploy/spec_decode/suffix.py``). Extra key:
    ``suffix_decoding_max_spec_offset`` (Arctic's ``max_spec_offset``).

    Defaults were chosen by teacher-forced trace replay at k = 8 over the six files of
    ``shared/traces`` (every third Spec-Bench and CodeQwen request, all of the others);
    each field states its measurement against vLLM's value (24 / 10000 / 1.0 / 0.1),
    re-checked with the learned local weight on Spec-Bench and OpenHands.
    With all defaults, tau relative to ArcticInference at vLLM's defaults on the full
    files (``benchmarks/suffix_vs_arctic.py``, with ``rejected_tail`` 2): Spec-Bench 1.125x,
    CodeQwen 1.111x, MT-Bench 1.084x, RAG 1.204x, CNN/DM 1.129x, OpenHands 1.164x (without
    it, Spec-Bench 1.121x, OpenHands 1.155x, CNN/DM 1.123x). The price of factor 8.0 is draft
    length: 5.0-5.8 rejected draft tokens per step (5.2-6.0 with the tail), vs 1.0-1.6 for
    Arctic at vLLM's defaults.
    """

    METHOD: ClassVar[str] = "suffix"
    suffix_decoding_max_tree_depth: int = Field(
        24, ge=1, le=1024,
        description="longest stored suffix: bounds match + draft length. vLLM's 24 kept: "
                    "32 and 64 gave the same tau on Spec-Bench and OpenHands, and every "
                    "committed token costs O(depth)")
    suffix_decoding_max_cached_requests: int = Field(
        10000, ge=-1, le=(1 << 31) - 1,
        description="finished outputs kept in the global tree, FIFO (-1: unbounded, 0: no "
                    "global tree). vLLM's 10000 kept: no trace stream exceeds 1,700 requests")
    suffix_decoding_max_spec_factor: float = Field(
        8.0, ge=0.0, le=MAX_SPEC_LEN,
        description="a longest match of m tokens drafts at most int(m * factor + offset). "
                    "8.0 (vs vLLM's 1.0) at k = 8: tau +7% (MT-Bench) to +17% (RAG), "
                    "acceptance rate 0.30-0.52 -> 0.09-0.26; 2.0 / 4.0 give about half / "
                    "85% of the tau gain")
    suffix_decoding_min_token_prob: float = Field(
        0.05, ge=0.0, le=1.0,
        description="stop drafting when the path probability (product of vote shares) falls "
                    "below this. 0.05 (vs vLLM's 0.1): tau +0.2-0.6%; 0.0 adds <= 0.2%")
    suffix_decoding_max_spec_offset: float = Field(
        0.0, ge=-MAX_SPEC_LEN, le=MAX_SPEC_LEN,
        description="offset of the per-match draft cap (Arctic's max_spec_offset)")
    rejected_tail: int = _rejected_tail_field()


class MemoryDecodingConfig(MethodConfig):
    """Trie of past outputs plus the request's own context (PIA Lookahead, Zhao et al.
    KDD 2024; MindIE ``memory_decoding``).

    MindIE's rule ``speculationGamma >= decoding_length`` maps onto
    ``num_speculative_tokens``: omitted, it is ``decoding_length``; omitting
    ``decoding_length`` instead gives ``min(num_speculative_tokens, 16)``; both given
    with ``num_speculative_tokens < decoding_length`` is an error.
    """

    METHOD: ClassVar[str] = "memory_decoding"
    decoding_length: int = Field(16, ge=1, le=16, description="most draft tokens per step")
    dynamic_algo: bool = Field(False, description="per-request draft length from acceptance")
    branch_length: int = Field(16, ge=2, le=64,
                               description="longest n-gram counted in the shared trie (its "
                               "depth; a finished request costs this many trie updates per "
                               "token, at stop_request)")
    max_query_length: int = Field(4, ge=1, le=16,
                                  description="longest context suffix used as a lookup key")
    max_nodes: int = Field(1 << 20, ge=1024, le=1 << 26,
                           description="node cap of the shared trie (40 bytes per node)")
    eviction: Literal["frequency", "age"] = "frequency"
    prompt_first: bool = Field(True, description="own context outranks the shared trie on ties")
    insert_prompt: bool = Field(False, description="count finished requests' whole prompts in "
                                "the trie (default: their last branch_length - 1 tokens)")
    rejected_tail: int = _rejected_tail_field()

    @model_validator(mode="before")
    @classmethod
    def _derive_lengths(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        k, dl = data.get("num_speculative_tokens"), data.get("decoding_length")
        if k is None:  # an invalid decoding_length is reported as itself, not as k too
            dl_int = _as_int(dl)
            data = {**data, "num_speculative_tokens":
                    dl_int if dl_int is not None and 1 <= dl_int <= 16 else 16}
        elif dl is None and (k_int := _as_int(k)) is not None:
            data = {**data, "decoding_length": min(max(k_int, 1), 16)}
        return data

    @model_validator(mode="after")
    def _consistent(self):
        if self.num_speculative_tokens < self.decoding_length:
            raise ValueError(
                f"num_speculative_tokens ({self.num_speculative_tokens}) must be >= "
                f"decoding_length ({self.decoding_length}) (MindIE: speculationGamma >= "
                f"decoding_length); omit num_speculative_tokens to derive it")
        if self.branch_length <= self.max_query_length:
            raise ValueError(
                f"branch_length ({self.branch_length}) must be > max_query_length "
                f"({self.max_query_length}) so that a matched key has a continuation")
        return self


class LookaheadConfig(MethodConfig):
    """Jacobi-iteration n-gram pool (Fu et al., ICML 2024; MindIE ``la``) on vLLM's single
    draft chain (see :mod:`vllm_specext.proposers.lookahead`).

    MindIE's rule ``speculationGamma >= (level-1) * (window+guess_set_size)`` budgets the
    paper's step, which verifies the whole 2-D window and G candidates at once. Here a step
    verifies one chain holding either the W-token Jacobi window or pool continuations of
    level-1 tokens (G candidates are kept, one is drafted), so the rule becomes
    ``num_speculative_tokens >= max(window, level - 1)``. Omitted
    ``num_speculative_tokens`` is ``max(window, level - 1)``; omitted ``window`` /
    ``level`` with ``num_speculative_tokens`` given are MindIE's defaults clipped to fit it.
    """

    METHOD: ClassVar[str] = "lookahead"
    level: int = Field(4, ge=3, le=16, description="N: n-gram length (continuations and "
                       "trajectories of N-1 tokens, keys of 1..N-1 tokens)")
    window: int = Field(5, ge=1, le=16, description="W: Jacobi guesses per request, drafted "
                        "when the pool has no continuation")
    guess_set_size: int = Field(5, ge=1, le=16, description="G: continuations kept per key "
                                "(most recent first; the most recent is drafted)")
    shared_pool_size: int = Field(
        0, ge=0, le=1 << 26, description="most continuations in a pool shared across "
        "requests (Jacobi and output n-grams, next tokens; 0: per-request pools only); two "
        "halves, the older dropped when the newer fills; about 100 bytes per continuation "
        "at level 4")
    prompt_lookup_max: int = Field(
        5, ge=0, le=64, description="longest suffix n-gram (from 2 tokens) matched by "
        "prompt lookup in the request's context, whose k-token continuation is drafted "
        "before the pool is tried (as method ngram); 0: off, pool and window only, as in "
        "the paper")
    adaptive: bool = Field(True, description="on by default, as for every method: at "
                           "batch 8 on CPU it keeps 0.95-1.02x no speculation where off gives "
                           "0.45-0.84x; off drafts the whole Jacobi window for the target's "
                           "feedback, which feeds the pool (batch 1, open_chat, k = 8: tau "
                           "1.46 off, 1.32 on)")

    @model_validator(mode="before")
    @classmethod
    def _derive_lengths(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data

        k, w, n = (_as_int(data.get(key)) for key in ("num_speculative_tokens", "window",
                                                      "level"))
        if data.get("num_speculative_tokens") is None:
            w = 5 if data.get("window") is None else w
            n = 4 if data.get("level") is None else n
            if w is not None and n is not None:
                data = {**data, "num_speculative_tokens": max(w, n - 1)}
        elif k is not None:
            if data.get("window") is None:
                data = {**data, "window": min(5, max(k, 1))}
            if data.get("level") is None:
                data = {**data, "level": max(3, min(4, k + 1))}
        return data

    @model_validator(mode="after")
    def _budget(self):
        need = max(self.window, self.level - 1)
        if self.num_speculative_tokens < need:
            raise ValueError(
                f"num_speculative_tokens ({self.num_speculative_tokens}) must be >= "
                f"max(window ({self.window}), level - 1 ({self.level - 1})) = {need}: one "
                f"step verifies the Jacobi window or a level-1 continuation (this replaces "
                f"MindIE's speculationGamma >= (level-1)*(window+guess_set_size), see "
                f"LookaheadConfig); omit num_speculative_tokens to derive it")
        return self


class MtpNgramConfig(NgramConfig):
    """MTP-head drafts extended by n-gram matching (FastDeploy ``mtp_strategy: with_ngram``).

    The model's MTP layers (vLLM ``method="mtp"``) draft ``num_model_steps`` tokens; prompt
    lookup over the context *followed by those drafts* appends tokens up to
    ``num_speculative_tokens``. ``model``: optional MTP weights (default: the target).
    Runs only inside vLLM (:mod:`vllm_specext.integration.mtp_hybrid`).
    """

    METHOD: ClassVar[str] = "mtp_ngram"
    #: FastDeploy key -> ours, accepted in the ``{"method": "mtp", "mtp_strategy": ...}`` form
    FASTDEPLOY_KEYS: ClassVar[dict[str, str]] = {"max_ngram_size": "prompt_lookup_max",
                                                 "min_ngram_size": "prompt_lookup_min"}
    num_model_steps: int = Field(1, ge=1, le=MAX_SPEC_LEN,
                                 description="m: draft tokens from the MTP layers per step")
    model: str | None = Field(None, min_length=1,
                              description="MTP weights (default: the target model's)")

    @model_validator(mode="after")
    def _k_ge_m(self):
        if self.num_speculative_tokens < self.num_model_steps:
            raise ValueError(
                f"num_speculative_tokens ({self.num_speculative_tokens}) must be >= "
                f"num_model_steps ({self.num_model_steps}): the MTP drafts are part of the "
                f"num_speculative_tokens budget")
        return self

    @classmethod
    def resolve_alias(cls, spec: dict[str, Any]) -> dict[str, Any]:
        """Map FastDeploy's form ``{"method": "mtp", "mtp_strategy": ...}`` to ours.

        ``"with_ngram"`` becomes ``method="mtp_ngram"`` (``max_ngram_size`` /
        ``min_ngram_size`` renamed to ``prompt_lookup_max`` / ``prompt_lookup_min``);
        ``"default"`` is vLLM's own ``mtp`` (the key is dropped). Any other dict is
        returned unchanged.

        Raises:
            SpecExtConfigError: ``mtp_strategy`` with another method or value.
        """
        spec = canonical_keys(spec)
        if "mtp_strategy" not in spec:
            return spec
        strategy = spec.pop("mtp_strategy")
        if spec.get("method") != "mtp" or strategy not in ("default", "with_ngram"):
            raise SpecExtConfigError(
                f"'mtp_strategy': got {strategy!r} with method {spec.get('method')!r}; "
                f"allowed: 'default' or 'with_ngram', with method 'mtp'")
        if strategy == "with_ngram":
            spec["method"] = cls.METHOD
            for theirs, ours in cls.FASTDEPLOY_KEYS.items():
                if theirs in spec:
                    if ours in spec and spec[ours] != spec[theirs]:
                        raise SpecExtConfigError(
                            f"{theirs!r} ({spec[theirs]!r}, FastDeploy's name) contradicts "
                            f"{ours!r} ({spec[ours]!r}); give one of them")
                    spec[ours] = spec.pop(theirs)
        return spec


METHODS: dict[str, type[MethodConfig]] = {
    c.METHOD: c for c in (NgramConfig, SuffixConfig, MemoryDecodingConfig,
                          LookaheadConfig, MtpNgramConfig, NaiveConfig)
}


#: MindIE's ``plugin_params`` names of our methods
MINDIE_PLUGIN_TYPES = {"memory_decoding": "memory_decoding", "la": "lookahead"}


def canonical_keys(spec: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``spec`` with ``-`` in keys spelled ``_``.

    Raises:
        SpecExtConfigError: two keys that are the same key once spelled so (e.g.
            ``num-speculative-tokens`` and ``num_speculative_tokens``): which one wins
            would be a guess.
    """
    out: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for key, value in spec.items():
        canon = str(key).replace("-", "_")
        if canon in out:
            raise SpecExtConfigError(f"{spelled[canon]!r} and {key!r} are the same key "
                                     f"({canon!r}) given twice; give it once")
        out[canon], spelled[canon] = value, str(key)
    return out


def _unwrap_plugin_params(spec: dict[str, Any]) -> dict[str, Any]:
    """MindIE's wrapper ``{"plugin_params": {...} or "<JSON object>"}``: its keys merged
    into the others."""
    params = spec.pop("plugin_params")
    if isinstance(params, str):
        try:
            params = json.loads(params)
        except json.JSONDecodeError as err:
            raise SpecExtConfigError(f"'plugin_params': not valid JSON ({err})") from None
    if not isinstance(params, dict):
        raise SpecExtConfigError(f"'plugin_params': got {type(params).__name__} "
                                 f"{params!r}; allowed: a JSON object (or a string of one)")
    params = canonical_keys(params)
    for key in params.keys() & spec.keys():
        if params[key] != spec[key]:
            raise SpecExtConfigError(f"{key!r} is given in 'plugin_params' ({params[key]!r}) "
                                     f"and beside it ({spec[key]!r}); give it once")
    return {**spec, **params}


def _check_method_key(spec: dict[str, Any]) -> None:
    """``method``, when given, is a string (or null: vLLM infers it from the draft
    model); a key that is ``method`` up to case and spaces is not mistaken for a missing
    one."""
    if "method" in spec:
        if spec["method"] is not None and not isinstance(spec["method"], str):
            raise SpecExtConfigError(
                f"'method': got {type(spec['method']).__name__} {spec['method']!r}; allowed: "
                f"a string, one of ours ({', '.join(METHODS)}) or one of vLLM's")
        return
    for key in spec:
        if key.strip().lower() == "method":
            raise SpecExtConfigError(f"unknown key {key!r}: did you mean 'method'? (keys are "
                                     f"lower case, without spaces)")


def resolve_aliases(spec: dict[str, Any]) -> dict[str, Any]:
    """Map other projects' spellings of a speculative config onto ours.

    ``-`` in keys becomes ``_`` (:func:`canonical_keys`); MindIE's wrapper
    ``{"plugin_params": {...}}`` (or a JSON string of it) is unwrapped, and its
    ``{"plugin_type": "memory_decoding" | "la", ...}`` becomes ``method``
    ``memory_decoding`` / ``lookahead``; FastDeploy's ``{"method": "mtp", "mtp_strategy":
    ...}`` is handled by :meth:`MtpNgramConfig.resolve_alias`. Other dicts are returned
    unchanged (a copy).

    Raises:
        SpecExtConfigError: a key given twice (in two spellings, or in and beside
            ``plugin_params``), an unknown ``plugin_type`` or one that contradicts
            ``method``, a ``method`` that is not a string, or a key that is ``method``
            mistyped by case or spaces.
    """
    spec = canonical_keys(spec)
    if "plugin_params" in spec:
        spec = _unwrap_plugin_params(spec)
    if "plugin_type" in spec:
        plugin = spec.pop("plugin_type")
        method = MINDIE_PLUGIN_TYPES.get(plugin) if isinstance(plugin, str) else None
        if method is None:
            raise SpecExtConfigError(f"'plugin_type': got {plugin!r}; allowed: "
                                     f"{', '.join(map(repr, MINDIE_PLUGIN_TYPES))}")
        if spec.setdefault("method", method) != method:
            raise SpecExtConfigError(f"'plugin_type' {plugin!r} contradicts 'method' "
                                     f"{spec['method']!r}; give one of them")
    _check_method_key(spec)
    return MtpNgramConfig.resolve_alias(spec)


def _as_int(value: Any) -> int | None:
    """``value`` as the int pydantic's lax mode reads it (an int, a whole float, or a
    string of either), else None; bools are not ints here (:class:`MethodConfig` rejects
    them)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            try:
                value = float(value)
            except ValueError:
                return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def close_method(method: Any) -> str | None:
    """The vllm_specext method a mistyped ``method`` most likely means (``-`` for ``_``,
    case, or a near spelling: ``difflib`` ratio >= 0.8), or None."""
    if not isinstance(method, str) or method in METHODS:
        return None
    key = method.strip().lower().replace("-", "_")
    if key in METHODS:
        return key
    close = difflib.get_close_matches(key, list(METHODS), n=1, cutoff=0.8)
    return close[0] if close else None


def _allowed(model: type[BaseModel], key: str) -> str:
    """Describe the allowed values of ``model.key`` from its annotation and bounds."""
    field = model.model_fields.get(key)
    if field is None:
        return ""
    ann = field.annotation
    if typing.get_origin(ann) is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(ann))
    lo = hi = None  # (bound, inclusive)
    for m in field.metadata:
        for attr, inclusive in (("ge", True), ("gt", False)):
            if getattr(m, attr, None) is not None:
                lo = (getattr(m, attr), inclusive)
        for attr, inclusive in (("le", True), ("lt", False)):
            if getattr(m, attr, None) is not None:
                hi = (getattr(m, attr), inclusive)
    tname = getattr(ann, "__name__", str(ann))
    if lo is not None and hi is not None:
        return f"{tname} in {'[' if lo[1] else '('}{lo[0]}, {hi[0]}{']' if hi[1] else ')'}"
    if lo is not None:
        return f"{tname} {'>=' if lo[1] else '>'} {lo[0]}"
    if hi is not None:
        return f"{tname} {'<=' if hi[1] else '<'} {hi[0]}"
    return tname


def _explain(method: str, model: type[BaseModel], err: ValidationError) -> str:
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


def validate_verify_config(config: dict[str, Any]) -> VerifyConfig:
    """Validate verify keys given alongside one of vLLM's own methods.

    Raises:
        SpecExtConfigError: unknown key or value, naming it and the allowed values.
    """
    try:
        cfg = VerifyConfig(**config)
    except ValidationError as err:
        raise SpecExtConfigError(_explain("<vllm method>", VerifyConfig, err)) from None
    _warn_if_lossy(cfg)
    return cfg


def _warn_if_lossy(cfg: VerifyConfig) -> None:
    if cfg.verify_strategy == "top_p" or cfg.accept_policy == "accept_all":
        logger.warning("vllm_specext: verify_strategy=%r / accept_policy=%r is lossy: outputs "
                       "differ from the target model's distribution", cfg.verify_strategy,
                       cfg.accept_policy)


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
    config = resolve_aliases(config)
    if "use_builtin" in config:
        raise SpecExtConfigError(
            "'use_builtin' is read where vLLM starts (vllm serve, LLM()) and hands the method "
            "to vLLM's own implementation; validate_config and build_proposer make "
            "vllm_specext's proposers only")
    method = config.get("method")
    if method is None:
        raise SpecExtConfigError(f"'method' is missing; allowed: {', '.join(METHODS)}")
    if method not in METHODS:
        guess = close_method(method)
        raise SpecExtConfigError(
            f"unknown speculative method {method!r}"
            + (f" (did you mean {guess!r}?)" if guess else "")
            + f"; allowed: {', '.join(METHODS)}")
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
    _warn_if_lossy(cfg)
    return cfg
