"""Names, codes and validation of verify strategies and accept policies.

Strategies (how a draft token is checked against the target model at its position):

``standard`` (default)
    vLLM's rule (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative
    Decoding", arXiv:2211.17192; Chen et al. 2023, arXiv:2302.01318): greedy rows accept
    while ``draft == argmax``; random rows accept with probability ``min(1, p(d)/q(d))``
    (``q = 1`` for model-free, one-hot drafts) and emit a token drawn from
    ``max(p - q, 0)`` (from ``p`` with the draft masked out when there is no ``q``) at the
    first rejection. Lossless.
``greedy``
    Every row, greedy or random, accepts while ``draft == argmax(target)`` and emits the
    argmax at the first mismatch (FastDeploy ``GREEDY``). Lossless for greedy requests;
    for random requests it replaces sampling by argmax at verified positions (lossy).
``target_match``
    Sample ``t_j ~ p_j`` with the request's generator (argmax for greedy rows), accept
    while ``draft_j == t_j``, emit ``t`` at the first mismatch (FastDeploy
    ``TARGET_MATCH``). Lossless. It ignores draft probabilities; for one-hot drafts it is
    distribution-identical to ``standard``.
``top_p`` (FastDeploy spelling ``topp``)
    Accept while the draft lies in the target's top-p nucleus (the smallest set of most
    probable tokens whose mass reaches ``top_p``); emit the target's sample (argmax for
    greedy rows) at the first rejection. Lossy.

Accept policies: ``normal``; ``accept_all`` (accept every draft, then the bonus token:
an upper bound, lossy); ``reject_all`` (accept nothing: exactly one token per step, the
target's own token at position 0, so it is as lossless as decoding without speculation).

Drafts equal to ``-1`` (forbidden by a grammar, or padding) are never accepted under any
strategy or policy.
"""
from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vllm_specext.config import SpecExtConfigError

#: Nucleus mass of the ``top_p`` strategy when none is given. 0.9 keeps the tokens that
#: carry 90% of the target's probability (after the request's own temperature/top-k/
#: top-p); 1.0 accepts any token with non-zero probability.
DEFAULT_TOP_P = 0.9


class Strategy(enum.IntEnum):
    """Per-row strategy codes used inside the vectorised kernel."""

    STANDARD = 0
    GREEDY = 1
    TARGET_MATCH = 2
    TOP_P = 3


class Policy(enum.IntEnum):
    """Per-row accept-policy codes used inside the vectorised kernel."""

    NORMAL = 0
    ACCEPT_ALL = 1
    REJECT_ALL = 2


STRATEGY_NAMES: dict[str, Strategy] = {
    "standard": Strategy.STANDARD,
    "greedy": Strategy.GREEDY,
    "target_match": Strategy.TARGET_MATCH,
    "top_p": Strategy.TOP_P,
}
#: Accepted spellings beyond the canonical names (FastDeploy uses ``topp``).
STRATEGY_ALIASES: dict[str, str] = {"topp": "top_p"}
POLICY_NAMES: dict[str, Policy] = {
    "normal": Policy.NORMAL,
    "accept_all": Policy.ACCEPT_ALL,
    "reject_all": Policy.REJECT_ALL,
}

#: Keys of ``SamplingParams.extra_args`` read for a per-request override.
REQUEST_KEYS = ("verify_strategy", "accept_policy", "verify_top_p")


def normalize_strategy(name: Any, key: str = "verify_strategy") -> str:
    """Canonical strategy name for ``name`` (case-insensitive; ``topp`` -> ``top_p``).

    Raises:
        SpecExtConfigError: unknown name; the message names ``key`` and the allowed values.
    """
    canon = STRATEGY_ALIASES.get(str(name).lower(), str(name).lower())
    if not isinstance(name, str) or canon not in STRATEGY_NAMES:
        allowed = ", ".join(repr(n) for n in (*STRATEGY_NAMES, *STRATEGY_ALIASES))
        raise SpecExtConfigError(f"{key!r}: unknown verify strategy {name!r}; allowed: {allowed}")
    return canon


def normalize_policy(name: Any, key: str = "accept_policy") -> str:
    """Canonical accept-policy name for ``name`` (case-insensitive).

    Raises:
        SpecExtConfigError: unknown name; the message names ``key`` and the allowed values.
    """
    canon = str(name).lower()
    if not isinstance(name, str) or canon not in POLICY_NAMES:
        allowed = ", ".join(repr(n) for n in POLICY_NAMES)
        raise SpecExtConfigError(f"{key!r}: unknown accept policy {name!r}; allowed: {allowed}")
    return canon


def check_top_p(value: Any, key: str = "top_p") -> float:
    """``value`` as a float in ``(0, 1]``.

    Raises:
        SpecExtConfigError: not a number, or outside ``(0, 1]``.
    """
    try:
        top_p = float(value)
    except (TypeError, ValueError):
        raise SpecExtConfigError(f"{key!r}: expected a float in (0, 1], got {value!r}") from None
    if isinstance(value, bool) or not math.isfinite(top_p) or not 0.0 < top_p <= 1.0:
        raise SpecExtConfigError(f"{key!r}: expected a float in (0, 1], got {value!r}")
    return top_p


@dataclass(frozen=True)
class VerifySpec:
    """A validated (strategy, accept policy, top_p) triple.

    Build it with :meth:`create`, which normalises aliases and validates every field.
    """

    strategy: str = "standard"
    accept_policy: str = "normal"
    top_p: float = DEFAULT_TOP_P

    @classmethod
    def create(cls, strategy: Any = "standard", accept_policy: Any = "normal",
               top_p: Any = DEFAULT_TOP_P) -> VerifySpec:
        """Validated spec.

        Raises:
            SpecExtConfigError: unknown strategy/policy name or ``top_p`` outside ``(0, 1]``.
        """
        return cls(normalize_strategy(strategy), normalize_policy(accept_policy),
                   check_top_p(top_p))

    @property
    def lossy(self) -> bool:
        """True when outputs may differ from the target's distribution for random requests."""
        return self.strategy in ("top_p", "greedy") or self.accept_policy == "accept_all"

    @property
    def is_default(self) -> bool:
        """True for vLLM's own behaviour (``standard`` + ``normal``)."""
        return self.strategy == "standard" and self.accept_policy == "normal"


def parse_request_override(extra_args: Mapping[str, Any] | None,
                           default: VerifySpec) -> VerifySpec | None:
    """The per-request spec from ``SamplingParams.extra_args``, or None when it sets none.

    Reads ``verify_strategy``, ``accept_policy`` and ``verify_top_p``; missing keys
    take ``default``'s values.

    Raises:
        SpecExtConfigError: a present key has an invalid value (message names the key).
    """
    if not extra_args or not any(k in extra_args for k in REQUEST_KEYS):
        return None
    return VerifySpec(
        normalize_strategy(extra_args.get("verify_strategy", default.strategy),
                           "verify_strategy"),
        normalize_policy(extra_args.get("accept_policy", default.accept_policy),
                         "accept_policy"),
        check_top_p(extra_args.get("verify_top_p", default.top_p), "verify_top_p"))
