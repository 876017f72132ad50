"""Teacher-forced replay of recorded requests through a proposer, and its metrics.

The loop is the engine's, with the target model replaced by the recorded output
(greedy verification, as Arctic's ``suffix_decoding/simulator.py`` does for suffix
decoding only)::

    p.start_request(rid, prompt_ids)
    while tokens are left:
        draft = p.propose([rid])[0]                   # <= k tokens
        a = longest prefix of draft equal to the next true tokens
        p.update(rid, truth[pos:pos + a + 1])          # accepted + bonus token
    p.stop_request(rid, finished=True)

One step emits ``a + 1`` tokens; when the draft reaches the end of the recorded output
no bonus token follows (the real next token would be EOS, which is not in the trace),
so tau = output tokens / steps exactly. Draft tokens past the end of the output count
as drafted and rejected. Requests run in file order on one proposer, so cross-request
caches see earlier requests as a server would (``cold``: a fresh proposer per request).
Only the public proposer API is used.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from vllm_specext.proposers.base import Proposer

#: Verification cost defaults, from ``shared/notes/vllm-cpu.md`` ("Verification cost on
#: this CPU", SmolLM2-135M bf16 batch 1, median ms per engine step): 33.2 ms for a
#: 1-token step; (50.5 - 33.2) / 16 = 1.08 ms per extra token (17-token step).
DEFAULT_STEP_MS = 33.2
DEFAULT_MS_PER_EXTRA_TOKEN = 1.08


@dataclass
class Request:
    """A tokenized request: ``key`` must be unique within a replay."""

    key: str
    category: str
    prompt: Sequence[int]
    output: Sequence[int]


@dataclass
class RequestResult:
    """What one replayed request did.

    Attributes:
        steps: verification steps (drafted or not).
        drafted_steps: steps whose draft was non-empty.
        drafted, accepted: draft tokens proposed / accepted over all steps.
        accept_hist: int64 ``(k+1,)``, drafted steps by accepted length ``0..k``.
        step_us: float64 ``(steps,)``, µs in ``propose`` + ``update`` per step.
        ctx_len: int64 ``(steps,)``, context tokens (prompt + output so far) per step.
        state_bytes: ``state_nbytes()`` while the request was active, just before it stopped.
    """

    key: str
    category: str
    output_tokens: int
    steps: int
    drafted_steps: int
    drafted: int
    accepted: int
    accept_hist: np.ndarray
    step_us: np.ndarray
    ctx_len: np.ndarray
    state_bytes: int


def replay(requests: Sequence[Request], make_proposer: Callable[[], Proposer], k: int,
           cold: bool = False, on_request: Callable[[], None] | None = None,
           tree_budget: int = 0) -> list[RequestResult]:
    """Replay ``requests`` in order through proposers from ``make_proposer``.

    Args:
        requests: tokenized requests in arrival order.
        make_proposer: builds a fresh proposer with ``num_speculative_tokens == k``
            (called once, or once per request with ``cold``, plus once for a
            throwaway warm-up request that keeps JIT compilation out of the timings).
        k: the draft cap the proposer was built with (sizes the histograms).
        cold: a fresh proposer per request, so no state crosses requests.
        on_request: called after each request (progress bars).
        tree_budget: if > 0, draft with ``propose_tree(rid, budget=tree_budget)``
            (``(tokens, parents)``, parents[i] < i, -1 for the root's children) and
            accept the longest root path that matches the truth, as Arctic's simulator
            does; drafted tokens are then tree nodes. 0: linear ``propose``.

    Returns:
        One :class:`RequestResult` per request, in order.

    Raises:
        RuntimeError: the proposer drafted more than ``k`` tokens (a chain) or a
            deeper path than ``k`` (a tree).
        TypeError: ``tree_budget > 0`` for a proposer without ``propose_tree``.
    """
    if requests:
        _warm_up(make_proposer(), requests[0], tree_budget)
    results: list[RequestResult] = []
    proposer = None if cold else make_proposer()
    for req in requests:
        results.append(_replay_request(make_proposer() if cold else proposer, req, k,
                                       tree_budget))
        if on_request is not None:
            on_request()
    return results


def replay_interleaved(requests: Sequence[Request],
                       makers: dict[str, Callable[[], Proposer]],
                       k: int) -> dict[str, list[RequestResult]]:
    """:func:`replay` of several proposers in lockstep: each request goes through every
    proposer (one each, built once, state kept across requests, after a throwaway
    warm-up each) before the next request starts, so that their step times are taken
    under the same machine load (on a shared VM the load drifts within seconds; whole
    replays one after the other differed by 2x in the no-draft floor).

    Args:
        requests: tokenized requests in arrival order.
        makers: name -> factory of a proposer with ``num_speculative_tokens == k``.
        k: the draft cap (chain drafts).

    Returns:
        name -> one :class:`RequestResult` per request, in order.

    Raises:
        RuntimeError: a proposer drafted more than ``k`` tokens.
    """
    if requests:
        for make in makers.values():
            _warm_up(make(), requests[0], 0)
    proposers = {name: make() for name, make in makers.items()}
    results: dict[str, list[RequestResult]] = {name: [] for name in makers}
    for req in requests:
        for name, p in proposers.items():
            results[name].append(_replay_request(p, req, k))
    return results


def _replay_request(p: Proposer, req: Request, k: int, tree_budget: int = 0) -> RequestResult:
    """One request of :func:`replay` through proposer ``p`` (started, stepped to the end
    of the recorded output, stopped as finished); ``p`` keeps its cross-request state."""
    clock = time.perf_counter_ns
    rid, truth = req.key, list(req.output)
    n_out, n_prompt = len(truth), len(req.prompt)
    p.start_request(rid, req.prompt)
    hist = np.zeros(k + 1, dtype=np.int64)
    step_ns: list[int] = []
    ctx: list[int] = []
    pos = drafted_steps = drafted = accepted = 0
    while pos < n_out:
        t0 = clock()
        if tree_budget:
            tokens, parents = p.propose_tree(rid, budget=tree_budget)
            t1 = clock()
            nd = len(tokens)
            a = _tree_accept(tokens.tolist(), parents.tolist(), truth, pos)
        else:
            draft = p.propose([rid])[0]
            t1 = clock()
            nd = len(draft)
            a = chain_accept(draft, truth, pos)
        depth = a if tree_budget else nd
        if depth > k:
            raise RuntimeError(f"{type(p).__name__} drafted {depth} > k={k} tokens in a row")
        emit = a + 1 if pos + a < n_out else a
        t2 = clock()
        p.update(rid, truth[pos: pos + emit])
        step_ns.append(t1 - t0 + clock() - t2)
        ctx.append(n_prompt + pos)
        if nd:
            drafted_steps += 1
            drafted += nd
            accepted += a
            hist[a] += 1
        pos += emit
    state = p.state_nbytes()
    p.stop_request(rid, finished=True)
    return RequestResult(
        key=rid, category=req.category, output_tokens=n_out, steps=len(step_ns),
        drafted_steps=drafted_steps, drafted=drafted, accepted=accepted, accept_hist=hist,
        step_us=np.asarray(step_ns, dtype=np.float64) / 1e3,
        ctx_len=np.asarray(ctx, dtype=np.int64), state_bytes=state)


def accept_lengths(requests: Sequence[Request], make_proposer: Callable[[], Proposer],
                   k: int) -> list[np.ndarray]:
    """The accepted length of a draft at *every* output position (the input of the
    per-step selection oracle in ``benchmarks/selection_bound.py``).

    One proposer (from ``make_proposer``, state kept across requests in order, as in
    :func:`replay`) is asked for a draft at output position ``g`` of each request, with
    context prompt + ``output[:g]``, and then given the single true token ``output[g]``:
    every position is probed, so the proposer sees one-token steps (its per-step
    statistics see more, shorter steps than in :func:`replay`).

    Args:
        requests: tokenized requests in arrival order.
        make_proposer: builds the proposer (``num_speculative_tokens == k``).
        k: the draft cap.

    Returns:
        Per request, int32 ``(len(output),)``: at ``g`` the length of the longest prefix
        of the draft equal to ``output[g:]``, in ``[0, min(k, len(output) - g)]``.

    Raises:
        RuntimeError: the proposer drafted more than ``k`` tokens.
    """
    p = make_proposer()
    out: list[np.ndarray] = []
    for req in requests:
        truth = list(req.output)
        p.start_request(req.key, req.prompt)
        lengths = np.zeros(len(truth), dtype=np.int32)
        for g in range(len(truth)):
            draft = p.propose([req.key])[0]
            if len(draft) > k:
                raise RuntimeError(f"{type(p).__name__} drafted {len(draft)} > k={k} tokens")
            lengths[g] = chain_accept(draft, truth, g)
            p.update(req.key, truth[g:g + 1])
        p.stop_request(req.key, finished=True)
        out.append(lengths)
    return out


def chain_accept(draft: Sequence[int], truth: Sequence[int], pos: int) -> int:
    """Length of the longest prefix of ``draft`` equal to ``truth[pos:]``: the tokens a
    greedy verifier accepts of a chain draft made at output position ``pos``."""
    a, lim = 0, min(len(draft), len(truth) - pos)
    while a < lim and draft[a] == truth[pos + a]:
        a += 1
    return a


def _tree_accept(tokens: list[int], parents: list[int], truth: Sequence[int], pos: int) -> int:
    """Length of the longest root path of a draft tree that matches ``truth[pos:]``.

    One forward pass suffices because a node's parent comes before it: after matching
    node ``cur``, its children all follow it.
    """
    cur, a = -1, 0
    for i, (tok, par) in enumerate(zip(tokens, parents)):
        if par == cur and pos + a < len(truth) and tok == truth[pos + a]:
            cur, a = i, a + 1
    return a


def _warm_up(p: Proposer, req: Request, tree_budget: int, steps: int = 4) -> None:
    """Drive a throwaway proposer through a few steps so one-time costs (numba JIT
    compilation, lazy allocation) stay out of the measured step times."""
    if tree_budget and not hasattr(p, "propose_tree"):
        raise TypeError(f"{type(p).__name__} has no propose_tree")
    p.start_request("__warmup__", req.prompt)
    for i in range(min(steps, len(req.output))):
        if tree_budget:
            p.propose_tree("__warmup__", budget=tree_budget)
        else:
            p.propose(["__warmup__"])
        p.update("__warmup__", req.output[i: i + 1])
    p.stop_request("__warmup__", finished=False)


@dataclass(frozen=True)
class CostModel:
    """Modelled verification cost: a step costs ``step_ms + ms_per_extra_token * drafts``
    plus the measured proposer time; plain decoding costs ``step_ms`` per token."""

    step_ms: float = DEFAULT_STEP_MS
    ms_per_extra_token: float = DEFAULT_MS_PER_EXTRA_TOKEN


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def summarize(results: Sequence[RequestResult], cost: CostModel,
              oracle_steps: Sequence[int] | None = None) -> dict:
    """Metrics of a group of replayed requests (e.g. one category).

    Args:
        results: the group's :class:`RequestResult` (all from the same k).
        cost: verification cost model for ``modelled_speedup``.
        oracle_steps: the oracle's steps per request (same order), if computed.

    Returns:
        A flat dict: ``requests``, ``output_tokens``, ``steps``, ``drafted_steps``,
        ``drafted_tokens``, ``accepted_tokens``, ``tau`` (output tokens / steps),
        ``acceptance_rate`` (accepted / drafted), ``mean_acceptance_length`` (vLLM's
        ``1 + accepted / drafted steps``), ``acceptance_by_position`` (list of k:
        drafted steps that accepted position i / drafted steps, as vLLM's per-position
        rate), ``wasted_draft_tokens`` (drafted - accepted), ``wasted_per_step``,
        ``proposer_us_median`` / ``proposer_us_p99`` (per step) and
        ``proposer_us_per_token`` (total / output tokens), ``state_bytes_peak``,
        ``oracle_steps``, ``oracle_tau``, ``tau_over_oracle``, ``modelled_speedup``.
        Ratios with a zero denominator are ``None``.
    """
    out_tok = sum(r.output_tokens for r in results)
    steps = sum(r.steps for r in results)
    d_steps = sum(r.drafted_steps for r in results)
    drafted = sum(r.drafted for r in results)
    accepted = sum(r.accepted for r in results)
    hist = np.sum([r.accept_hist for r in results], axis=0) if results else np.zeros(1)
    # steps that accepted more than i tokens, i = 0..k-1
    beyond = hist[::-1].cumsum()[::-1][1:]
    times = np.concatenate([r.step_us for r in results]) if results else np.zeros(0)
    total_us = float(times.sum())
    o_steps = sum(oracle_steps) if oracle_steps is not None else None
    tau = _ratio(out_tok, steps)
    spec_ms = steps * cost.step_ms + drafted * cost.ms_per_extra_token + total_us / 1e3
    return {
        "requests": len(results),
        "output_tokens": out_tok,
        "steps": steps,
        "drafted_steps": d_steps,
        "drafted_tokens": drafted,
        "accepted_tokens": accepted,
        "tau": tau,
        "acceptance_rate": _ratio(accepted, drafted),
        "mean_acceptance_length": 1 + accepted / d_steps if d_steps else None,
        "acceptance_by_position": [float(b) / d_steps if d_steps else None for b in beyond],
        "wasted_draft_tokens": drafted - accepted,
        "wasted_per_step": _ratio(drafted - accepted, steps),
        "proposer_us_median": float(np.median(times)) if len(times) else None,
        "proposer_us_p99": float(np.percentile(times, 99)) if len(times) else None,
        "proposer_us_per_token": _ratio(total_us, out_tok),
        "state_bytes_peak": max((r.state_bytes for r in results), default=0),
        "oracle_steps": o_steps,
        "oracle_tau": _ratio(out_tok, o_steps) if o_steps is not None else None,
        "tau_over_oracle": _ratio(o_steps, steps) if o_steps is not None else None,
        "modelled_speedup": _ratio(out_tok * cost.step_ms, spec_ms),
    }
