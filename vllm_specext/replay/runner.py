"""Run a replay: load and tokenize trace files, replay every configuration, collect rows.

A *stream* is the requests of one file that share a tokenizer, in file order; each
configuration gets one proposer per stream (or per request with ``cold``), so
cross-request state never mixes token ids of two vocabularies. Rows are per
(file, category, configuration), plus a category ``"ALL"`` per file.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vllm_specext.replay.oracle import oracle_request_steps
from vllm_specext.replay.simulate import CostModel, Request, RequestResult, replay, summarize
from vllm_specext.replay.sweep import ReplayConfig, ReplayError
from vllm_specext.replay.tokenizers import ReplayTokenizer, load_tokenizer
from vllm_specext.replay.traces import load_traces, tokenize_record

ALL = "ALL"


def pick_rule(rules: Sequence[str], *names: str) -> str | None:
    """The rule value for a request, by priority of ``names`` (model, then file name).

    A rule is ``PATTERN=VALUE`` (``PATTERN`` is a case-insensitive substring of a name)
    or a bare ``VALUE`` (default). The first rule matching ``names[0]`` wins, else the
    first matching ``names[1]``, and so on; else the first bare value; else ``None``.
    """
    parsed = [rule.partition("=") for rule in rules]
    for name in names:
        for pattern, sep, value in parsed:
            if sep and pattern.lower() in name.lower():
                return value
    return next((pattern for pattern, sep, _ in parsed if not sep), None)


@dataclass
class Stream:
    """Tokenized requests of one file that share a tokenizer."""

    file: str
    tokenizer: str
    requests: list[Request] = field(default_factory=list)


def load_streams(path: str | Path, tokenizer_rules: Sequence[str], template_rules: Sequence[str],
                 limit: int | None, cache: dict[str, ReplayTokenizer]) -> list[Stream]:
    """Tokenize the first ``limit`` requests of a trace file into streams.

    Raises:
        ReplayError: no tokenizer rule matches a request's model or the file name, or a
            tokenizer/template problem (the message names the file and line).
    """
    path = Path(path)
    streams: dict[str, Stream] = {}
    for rec in load_traces(path, limit):
        spec = pick_rule(tokenizer_rules, rec.model, path.name)
        if spec is None:
            raise ReplayError(f"{path.name}:{rec.line}: no --tokenizer rule matches model "
                              f"{rec.model!r} or the file name")
        if spec not in cache:
            try:
                cache[spec] = load_tokenizer(spec)
            except (OSError, ValueError) as err:
                raise ReplayError(f"--tokenizer {spec}: {err}") from None
        template = pick_rule(template_rules, rec.model, path.name) or "auto"
        try:
            prompt, output = tokenize_record(rec, cache[spec], template)
        except ValueError as err:
            raise ReplayError(f"{path.name}:{rec.line}: {err} (model {rec.model!r}, "
                              f"tokenizer {spec!r} picked by the --tokenizer rules, template "
                              f"{template!r}; a rule whose pattern is in the model name "
                              "outranks one matching the file name)") from None
        stream = streams.setdefault(spec, Stream(path.name, cache[spec].name))
        stream.requests.append(Request(f"{path.name}:{rec.line}:{rec.id}", rec.category,
                                       prompt, output))
    return list(streams.values())


@dataclass
class ReplayRun:
    """The outcome of :func:`run_replay`.

    Attributes:
        rows: one metrics dict per (file, category, config), see :func:`summarize`,
            with ``file``, ``category``, ``method``, ``params``, ``k``, ``label`` and
            ``tokenizers`` added.
        latency: ``{(file, label): (ctx_len int64 (steps,), µs float64 (steps,))}``.
    """

    rows: list[dict]
    latency: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]


def run_replay(files: Sequence[str | Path], configs: Sequence[ReplayConfig],
               tokenizer_rules: Sequence[str], template_rules: Sequence[str] = (),
               limit: int | None = None, cold: bool = False, cost: CostModel | None = None,
               progress: Callable[[int], Callable[[], None]] | None = None) -> ReplayRun:
    """Replay every configuration on every file.

    Args:
        files: JSONL trace files.
        configs: from :func:`vllm_specext.replay.sweep.expand_configs`.
        tokenizer_rules, template_rules: ``PATTERN=VALUE`` or ``VALUE`` (see :func:`pick_rule`).
        limit: replay only the first ``limit`` requests of each file.
        cold: a fresh proposer per request.
        cost: the verification cost model (default :class:`CostModel`).
        progress: given the total number of request replays, returns a per-request tick.

    Raises:
        ReplayError, vllm_specext.replay.traces.TraceError: bad inputs.
    """
    cost = cost or CostModel()
    cache: dict[str, ReplayTokenizer] = {}
    per_file = [(Path(f).name, load_streams(f, tokenizer_rules, template_rules, limit, cache))
                for f in files]
    total = len(configs) * sum(len(s.requests) for _, streams in per_file for s in streams)
    tick = progress(total) if progress else None
    ks = sorted({c.k for c in configs})
    rows: list[dict] = []
    latency: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}
    for fname, streams in per_file:
        oracle = [oracle_request_steps([(r.prompt, r.output) for r in s.requests], ks, cold)
                  for s in streams]
        tok_names = sorted({s.tokenizer for s in streams})
        for cfg in configs:
            results: list[RequestResult] = []
            o_steps: list[int] = []
            for stream, orc in zip(streams, oracle):
                results += replay(stream.requests, cfg.build, cfg.k, cold, tick, cfg.tree_budget)
                o_steps += orc[cfg.k]
            cats = sorted({r.category for r in results})
            for cat in cats + [ALL]:
                idx = [i for i, r in enumerate(results) if cat in (ALL, r.category)]
                row = summarize([results[i] for i in idx], cost, [o_steps[i] for i in idx])
                rows.append({"file": fname, "category": cat, "method": cfg.method,
                             "params": cfg.params, "k": cfg.k, "tree_budget": cfg.tree_budget,
                             "label": cfg.label,
                             "cold": cold, "tokenizers": tok_names, **row})
            latency[(fname, cfg.label)] = (
                np.concatenate([r.ctx_len for r in results]) if results else np.zeros(0, np.int64),
                np.concatenate([r.step_us for r in results]) if results else np.zeros(0))
    return ReplayRun(rows, latency)
