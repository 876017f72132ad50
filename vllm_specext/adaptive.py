"""Adaptive speculation: how many draft tokens each request gets, step by step.

Two measured quantities decide it:

* **Acceptance per request** (:class:`DraftLengthController`): a decayed estimate of
  alpha, the probability that the next draft token is accepted given that the ones
  before it were (the geometric model of Leviathan et al. 2023, §3.5). Drafted positions
  count as verified; when a request gets no draft, the full draft the proposer *would*
  have made is still compared with the tokens that are then committed ("shadow"
  drafts), so a request whose acceptance returns recovers.
* **Cost per draft token** (:class:`StepCostModel`): an online, exponentially
  forgetting least-squares fit of the target's step time ``T(n) = a + b·n`` over the
  number of tokens ``n`` scheduled in the step, measured in the running engine (CPU,
  GPU or NPU alike).

A draft token at depth ``j`` pays off when its chance of being emitted, ``alpha**j``,
beats its marginal cost relative to the tokens the step already produces:
``alpha**j > b · rows / T(rows)`` (throughput ``(rows + accepted) / T(rows + drafts)``
grows iff that holds). So each request drafts ``L = max{j <= k : alpha**j > threshold}``
tokens — zero when speculation does not pay.
"""
from __future__ import annotations

import math
from collections.abc import Sequence


class DraftLengthController:
    """Per-request draft length from decayed acceptance statistics.

    Args:
        k: most draft tokens per step (>= 1).
        decay: weight of history per observation, in (0, 1); 0.8 forgets within ~5 steps.
        prior_alpha: acceptance assumed for a new request, in (0, 1).
        prior_weight: pseudo-observations behind the prior (> 0); they decay like
            real observations, so the history soon dominates.
    """

    def __init__(self, k: int, decay: float = 0.8, prior_alpha: float = 0.5,
                 prior_weight: float = 2.0):
        self.k = k
        self.decay = decay
        self.prior_alpha = prior_alpha
        self.prior_weight = prior_weight
        self._hits: dict[str, float] = {}
        self._trials: dict[str, float] = {}
        self._full_draft: dict[str, list[int]] = {}
        self._shown: dict[str, int] = {}

    def alpha(self, req_id: str) -> float:
        """Estimated per-token acceptance probability of ``req_id``, in [0, 1]."""
        if req_id not in self._trials:
            return self.prior_alpha
        return self._hits[req_id] / self._trials[req_id]

    def length(self, req_id: str, threshold: float) -> int:
        """Draft length for ``req_id``: the largest ``j <= k`` with ``alpha**j > threshold``."""
        a = self.alpha(req_id)
        if threshold <= 0.0 or a >= 1.0:  # every draft so far accepted: alpha may reach 1
            return self.k
        if threshold >= 1.0 or a <= threshold:
            return 0
        return min(self.k, int(math.log(threshold) / math.log(a)))

    def trim(self, req_ids: Sequence[str], drafts: list[list[int]],
             threshold: float) -> list[list[int]]:
        """Cut each full draft to its request's length; remember the full draft.

        Args:
            req_ids: request ids, one per draft.
            drafts: the proposer's drafts (0..k tokens each).
            threshold: the per-token emission probability a draft token must beat
                (see :meth:`StepCostModel.threshold`).

        Returns:
            The trimmed drafts (prefixes of ``drafts``).
        """
        out = []
        for rid, draft in zip(req_ids, drafts):
            n = self.length(rid, threshold) if draft else 0
            self._full_draft[rid] = draft
            self._shown[rid] = n
            out.append(draft[:n])
        return out

    def observe(self, req_id: str, committed: Sequence[int]) -> None:
        """Score the last draft of ``req_id`` against the tokens committed after it.

        Shown draft positions count by what the verifier accepted
        (``len(committed) - 1`` of them); positions beyond, up to the committed tokens,
        are scored by comparing the unshown (shadow) draft with what was committed.
        """
        draft = self._full_draft.pop(req_id, None)
        if not draft or not committed:
            return
        shown = self._shown.pop(req_id, 0)
        accepted = len(committed) - 1
        hits = min(accepted, shown)
        trials = hits + (1 if hits < shown else 0)
        if hits == shown:  # every shown token accepted: shadow positions follow
            for j in range(shown, min(len(draft), len(committed))):
                trials += 1
                if draft[j] != committed[j]:
                    break
                hits += 1
        if trials == 0:
            return
        d = self.decay ** trials  # the prior decays like any old observation
        self._hits[req_id] = self._hits.get(
            req_id, self.prior_alpha * self.prior_weight) * d + hits
        self._trials[req_id] = self._trials.get(req_id, self.prior_weight) * d + trials

    def forget(self, req_id: str) -> None:
        """Drop the statistics of a finished request."""
        for table in (self._hits, self._trials, self._full_draft, self._shown):
            table.pop(req_id, None)


class StepCostModel:
    """Online fit of the target's step time ``T(n) = a + b·n`` (n = scheduled tokens).

    Exponentially weighted least squares with a ridge prior that pulls the slope
    towards ``prior_slope_ratio`` x the mean step time until the observed token counts
    vary enough to measure it.

    Args:
        decay: weight kept per observation, in (0, 1).
        prior_slope_ratio: prior b/a (0.01: one extra token costs 1% of a step, what a
            memory-bound GPU step looks like).
        prior_weight: strength of the prior, in squared tokens.
    """

    def __init__(self, decay: float = 0.99, prior_slope_ratio: float = 0.01,
                 prior_weight: float = 4.0):
        self.decay = decay
        self.prior_slope_ratio = prior_slope_ratio
        self.prior_weight = prior_weight
        self._w = self._x = self._y = self._xx = self._xy = 0.0

    def observe(self, tokens: int, seconds: float) -> None:
        """Add one step: ``tokens`` scheduled tokens took ``seconds``."""
        d = self.decay
        self._w = self._w * d + 1.0
        self._x = self._x * d + tokens
        self._y = self._y * d + seconds
        self._xx = self._xx * d + tokens * tokens
        self._xy = self._xy * d + tokens * seconds

    @property
    def fitted(self) -> bool:
        return self._w > 0

    def coefficients(self) -> tuple[float, float]:
        """``(a, b)`` in seconds and seconds per token; ``(0, 0)`` before any step."""
        if not self._w:
            return 0.0, 0.0
        mx, my = self._x / self._w, self._y / self._w
        var = self._xx / self._w - mx * mx
        cov = self._xy / self._w - mx * my
        lam = self.prior_weight / self._w
        prior_b = self.prior_slope_ratio * my  # ridge towards b = ratio x mean step time
        b = max(0.0, (cov + lam * prior_b) / (var + lam))
        a = max(my - b * mx, 1e-9)
        return a, b

    def threshold(self, rows: int) -> float:
        """Emission probability a draft token must beat when ``rows`` requests decode.

        Returns ``b · rows / T(rows)``; 0 (draft everything) before the first step.
        """
        a, b = self.coefficients()
        if rows <= 0 or not self.fitted:
            return 0.0
        return b * rows / (a + b * rows)
