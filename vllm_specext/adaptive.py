"""Adaptive speculation: how many draft tokens each request gets, step by step.

Two measured quantities decide it:

* **Acceptance per request** (:class:`DraftLengthController`): decayed estimates of the
  probability ``alpha1`` that the first draft token is accepted and ``alpha2`` that each
  further one is, given the ones before it were (the geometric model of Leviathan et al.
  2023, §3.5, with its own first step), shrunk towards all requests' rates. Drafted
  positions count as verified; when a request gets no draft, the full draft the proposer
  *would* have made is still compared with the tokens that are then committed ("shadow"
  drafts), over as many steps as it takes, so a request whose acceptance returns
  recovers, its ``alpha2`` included.
* **Cost of drafting** (:class:`StepCostModel`): the target's step time ``T(n)`` over the
  number of tokens ``n`` a decode step schedules, a piecewise-linear curve through running
  means of the steps measured in the running engine (CPU, GPU or NPU alike; steps that
  verified drafts apart from plain ones, which take vLLM's plain sampling path).

A draft token at depth ``j`` pays off when its chance of being emitted,
``p_j = alpha1 · alpha2**(j-1)``, beats its marginal cost relative to the tokens the step
already produces: throughput ``(rows + accepted) / T(rows + drafts)`` grows iff
``accepted · T(rows) > rows · (T(rows + drafts) - T(rows))``. Per token that is
``p_j > rows · price / T(rows)``, ``price`` being the time per draft token of a verified step
(:meth:`StepCostModel.threshold`), so each request drafts
``L = max{j <= k : p_j > threshold}`` tokens — zero when speculation does not pay. Then the
batch as a whole drafts only if its expected accepted tokens pay for the measured
``T(rows + D) - T(rows)`` of its ``D`` draft tokens (:meth:`StepCostModel.pays_off`);
otherwise the step runs plain. That values every accepted token at ``T(rows) / rows``, as
a queue that refills freed slots gains it. With nothing waiting the engine drains a finite
set of requests, whose time is set by the last to finish: an accepted token then saves a
row of a later step, and a whole step only for the request that finishes last. With
``adaptive_drain`` (off by default: on the e2e benchmark it lost up to 7% at batch 32 and
was even at batch 8) each request's token is then weighted by its share of finishing
last, read from the ``max_tokens`` it has left (:meth:`StepCostModel.token_weights`,
:func:`last_finisher_shares`).
A request whose drafts keep being withheld is drafted for only every few steps
(:meth:`DraftLengthController.proposes`), so that speculation that does not pay stops
costing the proposer's time too. A step that verifies no draft although the
curves say it should not is shown one now and then, so that what verifying costs is measured
again (:func:`shown_drafts`).

Before the cost model has a measurement (3 timed steps of one size and kind; only steps in
which every request decodes are timed) every request drafts its full draft: the first
steps measure what drafting costs. Once verified steps are measured, a step in which
every request decodes and that would verify drafts runs plain when no plain step was timed
near its size, or when the one timed there is slower than a later verified step with more
tokens, so that the price of drafting is not read off a borrowed, distant or stale plain
time (:meth:`StepCostModel.plain_due`, which also bounds those steps). "Steps" in the
counters below are such timed decode steps.
"""
from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from typing import Any


class DraftLengthController:
    """Per-request draft length from decayed acceptance statistics.

    Two acceptance probabilities per request: ``alpha1`` of the first draft token and
    ``alpha2`` of each further one given that the tokens before it were accepted (drafts
    that copy a span either miss at once or run long, so one geometric rate would
    under-draft copies and over-draft guesses). Each is the request's own decayed hit
    rate shrunk towards that of all requests (empirical Bayes):
    ``(hits + w·rate_all) / (trials + w)``. The few recent observations of one request
    are noisy, and drafting only where that noisy estimate is high overrates the drafts
    that get shown (measured on the e2e benchmark at batch 8: predicted accepted tokens
    1.06 per shown draft, realized 0.74, without shrinkage).

    The depth-``j`` draft token is emitted with probability ``alpha1 · alpha2**(j-1)``.

    Both rates are kept per *draft kind* too: a proposer may say what each draft came from
    (:attr:`~vllm_specext.proposers.base.Proposer.last_kinds`, e.g. ``lookahead``'s n-gram
    pool by key length vs its Jacobi window of guesses), and one request's drafts of
    different kinds are accepted at very different rates.

    Args:
        k: most draft tokens per step (>= 1).
        decay: weight of a request's history per trial, in (0, 1): a scored draft is
            one first-token trial and one trial per further position it reached, so
            with 0.8 a request's rates follow its last few drafts.
        prior_alpha: acceptance assumed before any observation, in (0, 1).
        prior_weight: ``w``, pseudo-observations of the all-request rates behind each
            request's estimates (> 0).
        global_decay: weight of the all-request history per trial, in (0, 1) (at a
            large batch, hundreds of trials a step: the all-request rates follow the
            last few steps).
        num_kinds: draft kinds told apart (``0 .. num_kinds - 1``; larger kinds share the
            last one).
        idle_steps: after this many decode steps (>= 0) in a row whose drafts were
            withheld, a request is drafted for (:meth:`proposes`) only every
            ``probe_every`` steps.
        probe_every: the probing period (>= 1) of an idle request; its shadow drafts
            then come that much more rarely, so a request whose acceptance returns
            recovers that much later (in steps).

    Raises:
        ValueError: an argument outside its range (the message names it).
    """

    def __init__(self, k: int, decay: float = 0.8, prior_alpha: float = 0.5,
                 prior_weight: float = 4.0, global_decay: float = 0.995, num_kinds: int = 32,
                 idle_steps: int = 8, probe_every: int = 4):
        _check("DraftLengthController", (
            ("k", k, k >= 1, ">= 1"), ("idle_steps", idle_steps, idle_steps >= 0, ">= 0"),
            ("probe_every", probe_every, probe_every >= 1, ">= 1"),
            ("num_kinds", num_kinds, num_kinds >= 1, ">= 1"),
            ("decay", decay, 0.0 < decay < 1.0, "in (0, 1)"),
            ("prior_alpha", prior_alpha, 0.0 < prior_alpha < 1.0, "in (0, 1)"),
            ("global_decay", global_decay, 0.0 < global_decay < 1.0, "in (0, 1)"),
            ("prior_weight", prior_weight, prior_weight > 0.0, "> 0")))
        self.k = k
        self.idle_steps = idle_steps
        self.probe_every = probe_every
        self.decay = decay
        self.prior_weight = prior_weight
        self.global_decay = global_decay
        self.num_kinds = num_kinds
        # per draft kind, decayed [first hits, first trials, further hits, further trials]
        self._all = {kind: [prior_alpha, 1.0, prior_alpha, 1.0] for kind in range(num_kinds)}
        self._stats: dict[str, dict[int, list[float]]] = {}  # request -> kind -> stats
        self._full_draft: dict[str, tuple[list[int], int]] = {}  # request -> (draft, kind)
        self._shown: set[str] = set()  # requests whose last draft was shown (in part)
        self._idle: dict[str, int] = {}  # request -> decode steps in a row with drafts withheld
        # request -> drafts still being compared with committed tokens: (draft, kind, matched)
        self._scoring: dict[str, list[tuple[list[int], int, int]]] = {}

    def _kind(self, kind: int) -> int:
        return min(max(int(kind), 0), self.num_kinds - 1)

    def acceptance(self, req_id: str, kind: int = 0) -> tuple[float, float]:
        """``(alpha1, alpha2)`` of ``req_id``'s drafts of ``kind``, each in [0, 1] (an
        unknown request gets the all-request rates of that kind)."""
        kind = self._kind(kind)
        w, g = self.prior_weight, self._all[kind]
        h1, t1, h2, t2 = self._stats.get(req_id, {}).get(kind, (0.0, 0.0, 0.0, 0.0))
        return ((h1 + w * g[0] / g[1]) / (t1 + w), (h2 + w * g[2] / g[3]) / (t2 + w))

    def length(self, req_id: str, threshold: float, kind: int = 0) -> int:
        """Draft length for a ``kind`` draft of ``req_id``: the largest ``j <= k`` with
        ``alpha1 · alpha2**(j-1) > threshold``."""
        a1, a2 = self.acceptance(req_id, kind)
        if threshold <= 0.0:
            return self.k
        if a1 <= threshold:
            return 0
        if a2 >= 1.0:
            return self.k
        if a2 <= 0.0:
            return 1
        return min(self.k, 1 + int(math.log(threshold / a1) / math.log(a2)))

    def trim(self, req_ids: Sequence[str], drafts: list[list[int]],
             threshold: float | Sequence[float],
             kinds: Sequence[int] | None = None) -> list[list[int]]:
        """Cut each full draft to its request's length; remember the full draft.

        Args:
            req_ids: request ids, one per draft.
            drafts: the proposer's drafts (0..k tokens each).
            threshold: the per-token emission probability a draft token must beat
                (see :meth:`StepCostModel.threshold`), one for all drafts or one per
                draft.
            kinds: the proposer's class of each draft (:attr:`Proposer.last_kinds`:
                what it was drafted from, e.g. a long match or a guess); acceptance is
                tracked per request and kind. None: one kind (0).

        Returns:
            The trimmed drafts (prefixes of ``drafts``).
        """
        thresholds = ([threshold] * len(drafts) if isinstance(threshold, (int, float))
                      else threshold)
        out = []
        for i, (rid, draft) in enumerate(zip(req_ids, drafts)):
            kind = self._kind(kinds[i]) if kinds is not None else 0
            n = self.length(rid, thresholds[i], kind) if draft else 0
            self._full_draft[rid] = (draft, kind)
            if n:
                self._shown.add(rid)
            else:
                self._shown.discard(rid)
            out.append(draft[:n])
        return out

    def expected_accepted(self, req_id: str, length: int, kind: int = 0) -> float:
        """Expected accepted tokens of a ``length``-token ``kind`` draft of ``req_id``:
        ``sum(alpha1 · alpha2**(j-1) for j in 1..length)``."""
        a1, a2 = self.acceptance(req_id, kind)
        return a1 * (float(length) if a2 >= 1.0 else (1.0 - a2 ** length) / (1.0 - a2))

    def withhold(self, req_ids: Sequence[str]) -> list[list[int]]:
        """Show no draft this step (the full drafts from :meth:`trim` stay as shadow
        drafts); returns one empty draft per request."""
        self._shown.difference_update(req_ids)
        return [[] for _ in req_ids]

    def observe(self, req_id: str, committed: Sequence[int]) -> None:
        """Score the drafts of ``req_id`` against the tokens committed after them.

        Each draft (shown or not) is compared token by token with what is committed from
        then on, over as many steps as it takes: a shown draft's positions match exactly
        as far as the verifier accepted; a withheld (shadow) draft, or the part of a
        shown one beyond the tokens shown, is compared with the tokens that later steps
        commit. The first draft token is recorded at once; the further ones once the
        draft misses or runs out, so ``alpha2`` is measured on whole drafts even while
        drafts are withheld (a step without drafts commits one token).

        Args:
            req_id: the request.
            committed: the tokens this step committed for it (accepted draft tokens and
                the bonus token); empty when it did not decode this step, which drops
                its last draft unscored.
        """
        draft, kind = self._full_draft.pop(req_id, ((), 0))
        shown = req_id in self._shown
        self._shown.discard(req_id)
        if not committed:
            return
        idle = self._idle.get(req_id, 0)
        # idle: the proposer's drafts keep being withheld; before the request probes (when
        # it is asked every step) a step that found nothing is not counted (see proposes)
        uncounted = not draft and idle < self.idle_steps
        self._idle[req_id] = 0 if shown else idle if uncounted else idle + 1
        scoring = self._scoring.pop(req_id, [])
        if draft:
            scoring.append((draft, kind, 0))
        still = []
        for tokens, knd, matched in scoring:
            n = min(len(committed), len(tokens) - matched)
            i = 0
            while i < n and tokens[matched + i] == committed[i]:
                i += 1
            if matched == 0:  # the first draft token's trial
                self._record(req_id, knd, 1.0 if i else 0.0, 1.0, 0.0, 0.0)
            matched += i
            if i == len(committed) and matched < len(tokens):
                still.append((tokens, knd, matched))
            elif len(tokens) > 1 and matched > 0:  # the further positions' trials
                missed = 1.0 if matched < len(tokens) else 0.0
                self._record(req_id, knd, 0.0, 0.0, float(matched - 1), matched - 1 + missed)
        if still:
            self._scoring[req_id] = still

    def _record(self, req_id: str, kind: int, first_hits: float, first_trials: float,
                further_hits: float, further_trials: float) -> None:
        """Add a scored draft's trials to the request's and the all-request statistics of
        ``kind``, each decayed by one observation per trial."""
        if first_trials == 0.0 and further_trials == 0.0:
            return
        stats = self._stats.setdefault(req_id, {}).setdefault(kind, [0.0, 0.0, 0.0, 0.0])
        for table, decay in ((stats, self.decay), (self._all[kind], self.global_decay)):
            d1, d2 = decay ** first_trials, decay ** further_trials
            table[0] = table[0] * d1 + first_hits
            table[1] = table[1] * d1 + first_trials
            table[2] = table[2] * d2 + further_hits
            table[3] = table[3] * d2 + further_trials

    def proposes(self, req_id: str) -> bool:
        """Whether to ask the proposer for ``req_id``'s draft this step: always until its
        drafts have been withheld (made but not shown) ``idle_steps`` decode steps with
        no draft shown between them, then every ``probe_every``-th step (its shadow draft is scored and may be
        shown). A shown draft ends the idle run. A step in which the proposer, asked,
        finds nothing does not count towards ``idle_steps``: a proposer that just lost
        its match (e.g. an n-gram after an edit) is asked every step, so the match is
        drafted as soon as it returns. Once the request probes, such a step counts like
        a withheld one: at batch 32 on CPU, where suffix finds nothing for a few rows
        each step, ending the run there had kept 17-21 of 32 rows asked per step.
        Drafting costs the proposer's time even when the draft is withheld: 0.1-0.5 ms
        per step at batch 8 on CPU, 0.5-2% of a step, in workloads where speculation
        does not pay."""
        return self._asks(self._idle.get(req_id, 0))

    def _asks(self, idle: int) -> bool:
        """:meth:`proposes` for a request idle for ``idle`` steps."""
        return idle < self.idle_steps or (idle - self.idle_steps) % self.probe_every == 0

    def forget(self, req_id: str) -> None:
        """Drop everything kept for ``req_id``: when it finished, and when the engine's
        view of its tokens no longer matches (preempted and resumed, or its id reused by
        another request; the two are not told apart, so a resumed request starts again from
        the all-request rates). Drafts still being scored when it ended keep only their
        first-token trial (counting their matched further positions as hits lowered
        modelled tok/s offline by up to 5% in ``adaptive_replay.py``'s 4-prompt cells,
        e.g. ``suffix`` summarization ``slope`` 1.015 -> 0.980)."""
        for table in (self._stats, self._full_draft, self._idle, self._scoring):
            table.pop(req_id, None)
        self._shown.discard(req_id)


#: a plain group this many times slower than a verified group of at least as many tokens
#: timed after it is timed again (:meth:`StepCostModel.plain_due`): interference (other
#: engines starting on the same cores) slowed start-up steps 4-15x; noise between
#: identical steps stays within ~10%
PLAIN_STALE_RATIO = 1.25

#: a plain curve's point more than this many times slower than a point of more tokens
#: observed more than ``pair_gap`` steps after it is left out of the curve
#: (:func:`_isotonic`), and a plain group whose ``min_samples`` latest steps in a row all
#: read more than this factor faster than its time restarts from their median
#: (:class:`_StepGroup`): a new batch's shorter contexts made every step 15-40% faster (the
#: e2e benchmark's batch-32 cells after the warm-up's longer copy prompts), while noise
#: mostly slows single steps (slower steps keep the 2x rule: interference only slows)
LEVEL_SHIFT_RATIO = 1.1


def shown_drafts(controller: DraftLengthController, cost_model: StepCostModel,
                 req_ids: Sequence[str], drafts: list[list[int]], kinds: Sequence[int],
                 rows: int, fixed_threshold: float | None = None,
                 remaining: Sequence[int] | None = None) -> list[list[int]]:
    """The drafts one step shows, by the rule in the module docstring: each request's
    draft cut to its length (:meth:`DraftLengthController.trim`), then all of them
    withheld unless the batch's expected accepted tokens pay for their measured cost
    (:meth:`StepCostModel.pays_off`). So that what verifying costs is measured again, a
    withheld step shows the full draft of the request expected to accept most when the
    cost model is :attr:`~StepCostModel.exploring` (an exploration cut to nothing by the
    limit below is not one), and a step that shows drafts shows the
    most-cut one in full when the size that step then has is
    :meth:`~StepCostModel.unmeasured`; a step that would show drafts runs plain instead
    when :meth:`~StepCostModel.plain_due`. Last, the drafts are cut to the step size the
    measured curves can vouch for (:meth:`~StepCostModel.token_limit`; each draft keeps its
    first tokens, the longest cut first). The vLLM adapter and the offline simulation
    (``benchmarks/adaptive_replay.py``) both decide through this function.

    Args:
        controller, cost_model: the running estimates (updated elsewhere: the
            controller by :meth:`~DraftLengthController.observe`, the cost model by
            :meth:`~StepCostModel.observe`).
        req_ids: one id per row; drafts: the proposer's full drafts (0..k tokens each);
            kinds: their :attr:`~vllm_specext.proposers.base.Proposer.last_kinds`.
        rows: requests decoding this step.
        fixed_threshold: ``adaptive_threshold``: a fixed per-token emission probability
            in [0, 1] and no batch-level check; None: priced by ``cost_model``.
        remaining: when no request waits and every row decodes, the output tokens each
            row's request may still emit (its ``max_tokens`` budget left): the engine
            then drains a finite set of requests, whose time is set by the last to
            finish, and an accepted token is valued by
            :meth:`StepCostModel.token_weights` with
            :func:`last_finisher_shares`. None: every accepted token is valued at the
            step's time per row, as with a queue that refills freed slots.

    Returns:
        One draft per row, each a prefix of the proposer's (possibly empty).
    """
    if fixed_threshold is not None:
        return controller.trim(req_ids, drafts, fixed_threshold, kinds)
    full = drafts
    draft_tokens = sum(map(len, drafts))
    if not draft_tokens:  # nothing to show, explore or time
        return controller.withhold(req_ids)
    threshold = cost_model.threshold(rows, draft_tokens)
    weights = ([1.0] * len(drafts) if remaining is None else cost_model.token_weights(
        rows, draft_tokens, last_finisher_shares(remaining, controller.k)))
    drafts = controller.trim(req_ids, drafts, [
        threshold if threshold <= 0.0 else threshold / w if w > 0.0 else math.inf
        for w in weights], kinds)
    expected = sum(w * controller.expected_accepted(rid, len(d), kind)
                   for rid, d, kind, w in zip(req_ids, drafts, kinds, weights) if d)
    shown = (drafts if cost_model.pays_off(rows, expected, sum(map(len, drafts)))
             else controller.withhold(req_ids))
    if any(shown) and rows == len(req_ids) and cost_model.plain_due(rows):
        cost_model.probed_plain(rows)  # every row decodes, so the plain step is timed
        return controller.withhold(req_ids)
    limit = cost_model.token_limit()
    if any(shown):  # the step verifies anyway: the most-cut draft in full, when its size is due
        i = max(range(len(full)), key=lambda j: len(full[j]) - len(shown[j]))
        tokens = rows + sum(map(len, shown)) - len(shown[i]) + len(full[i])
        if len(shown[i]) == len(full[i]) or not cost_model.unmeasured(tokens):
            return _level(shown, limit - rows)
    elif cost_model.exploring and any(full):  # re-measure: the likeliest full draft
        i = max((j for j in range(len(full)) if full[j]), key=lambda j: controller.
                expected_accepted(req_ids[j], len(full[j]), kinds[j]))
    else:
        return shown
    backoff = not any(shown)
    shown[i] = controller.trim([req_ids[i]], [full[i]], 0.0, [kinds[i]])[0]
    shown = _level(shown, limit - rows)
    if shown[i]:  # not cut to nothing by the limit
        cost_model.explored(rows + sum(map(len, shown)), backoff)
    return shown


def last_finisher_shares(remaining: Sequence[int], k: int,
                         tolerance: float = 0.1) -> list[float]:
    """Each request's share of finishing last, from the output tokens each may still
    emit: the requests within ``max(tolerance · most, k + 1)`` tokens of the most (a step
    can commit ``k + 1`` tokens) share it equally, the others get none.

    Args:
        remaining: output tokens each request may still emit (its ``max_tokens`` left),
            one per row, >= 0.
        k: most draft tokens per step.
        tolerance: the window's fraction of the largest budget: budgets set far beyond
            the lengths end-of-sequence gives (vLLM's default, up to the model length)
            differ by little relative to their size, so all share.

    Returns:
        One share per row in [0, 1], summing to 1 (empty for no rows).
    """
    if not remaining:
        return []
    most = max(remaining)
    last = [r >= most - max(tolerance * most, k + 1) for r in remaining]
    share = 1.0 / sum(last)
    return [share if x else 0.0 for x in last]


def _level(drafts: list[list[int]], budget: float) -> list[list[int]]:
    """``drafts`` cut to at most ``budget`` tokens in all (unlimited: ``inf``), each
    keeping its first tokens: the longest are cut first, down to one common length."""
    if sum(map(len, drafts)) <= budget:
        return drafts
    cap = max(map(len, drafts))
    while cap > 0 and sum(min(len(d), cap) for d in drafts) > budget:
        cap -= 1
    return [d[:cap] for d in drafts]


def _check(owner: str, checks: Sequence[tuple[str, Any, bool, str]]) -> None:
    """Raise ValueError naming ``owner``'s first argument whose check failed; ``checks``
    are ``(name, value, passed, allowed range in words)``."""
    for name, value, passed, allowed in checks:
        if not passed:
            raise ValueError(f"{owner} {name} must be {allowed}, got {value!r}")


class StepCostModel:
    """Measured step time of the target over the tokens ``n`` a decode step schedules:
    two piecewise-linear curves, ``P(n)`` for plain steps and ``V(n)`` for steps that
    verified drafts (the speculative path has its own fixed cost: spec-decode metadata,
    the rejection sampler).

    Steps are grouped by ``n`` into log-spaced buckets (``buckets_per_octave`` per doubling)
    and by kind. A group counts once it has ``min_samples`` steps, starting from their
    median time (a garbage-collection pause or another process's burst in one step must not
    price a batch size for good); after that each step, clamped to within a factor 2 of the
    group's mean, moves a running mean of its ``n`` and time (weight ``smoothing``, or
    ``plain_smoothing`` for plain steps, so the curve follows drift); ``min_samples`` steps
    in a row off the mean on one side, by more than 2x (a plain group's faster steps:
    :data:`LEVEL_SHIFT_RATIO`), restart the group from their median. Each curve goes through
    its groups' means, sorted by ``n`` and made non-decreasing by pooling neighbours that
    break the order (isotonic regression, weighted by samples; an older point that a newer
    one of more tokens outruns is left out instead, see :func:`_isotonic`). No shape is
    assumed: on a 2-core CPU (fp32 SmolLM2-135M) a batch-8 step was 40 ms flat from 1 to 9
    tokens, then rose ~2.9 ms per token; on a GPU a step stays nearly flat until the batch
    becomes compute-bound. A straight-line fit over all steps priced draft tokens at the
    slope of the batch's shrinking tail (1-32 tokens) instead of the token counts drafting
    runs at.

    Beyond a curve's largest token count it is extrapolated with ``explore`` x the slope
    of its top octave: optimism, so that a batch that never drafted at that size tries it
    and measures it. Below its smallest, ``V`` follows ``P`` plus the fixed cost measured
    there. Groups not observed for ``stale_steps`` steps are left out, so a region is
    measured again once the machine or the workload may have changed; one not observed for
    ``explore_every`` steps gives way to newer ones it is out of order with (see
    ``explore_every``).

    Args:
        margin: factor (>= 1) by which a draft's expected return must exceed its measured
            cost (:meth:`threshold`, :meth:`pays_off`); 1.0 = break-even. The estimates are
            noisy and a wrong "draft" costs verification at once, so the default in the
            engine is 1.5 (``adaptive_margin``).
        buckets_per_octave: resolution of the curves in ``n`` (>= 1).
        smoothing: weight of a new verified step in its group's running mean, in (0, 1].
        plain_smoothing: the same for plain steps, in (0, 1], applied to the median of
            the group's last 3 step times (a stalled step moves it not at all). Plain
            steps run at every step that does not draft, so their mean can follow the
            machine and the batch's context lengths within a few steps; verified ones
            come rarely where drafting does not pay (explorations). With 0.05 for both, the e2e
            benchmark's batch-32 ``P(32)`` still read 114 ms fifteen steps into a cell
            whose plain steps took 80-100 ms (the cell before: ~140 ms, longer
            contexts), while explorations timed ``V(40)`` at 101-110 ms: 8 draft tokens
            looked free, and ``suffix`` and ``memory_decoding`` drafted steps of 49-66
            tokens at 130-170 ms for a few accepted tokens (scratch log, 2026-12-03).
        min_samples: steps a group needs before it counts (>= 1).
        stale_steps: steps after which an unobserved group no longer counts (>= 1).
        explore: factor in (0, 1] on the extrapolated slope beyond the measured range.
        prior_slope_ratio: slope assumed, as a fraction of the step time per token, when
            a curve spans less than an octave (0.01: a memory-bound GPU step).
        explore_every: decode steps without a verified step after which one draft is
            verified anyway (:attr:`exploring`); also the age at which a group is stale:
            a verified group unobserved that long restarts from its next step when that
            is more than 2x faster, a plain one from the median of its next
            ``min_samples`` steps (see :meth:`observe`), and a group out of order with
            one observed that much later is left out of the curve.
        explore_backoff: each exploration (of a step that would verify nothing else)
            doubles the gap to the next, up to this many times ``explore_every`` (>= 1;
            1: a fixed gap), unless the step after it verifies drafts of its own; any
            such step resets the gap.
            Where drafting does not pay (a large batch on a CPU), each exploration costs
            a step that verifies one extra draft: at batch 32 in the e2e benchmark 8
            tokens on 32 made that step 3-80% slower, about 1% of all time at a gap of 32.
        explore_size_every: decode steps after which a size (a group's bucket) whose
            verified steps were neither measured nor explored gets one full draft in a
            step that verifies other drafts (:meth:`unmeasured`). 64: offline
            (``benchmarks/adaptive_replay.py``, mean ratio to ``vllm_ngram`` over its 20
            cells) 32 cost ``suffix`` 1.045 -> 1.039, 64 1.044, 128 1.046.
        pair_gap: a verified step and a plain step of the same number of decoding rows
            at most this many decode steps apart (>= 1) are *paired*: their relative
            difference is one direct measurement of what that many draft tokens cost
            (:meth:`paired_cost`).
        pair_window: the paired relative differences kept per row count and draft size
            (>= 1); their median is the estimate (5: one stalled step moves it not at
            all, and three new pairs, e.g. three explorations, replace it).
        verified_scale: the verified curve's level follows its steps as a whole. Each step
            of a verified group that counts implies a level: its time over the unscaled
            curve's at its tokens (its group's mean outside the curve's range); once at
            least ``verified_scale`` groups were observed within ``explore_every``
            decode steps, the median of their latest levels scales ``V``, and the verified
            groups keep times divided by the level they were measured at. Verified steps
            are few where drafting does not pay and spread over many sizes (one group
            each), so a group rarely sees the steps its own restart needs. In the e2e
            benchmark at batch 32 (four engines started together), ``V(40)`` read 336-398
            ms against 143-166 ms for explorations timed later at that size, while plain
            steps, timed every step, were right: drafting looked too dear. A ``P`` left
            high is then timed again (:meth:`plain_due` compares it with the scaled ``V``):
            in another engine warm-up steps timed ``P(32)`` at 188 ms and ``V(33..41)`` at
            290-350 ms, the cells ran verified 33-token steps at 132-141 ms and drafted at
            every step, so ``P`` was not timed again, and ``suffix`` showed drafts accepted
            at 0.35 (code generation 0.91x no speculation). 0: off (each group learns
            only from its own steps).

    Raises:
        ValueError: an argument outside its range (the message names it).
    """

    def __init__(self, margin: float = 1.0, buckets_per_octave: int = 4,
                 smoothing: float = 0.05, plain_smoothing: float = 0.2,
                 min_samples: int = 3, stale_steps: int = 1000,
                 explore: float = 0.5, prior_slope_ratio: float = 0.01,
                 explore_every: int = 32, explore_backoff: int = 8,
                 explore_size_every: int = 64, pair_gap: int = 4, pair_window: int = 5,
                 verified_scale: int = 3):
        _check("StepCostModel", tuple(
            (name, value, value >= 1, ">= 1") for name, value in (
                ("buckets_per_octave", buckets_per_octave), ("min_samples", min_samples),
                ("stale_steps", stale_steps), ("explore_every", explore_every),
                ("explore_backoff", explore_backoff),
                ("explore_size_every", explore_size_every), ("pair_gap", pair_gap),
                ("pair_window", pair_window))) + (
            ("verified_scale", verified_scale, verified_scale >= 0, ">= 0"),
            ("margin", margin, margin >= 1.0, ">= 1"),
            ("prior_slope_ratio", prior_slope_ratio, prior_slope_ratio >= 0.0, ">= 0"),
            ("smoothing", smoothing, 0.0 < smoothing <= 1.0, "in (0, 1]"),
            ("plain_smoothing", plain_smoothing, 0.0 < plain_smoothing <= 1.0, "in (0, 1]"),
            ("explore", explore, 0.0 < explore <= 1.0, "in (0, 1]")))
        self.margin = margin
        self.buckets_per_octave = buckets_per_octave
        self.smoothing = smoothing
        self.plain_smoothing = plain_smoothing
        self.min_samples = min_samples
        self.stale_steps = stale_steps
        self.explore = explore
        self.prior_slope_ratio = prior_slope_ratio
        self.explore_every = explore_every
        self.explore_backoff = explore_backoff
        self._explore_gap = explore_every  # decode steps from a verified step to exploring
        self._explored_at = -1  # decode steps observed when the last exploration began
        # an explored size that does not count yet: (bucket, explorations left for it)
        self._measuring: tuple[int, int] | None = None
        self.explore_size_every = explore_size_every
        self._since_verified = 0  # decode steps observed since the last verified one
        self._plain_probes = 0  # steps run plain by plain_due since _probes_began
        self._probes_began = 0  # decode steps observed when those probes began
        self._groups: dict[tuple[int, bool], _StepGroup] = {}  # (bucket, verified) -> group
        self._explored: dict[int, int] = {}  # bucket -> step of its last exploration
        self._steps = 0
        self._curves: dict[bool, tuple[list[float], list[float]]] | None = None  # cache
        self.verified_scale = verified_scale
        self._verified_level = 1.0  # the verified curve's scale (see verified_scale)
        # verified group -> (decode step, level implied by its last step)
        self._verified_votes: dict[tuple[int, bool], tuple[int, float]] = {}
        self.pair_gap = pair_gap
        self.pair_window = pair_window
        # (rows, verified) -> [decode step, seconds, draft tokens, paired yet] of the last step
        self._last_of: dict[tuple[int, bool], list] = {}
        # rows -> draft bucket -> [last paired step, mean draft tokens, recent relative
        # differences t_verified / t_plain - 1]
        self._pairs: dict[int, dict[int, list]] = {}

    def observe(self, tokens: int, seconds: float, speculative: bool = False,
                rows: int | None = None) -> None:
        """Add one decode step: ``tokens`` (>= 1) scheduled tokens took ``seconds``;
        ``speculative``: the step verified draft tokens; ``rows``: the requests it decoded
        (None: unknown, the step is not paired, see ``pair_gap``). Steps of 0 tokens are
        ignored.

        Plain Python floats, not numpy: in a CPU worker a numpy call per step here took
        ~0.1 ms next to the model's threads, ~0.5% of a step."""
        if tokens < 1:
            return
        self._steps += 1
        self._since_verified = 0 if speculative else self._since_verified + 1
        if speculative and self._steps != self._explored_at + 1:  # drafts of its own
            self._explore_gap, self._measuring = self.explore_every, None
        key = (self._bucket(tokens), bool(speculative))
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = _StepGroup()
        elif group.count and self._steps - group.last > self.stale_steps:
            group.remeasure()  # left out of the curves since: measured again, not averaged
        raw = float(seconds)
        if speculative:  # the verified curve's level follows its steps (verified_scale)
            if group.ready and group.t > 0.0:
                self._verified_votes[key] = (self._steps, raw / self._unscaled(tokens, group))
                self._follow_verified_level()
            else:
                self._verified_votes.pop(key, None)
            seconds = raw / self._verified_level
        group.add(float(tokens), float(seconds), self._steps, self.min_samples,
                  self.smoothing if speculative else self.plain_smoothing,
                  self.explore_every, 1 if speculative else 3, resume=not speculative,
                  shift=2.0 if speculative else LEVEL_SHIFT_RATIO)
        self._curves = None
        if rows is not None and 0 < rows and (rows < tokens or not speculative):
            self._pair(rows, tokens - rows, raw, bool(speculative))

    def _unscaled(self, tokens: int, group: _StepGroup) -> float:
        """The verified curve at ``tokens`` before :attr:`_verified_level` scales it (its
        group's mean outside the curve's measured range)."""
        ns, ts = self._knots(True)
        if ns and ns[0] <= tokens <= ns[-1]:
            return self._on_curve((ns, ts), tokens) / self._verified_level
        return group.t

    def _follow_verified_level(self) -> None:
        """Set the verified curve's level to the median of the latest level each verified
        group's steps imply (a step's time over the unscaled curve's at its tokens), over
        the groups observed within ``explore_every`` decode steps, once at least
        ``verified_scale`` of them were (see ``verified_scale``)."""
        votes = [v for step, v in self._verified_votes.values()
                 if self._steps - step < self.explore_every]
        if self.verified_scale and len(votes) >= self.verified_scale:
            self._verified_level = sorted(votes)[len(votes) // 2]
            self._curves = None

    def _pair(self, rows: int, drafts: int, seconds: float, speculative: bool) -> None:
        """Pair this step with the last step of the other kind and the same ``rows``, when
        that one is at most ``pair_gap`` steps back and (a verified one) not paired yet."""
        this = [self._steps, seconds, drafts, False]
        other = self._last_of.get((rows, not speculative))
        verified, plain = (this, other) if speculative else (other, this)
        if (other is not None and self._steps - other[0] <= self.pair_gap and not verified[3]
                and plain[1] > 0.0):
            verified[3] = True
            entry = self._pairs.setdefault(rows, {}).setdefault(
                self._bucket(verified[2]), [0, 0.0, []])
            entry[0] = self._steps
            entry[2] = (entry[2] + [verified[1] / plain[1] - 1.0])[-self.pair_window:]
            entry[1] += (verified[2] - entry[1]) / len(entry[2])
        self._last_of[(rows, speculative)] = this

    def paired_cost(self, rows: int, draft_tokens: int) -> float:
        """Seconds that ``draft_tokens`` draft tokens add to a step of ``rows`` decoding
        requests, as paired steps measured it (see ``pair_gap``): ``P(rows)`` times the
        largest median relative difference ``t_verified / t_plain - 1`` among the draft
        sizes up to ``draft_tokens`` tokens with ``min_samples`` pairs observed within
        ``stale_steps`` (verifying more tokens costs no less); 0 without one.

        The curves' difference ``V(rows + D) - P(rows)`` is small against each curve's
        noise and drift when ``D`` is small: in the e2e benchmark at batch 8
        (time-sliced, ``ngram`` on code generation) it read 2.3 ms for one draft token
        that cost 6 ms (59 ms plain steps), and drafts accepted at 0.41 were shown. The
        difference is kept relative to the plain step so that a machine slowed for a
        while (engines starting together) does not inflate it: kept in seconds, pairs
        timed 10x slower during ``adaptive_replay.py``'s warm-up
        (``--startup-slowdown 10``) held ``memory_decoding`` on code editing at tau
        1.07-2.03 instead of 2.30-2.75 for the rest of the run."""
        best = 0.0
        for last, mean_drafts, diffs in self._pairs.get(rows, {}).values():
            if (mean_drafts <= draft_tokens + 0.5
                    and len(diffs) >= self.min_samples
                    and self._steps - last < self.stale_steps):
                best = max(best, sorted(diffs)[len(diffs) // 2])
        return best * self.step_time(rows) if best > 0.0 else 0.0

    @property
    def exploring(self) -> bool:
        """Whether a step should verify drafts although the curves say it does not pay:
        fitted, and no verified step among the last ``explore_every`` decode steps
        (more after explorations that changed nothing, see ``explore_backoff``); or, for
        at most ``min_samples - 1`` steps after an exploration, while the size it explored
        has fewer than ``min_samples`` timed steps (until then its time does not count:
        in the e2e benchmark at batch 8, one exploration every 32 steps left 16-token
        steps, timed at 75-90 ms, unmeasured, while a 9-token group timed at 1.2 s during
        start-up priced drafting out). The
        curves only learn from steps that run, so without it a few slow verified steps
        (one-time costs, another process's burst) would stop drafting for good: offline
        (``benchmarks/adaptive_replay.py``'s sequence with its first 10 verified steps
        timed 10x slower, scratch), every workload then ran at tau 1.00. Counted again
        from an exploration (see :meth:`explored`), so a step that is not timed (a
        prefill chunk in the batch) does not make every following step explore."""
        return (self._measuring_due() or self._since_verified >= self._explore_gap
                ) and self.fitted

    def _measuring_due(self) -> bool:
        """Whether the last exploration's size still lacks ``min_samples`` timed steps and
        may be explored again."""
        if self._measuring is None:
            return False
        key, left = self._measuring
        group = self._groups.get((key, True))
        return left > 0 and not (group is not None and group.ready)

    def plain_due(self, rows: int) -> bool:
        """Whether a step of ``rows`` decoding requests that would verify drafts should run
        plain instead, so that the plain price ``P(rows)`` its drafts are judged by is
        timed (:meth:`probed_plain` then records it). Once verified steps are measured, a
        step runs plain when

        * no plain group within a factor 2 of ``rows`` counts (``P`` there is borrowed
          from ``V`` or extrapolated from other batch sizes), or the nearest one is still
          being measured (its first ``min_samples`` steps), or
        * the nearest plain group is more than :data:`PLAIN_STALE_RATIO` times slower than
          a verified group of at least as many tokens whose time was set after its own (a
          plain step is no slower than a verified one with more tokens: the plain group
          was timed under interference). :meth:`probed_plain` measures it anew from its
          next ``min_samples`` steps, so each such finding costs that many plain steps.

        At most ``2 * min_samples`` steps run plain for it within ``explore_every``
        decode steps (a batch whose rows shrink step by step, as its requests finish,
        would otherwise probe each size; a probe with a prefill chunk in the batch is not
        timed).

        A plain group is only timed when a step runs plain, and a batch that drafts at
        every step runs none. In the e2e benchmark's batch-32 engines (started together,
        so their start-up steps shared the cores) ``P`` held its start-up price, 1-4 s for
        one token, while verified steps were timed again at 0.1-0.6 s: drafting looked
        free, and ``memory_decoding`` showed every draft and ran code generation at 0.63x
        no speculation (acceptance 0.10). Without any ``P`` the model borrowed it from
        ``V``, which also priced drafting at zero (``lookahead``, which always guesses,
        showed every guess offline)."""
        if not self._knots(True)[0]:
            return False
        if (self._plain_probes >= 2 * self.min_samples
                and self._steps - self._probes_began < self.explore_every):
            return False
        return self._plain_to_time(rows)[0]

    def _plain_to_time(self, rows: int) -> tuple[bool, _StepGroup | None]:
        """``(due, stale)`` for :meth:`plain_due`: due when no plain group counts near
        ``rows`` or the nearest is being measured (``stale`` None), or when the nearest is
        stale (``stale`` that group)."""
        near, verified = [], []
        for (_, speculative), g in self._groups.items():
            if self._steps - g.last >= self.stale_steps:
                continue
            if speculative:
                if g.ready:
                    verified.append(g)
            elif rows <= 2 * g.n and g.n <= 2 * rows and (g.ready or g.first):
                near.append(g)
        if not near:
            return True, None
        p = min(near, key=lambda g: abs(math.log(g.n / rows)))
        if not p.ready:
            return True, None
        level = self._verified_level
        if any(v.n >= p.n and v.started > p.started and p.t > PLAIN_STALE_RATIO * level * v.t
               for v in verified):
            return True, p
        return False, None

    def probed_plain(self, rows: int) -> None:
        """A step of ``rows`` decoding requests is about to run plain because of
        :meth:`plain_due`; a stale plain group is measured anew from here."""
        if self._steps - self._probes_began >= self.explore_every:  # a new window
            self._plain_probes = 0
        if self._plain_probes == 0:
            self._probes_began = self._steps
        self._plain_probes += 1
        stale = self._plain_to_time(rows)[1]
        if stale is not None:
            stale.remeasure()
            self._curves = None

    def unmeasured(self, tokens: int) -> bool:
        """Whether verified steps of about ``tokens`` tokens (their group) were neither
        measured nor explored among the last ``explore_size_every`` decode steps (and the
        model is fitted). Drafts that keep verifying at other sizes do not re-measure this
        one: in the e2e benchmark's batch-1 engines, whose first steps ran at 0.3-0.5 s
        while the other engines started, one- and two-token drafts kept verifying while
        the full drafts' size stayed priced at its start-up time, and ``suffix`` ran
        summarization at tau 2.04 against 3.02 without adaptation."""
        if not self.fitted:
            return False
        key = self._bucket(tokens)
        group = self._groups.get((key, True))
        last = max(group.last if group is not None else 0, self._explored.get(key, 0))
        return self._steps - last >= self.explore_size_every

    def explored(self, tokens: int, backoff: bool = False) -> None:
        """A step of ``tokens`` tokens is about to verify drafts because of
        :attr:`exploring` or :meth:`unmeasured`; ``backoff``: it verifies nothing else
        (an :attr:`exploring` step). Unless the step right after it verifies drafts of
        its own, the next exploration then comes after twice the gap
        (``explore_backoff``), and while the size explored lacks ``min_samples`` timed
        steps the next steps explore too (at most ``min_samples - 1`` of them)."""
        self._since_verified = 0
        key = self._bucket(tokens)
        self._explored[key] = self._steps
        if not backoff:
            return
        self._explored_at = self._steps
        if self._measuring_due():  # the same series: one exploration fewer left
            self._measuring = (key, self._measuring[1] - 1)
            return
        self._explore_gap = min(2 * self._explore_gap, self.explore_backoff * self.explore_every)
        self._measuring = (key, self.min_samples - 1)

    def token_limit(self) -> float:
        """The most tokens a step may schedule: twice the most of any step group that
        counts (``inf`` before any does). Beyond its measured range a curve is
        extrapolated optimistically, so that larger steps get tried; this bounds how far.
        In the e2e benchmark at batch 8 (CPU), with 16-token verified steps measured at
        ~100 ms and nothing larger, the extrapolation read ~102 ms for 51 and 61 tokens,
        which took 230 ms (the curve is flat to ~36 tokens there, then rises ~4 ms per
        token); at batch 32, with 9-token steps measured, 170-252-token steps ran at
        0.48-0.78 s."""
        sizes = [g.n for g in self._groups.values()
                 if g.ready and self._steps - g.last < self.stale_steps]
        return 2.0 * max(sizes) if sizes else math.inf

    def _bucket(self, tokens: float) -> int:
        return int(self.buckets_per_octave * math.log2(tokens))

    @property
    def fitted(self) -> bool:
        """Whether a curve has a knot: some group of steps counts (``min_samples``
        steps, observed within ``stale_steps``)."""
        return bool(self._knots(False)[0] or self._knots(True)[0])

    def _knots(self, speculative: bool) -> tuple[list[float], list[float]]:
        """Knots ``(tokens, seconds)`` of ``V`` (``speculative``) or ``P``: tokens
        ascending, seconds non-decreasing."""
        if self._curves is None:
            self._curves = {}
            for kind in (False, True):
                weight = 1.0 / (self.smoothing if kind else self.plain_smoothing)
                points = sorted((g.n, g.t, min(g.count, weight), g.last)
                                for (_, verified), g in self._groups.items()
                                if verified == kind and g.ready
                                and self._steps - g.last < self.stale_steps)
                xs, ys = _isotonic(points, self.explore_every,
                                   *((2.0, 0) if kind else (LEVEL_SHIFT_RATIO, self.pair_gap)))
                level = self._verified_level if kind else 1.0
                self._curves[kind] = (xs, [level * y for y in ys])
        return self._curves[speculative]

    def _on_curve(self, knots: tuple[list[float], list[float]], tokens: float) -> float:
        ns, ts = knots
        if tokens <= ns[0]:
            return ts[0]
        if tokens >= ns[-1]:
            i = bisect.bisect_right(ns, ns[-1] / 2) - 1  # the top octave's slope
            slope = (self.prior_slope_ratio * ts[-1] if i < 0
                     else (ts[-1] - ts[i]) / (ns[-1] - ns[i]))
            return ts[-1] + self.explore * slope * (tokens - ns[-1])
        i = bisect.bisect_right(ns, tokens)
        n0, n1, t0, t1 = ns[i - 1], ns[i], ts[i - 1], ts[i]
        return t0 + (t1 - t0) * (tokens - n0) / (n1 - n0)

    def step_time(self, tokens: float, speculative: bool = False) -> float:
        """Seconds of a decode step of ``tokens`` tokens: ``V(tokens)`` if it verifies
        drafts (``speculative``), else ``P(tokens)``, capped by ``V`` at ``tokens`` or, below
        ``V``'s first knot, at that knot (a plain step is no slower than a verified one of at
        least as many tokens; a plain step is only re-measured when the batch does not
        draft, so a slow early measurement of it would otherwise make drafting look cheap
        for good). Without the cap below the first knot, ``P(32)`` held the 270 ms of the
        warm-up batch's 32-row steps (longer contexts) into an e2e batch-32 open-chat cell
        whose plain steps took 140-170 ms, while its verified steps of 40-91 tokens took
        153-315 ms: the threshold read 0.37-0.43 instead of ~0.9, and ``suffix`` verified
        drafts in 40 of 61 steps at 16-32 rows, accepted at 0.40-0.52 (0.92-0.96x no
        speculation).
        A curve with no measurement in reach borrows the other (``V`` = ``P`` before any
        verified step); 0 before any step."""
        plain, verified = self._knots(False), self._knots(True)
        if not plain[0] and not verified[0]:
            return 0.0
        if not verified[0]:
            return self._on_curve(plain, tokens)
        if not speculative:  # a plain step costs no more than a verified one as large
            if not plain[0]:
                return self._on_curve(verified, tokens)
            t = self._on_curve(plain, tokens)
            measured = tokens <= verified[0][-1]  # V not extrapolated (below: its first knot)
            return min(t, self._on_curve(verified, tokens)) if measured else t
        if tokens >= verified[0][0] or not plain[0]:
            return self._on_curve(verified, tokens)
        n0, t0 = verified[0][0], verified[1][0]  # below V's first knot: P + fixed cost
        fixed = max(0.0, t0 - self._on_curve(plain, n0))
        return min(t0, self._on_curve(plain, tokens) + fixed)

    def draft_cost(self, rows: int, draft_tokens: int) -> float:
        """Seconds that ``draft_tokens`` draft tokens add to a step of ``rows`` decoding
        requests: ``V(rows + D) - P(rows)`` (>= 0), the fixed cost of verifying included,
        or :meth:`paired_cost` where paired steps measured more."""
        return max(0.0, self.step_time(rows + draft_tokens, True) - self.step_time(rows),
                   self.paired_cost(rows, draft_tokens))

    def threshold(self, rows: int, draft_tokens: int) -> float:
        """Emission probability a draft token must beat when ``rows`` requests decode and
        the proposer offers ``draft_tokens`` draft tokens in all.

        Returns ``margin · rows · price / P(rows)`` (a token emitted with probability
        ``p`` adds ``p`` tokens for ``price`` seconds; the step yields ``rows / P(rows)``
        tokens per second without it). ``price`` is the mean time per token over the
        verified steps those drafts would make, ``(V(rows + D) - V(rows + 1)) / (D - 1)``:
        the fixed cost of verifying at all is not charged to every token but left to
        :meth:`pays_off` (with ``D = 1`` the price is :meth:`draft_cost`). 0 (draft
        everything) before the first measurement or without drafts.
        """
        base = self.step_time(rows)
        if rows <= 0 or draft_tokens <= 0 or base <= 0.0:
            return 0.0
        return self.margin * rows * self._price(rows, draft_tokens) / base

    def _price(self, rows: int, draft_tokens: int) -> float:
        """Seconds per draft token of ``draft_tokens`` (>= 1) on ``rows`` rows (see
        :meth:`threshold`)."""
        if draft_tokens == 1:
            return self.draft_cost(rows, 1)
        return max(0.0, self.step_time(rows + draft_tokens, True)
                   - self.step_time(rows + 1, True)) / (draft_tokens - 1)

    def token_weights(self, rows: int, draft_tokens: int,
                      shares: Sequence[float]) -> list[float]:
        """What an accepted token of each row saves while the engine drains a finite set
        of requests (nothing waits), relative to ``P(rows) / rows`` (the value
        :meth:`threshold` and :meth:`pays_off` assume).

        The set's time is ``sum over steps of P(rows_t)``; with ``P(n) = a + b·n`` a
        request that finishes one step sooner removes one row from a later step (``b``),
        and the whole fixed cost ``a`` of a step only if it is the last to finish. So a
        row whose request finishes last with probability ``q`` saves ``b + a·q`` per
        accepted token: ``P(rows) / rows`` when every ``q`` is ``1 / rows`` (the value
        with a refilling queue), ``b`` for a request that surely finishes before
        another. ``b`` is the measured price of one more token in a verified step (what
        :meth:`threshold` charges a draft token), at most ``P(rows) / rows``; ``a = P(rows)
        - rows · b``.

        Args:
            rows: requests decoding this step.
            draft_tokens: draft tokens offered (sets the price, as in :meth:`threshold`).
            shares: ``q`` of each row (:func:`last_finisher_shares`).

        Returns:
            One weight >= 0 per row; all 1.0 before any measurement or without drafts.
        """
        base = self.step_time(rows)
        if rows <= 0 or draft_tokens <= 0 or base <= 0.0:
            return [1.0] * len(shares)
        b = min(self._price(rows, draft_tokens), base / rows)
        a = base - rows * b
        return [(b + a * q) * rows / base for q in shares]

    def pays_off(self, rows: int, expected_accepted: float, draft_tokens: int) -> bool:
        """Whether drafting this step raises throughput by the margin: ``(rows + E) /
        V(rows + D) > rows / P(rows)``, i.e. ``E · P(rows) > rows · (V(rows + D) -
        P(rows))``, with the right-hand side times ``margin``.

        Args:
            rows: requests decoding this step.
            expected_accepted: ``E``, expected accepted draft tokens over the batch.
            draft_tokens: ``D``, draft tokens that would be verified.

        Returns:
            The comparison; True before any measurement (the first steps measure what
            drafting costs), False without draft tokens.
        """
        if draft_tokens <= 0:
            return False
        if not self.fitted:
            return True
        return (expected_accepted * self.step_time(rows)
                > self.margin * rows * self.draft_cost(rows, draft_tokens))


class _StepGroup:
    """Steps of one token-count bucket and kind: running means of tokens and seconds."""

    __slots__ = ("n", "t", "count", "last", "started", "first", "outliers", "recent",
                 "resume")

    def __init__(self):
        self.n = self.t = 0.0
        self.count = self.last = 0
        self.started = 0  # the step whose median set ``t`` last (first ready, restarts)
        self.first: list[tuple[float, float]] = []  # the first steps, until ready
        # the latest steps in a row outside [t/shift, 2t] (see add), all on one side
        self.outliers: list[tuple[float, float]] = []
        self.recent: list[float] = []  # the last steps' (clamped) times, for median_of
        # a plain group's steps since it came back from a stale gap (None: not collecting)
        self.resume: list[tuple[float, float]] | None = None

    @property
    def ready(self) -> bool:
        return not self.first and self.count > 0

    def remeasure(self) -> None:
        """Start again from the median of the next ``min_samples`` steps (the group does
        not count until then)."""
        self.count, self.first, self.outliers, self.recent = 0, [], [], []
        self.resume = None

    def add(self, tokens: float, seconds: float, step: int, min_samples: int,
            smoothing: float, stale_gap: int | None, median_of: int = 1,
            resume: bool = False, shift: float = 2.0) -> None:
        """Add one step; ``stale_gap``: steps after which the group's mean is stale (None:
        never). A stale group restarts from the median of its next ``min_samples`` steps,
        following its running mean meanwhile, when ``resume`` (plain groups: their steps
        come often); otherwise from a step more than 2x faster at once (verified groups
        are measured rarely; interference only slows steps, so a slow one needs
        ``min_samples`` in a row). ``shift`` (in (1, 2]): ``min_samples`` steps in a row
        more than this factor faster than the group's time, or all more than 2x slower,
        restart it from their median (the time has moved; interference only slows
        steps, so a slow run needs 2x). ``median_of``: the running mean takes the median of
        the last that many steps' times (3: one stalled step moves it not at all, a new
        level from its second step)."""
        stale = stale_gap is not None and step - self.last > stale_gap
        if stale and resume and self.ready:
            self.resume, stale = [], False
        self.count += 1
        self.last = step
        if self.count <= min_samples:  # start from the median of the first steps
            self.first.append((seconds, tokens))
            if self.count == min_samples:
                self._start_from(self.first, step)
                self.first = []
            return
        if self.resume is not None:
            self.resume.append((seconds, tokens))
            if len(self.resume) == min_samples:
                self._restart_from(self.resume, step, min_samples)
                return
        if self.t / shift <= seconds <= 2.0 * self.t:
            self.outliers = []
        elif stale and seconds < self.t:  # a faster step after a while: trust it
            self._restart_from([(seconds, tokens)], step, min_samples)
            return
        else:  # min_samples outliers in a row on one side: the time has moved, restart
            # (a time that keeps jumping between two levels is followed level by level)
            if self.outliers and (self.outliers[-1][0] > self.t) != (seconds > self.t):
                self.outliers = []
            self.outliers.append((seconds, tokens))
            if len(self.outliers) >= min_samples:
                self._restart_from(self.outliers, step, min_samples)
                return
        seconds = min(max(seconds, 0.5 * self.t), 2.0 * self.t)
        if median_of > 1:  # from a (re)start the window begins with the group's time
            self.recent = (self.recent or [self.t] * (median_of - 1))[1 - median_of:]
            self.recent.append(seconds)
            seconds = sorted(self.recent)[median_of // 2]
        w = max(1.0 / self.count, smoothing)
        self.n += w * (tokens - self.n)
        self.t += w * (seconds - self.t)

    def _restart_from(self, steps: list[tuple[float, float]], step: int,
                      min_samples: int) -> None:
        """:meth:`_start_from` ``steps`` for a group that counted already: it counts at
        once, and the steps kept towards any other restart are dropped."""
        self._start_from(steps, step)
        self.count, self.outliers, self.recent, self.resume = min_samples, [], [], None

    def _start_from(self, steps: list[tuple[float, float]], step: int) -> None:
        """Set the group to the median time and the mean tokens of ``(seconds, tokens)``
        steps (sorted in place), at decode step ``step``."""
        self.started = step
        steps.sort()
        self.t = steps[len(steps) // 2][0]
        self.n = sum(n for _, n in steps) / len(steps)


def _isotonic(points: list[tuple[float, float, float, int]], stale_gap: int,
              shift: float = 2.0, close: int = 0) -> tuple[list[float], list[float]]:
    """Non-decreasing fit of ``(x, y, weight, last observed step)`` points sorted by x
    (pool adjacent violators): returns the pooled blocks' weighted mean ``(xs, ys)``.

    A point slower than one of more tokens observed more than ``stale_gap`` steps after it
    is left out first instead of pooled, and so is one more than ``shift`` times slower
    than one of more tokens observed more than ``close`` steps after it (the plain curve:
    :data:`LEVEL_SHIFT_RATIO` and ``pair_gap`` steps; the verified one, whose steps are
    few and noisy: 2x and any later step): a size measured slow during an engine's first
    steps (other engines starting on a 2-core CPU: 0.4-0.5 s verified steps, later 0.14 s;
    one-token plain steps at 1-4 s, then 32-token ones at 0.15 s) or in a batch with
    longer contexts, and not run at since, must not hold the curve above what newer steps
    measured. Pooled instead, the e2e benchmark's batch-32 ``P(32)`` read 137-168 ms for
    the first 30 steps of a cell whose plain steps took 97-119 ms: its 32-row steps were
    pooled with the warm-up batch's last 27-31-row steps (~166 ms, longer contexts;
    decision log replayed, 2026-12-07), and drafts were priced up to 30% too cheap. The
    older point of an out-of-order pair is dropped only when it is the slower one
    (interference only slows steps): a newer slow point at fewer tokens is pooled, and so
    are points within ``shift`` of each other or observed within ``close`` steps of each
    other (noise between neighbouring sizes, e.g. a batch whose rows alternate between
    two sizes: dropped, each would drop the other in turn).

    Likewise a point whose time per token is more than 2x that of one of fewer tokens
    observed later: a step's time per token does not grow with its tokens (a fixed cost
    spread over more of them), so the larger point was slowed. Without this, verified
    steps of every request's full draft timed during start-up (e.g. 72 tokens at batch 8)
    kept that size's start-up price for ``stale_steps`` steps, since no later step
    reached that many tokens."""
    kept = [p for p in points if not any(q[3] > p[3] and (
        q[1] * (1 if q[3] - p[3] > stale_gap else shift if q[3] - p[3] > close else 2) < p[1]
        if q[0] > p[0] else 2 * q[1] * p[0] < p[1] * q[0]) for q in points)]
    blocks: list[list[float]] = []  # [sum w·x, sum w·y, sum w]
    for x, y, w, _ in kept:
        blocks.append([w * x, w * y, w])
        while len(blocks) > 1 and blocks[-2][1] * blocks[-1][2] > blocks[-1][1] * blocks[-2][2]:
            last = blocks.pop()
            for i in range(3):
                blocks[-1][i] += last[i]
    return [b[0] / b[2] for b in blocks], [b[1] / b[2] for b in blocks]
