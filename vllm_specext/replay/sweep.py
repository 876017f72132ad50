"""The configurations a replay sweeps: methods x ``--param`` values x ``--k``.

``--param key=v1,v2`` applies to every selected method whose config schema
(:data:`vllm_specext.config.METHODS`) has ``key``; ``--param method.key=v1,v2`` to that
method only. Values are JSON scalars where they parse (``1``, ``0.5``, ``true``), else
strings. Several ``--param`` make a cartesian product per method.
"""
from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Any

from vllm_specext.config import METHODS, SpecExtConfigError
from vllm_specext.proposers import PROPOSER_CLASSES, Proposer, build_proposer


class ReplayError(ValueError):
    """Bad replay arguments (method, parameter, tokenizer or template)."""


@dataclass(frozen=True)
class ReplayConfig:
    """One proposer configuration to replay: ``build_proposer(method, k, **params)``."""

    method: str
    k: int
    params: dict[str, Any] = field(default_factory=dict, hash=False)
    #: > 0: replay with ``propose_tree(budget=tree_budget)`` (multi-branch, offline only)
    tree_budget: int = 0

    @property
    def label(self) -> str:
        """Short name for tables and plots, e.g. ``ngram prompt_lookup_min=1 k=8``."""
        extra = "".join(f" {k}={v}" for k, v in sorted(self.params.items()))
        tree = f" tree={self.tree_budget}" if self.tree_budget else ""
        return f"{self.method}{extra} k={self.k}{tree}"

    def build(self) -> Proposer:
        """A fresh proposer (raises :class:`ReplayError` if it cannot be built)."""
        return make_proposer(self.method, num_speculative_tokens=self.k, **self.params)


def make_proposer(method: str, **config: Any) -> Proposer:
    """:func:`build_proposer` with every failure turned into a :class:`ReplayError`.

    Raises:
        ReplayError: unknown or unimplemented method, bad key/value, or a registered
            method whose module cannot be imported.
    """
    try:
        return build_proposer(method, **config)
    except SpecExtConfigError as err:
        raise ReplayError(str(err)) from None
    except (ImportError, KeyError, AttributeError) as err:
        raise ReplayError(f"speculative method {method!r} is not available in this build "
                          f"({type(err).__name__}: {err}); registered: "
                          f"{', '.join(PROPOSER_CLASSES)}") from None


def available_methods() -> tuple[list[str], dict[str, str]]:
    """Methods of :data:`PROPOSER_CLASSES` that build with defaults, and why the others don't."""
    ok, skipped = [], {}
    for method in PROPOSER_CLASSES:
        try:
            make_proposer(method)
            ok.append(method)
        except ReplayError as err:
            skipped[method] = str(err)
    return ok, skipped


def parse_value(text: str) -> Any:
    """A ``--param`` value: a JSON scalar if it parses, else the string itself."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return text
    return value if isinstance(value, (int, float, bool, str)) or value is None else text


def parse_param(spec: str) -> tuple[str | None, str, list[Any]]:
    """Parse ``[method.]key=v1,v2`` into ``(method or None, key, [values])``.

    Raises:
        ReplayError: no ``=``, empty key or values, or a key the CLI sets itself.
    """
    name, sep, values = spec.partition("=")
    if not sep or not name or not values:
        raise ReplayError(f"--param {spec!r}: expected [method.]key=v1,v2")
    method, _, key = name.rpartition(".")
    key = key.replace("-", "_")
    if key in ("method", "num_speculative_tokens"):
        raise ReplayError(f"--param {spec!r}: set {key} with --methods / --k")
    return method or None, key, [parse_value(v) for v in values.split(",")]


def expand_configs(methods: list[str], params: list[str], ks: list[int],
                   tree_budgets: list[int] = (0,)) -> list[ReplayConfig]:
    """Every configuration to replay, validated by building each once.

    Args:
        methods: method names (``"all"`` = every available method).
        params: ``--param`` specs.
        ks: draft caps.
        tree_budgets: tree node budgets (0 = linear drafts); a budget > 0 applies only
            to methods whose proposer has ``propose_tree``.

    Raises:
        ReplayError: unknown/unavailable method, a param no selected method takes, or
            an invalid combination (the message is config.py's, naming key and range).
    """
    if methods == ["all"]:
        methods, _ = available_methods()
    parsed = [parse_param(p) for p in params]
    for pm, key, _ in parsed:
        if pm is not None and pm not in methods:
            raise ReplayError(f"--param {pm}.{key}: method {pm!r} is not in --methods")
        targets = [pm] if pm else methods
        if not any(m in METHODS and key in METHODS[m].model_fields for m in targets):
            raise ReplayError(f"--param {key}: no selected method ({', '.join(targets)}) "
                              f"has this key")
    configs = []
    for method in methods:
        fields = METHODS[method].model_fields if method in METHODS else {}
        mine = [(key, vals) for pm, key, vals in parsed if pm in (None, method) and key in fields]
        keys = [key for key, _ in mine]
        for combo in itertools.product(*(vals for _, vals in mine)):
            for k in ks:
                proposer = ReplayConfig(method, k, dict(zip(keys, combo))).build()
                budgets = tree_budgets if hasattr(proposer, "propose_tree") else [0]
                configs += [ReplayConfig(method, k, dict(zip(keys, combo)), b)
                            for b in dict.fromkeys(budgets)]
    return configs
