"""Adaptive speculation: how many draft tokens each request gets, step by step.

Two measured quantities decide it:

* **Acceptance per request** (:class:`DraftLengthController`): a decayed estimate of
  alpha, the probability that the next draft token is accepted given that the ones
  before it were (the geometric model of Leviathan et al. 2023, §3.5). Drafted positions
  count as verified; when a request gets no draft, the full draft the proposer *would*
  have made is still compared with the tokens that are then committed ("shadow"
  drafts), so a request whose acceptance returns recovers.
* **Cost of drafting** (:class:`StepCostModel`): an online, exponentially forgetting
  least-squares fit of the target's step time ``T = a + b·n + c·s`` over the number of
  tokens ``n`` scheduled in the step and whether it verified drafts at all (``s``; a
  step without drafts takes vLLM's plain sampling path), measured in the running engine
  (CPU, GPU or NPU alike).

A draft token at depth ``j`` pays off when its chance of being emitted, ``alpha**j``,
beats its marginal cost relative to the tokens the step already produces:
``alpha**j > b · rows / T(rows)`` (throughput ``(rows + accepted) / T(rows + drafts)``
grows iff that holds). So each request drafts ``L = max{j <= k : alpha**j > threshold}``
tokens — zero when speculation does not pay. Then the batch as a whole drafts only if
the expected accepted tokens also pay for ``c``
(:meth:`StepCostModel.pays_off`); otherwise the step runs plain.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


class DraftLengthController:
    """Per-request draft length from decayed acceptance statistics.

    A request's alpha is its own decayed hit rate shrunk towards the acceptance of all
    requests (empirical Bayes): ``(hits + w·alpha_all) / (trials + w)``. The few recent
    observations of one request are noisy, and drafting only where that noisy estimate is
    high overrates the drafts that get shown (measured on the e2e benchmark at batch 8:
    predicted accepted tokens 1.06 per shown draft, realized 0.74, without shrinkage).

    Args:
        k: most draft tokens per step (>= 1).
        decay: weight of a request's history per observation, in (0, 1); 0.8 forgets
            within ~5 steps.
        prior_alpha: acceptance assumed before any observation, in (0, 1).
        prior_weight: ``w``, pseudo-observations of the all-request acceptance behind
            each request's estimate (> 0).
        global_decay: weight of the all-request history per observation, in (0, 1).
    """

    def __init__(self, k: int, decay: float = 0.8, prior_alpha: float = 0.5,
                 prior_weight: float = 4.0, global_decay: float = 0.995):
        self.k = k
        self.decay = decay
        self.prior_alpha = prior_alpha
        self.prior_weight = prior_weight
        self.global_decay = global_decay
        self._all = [prior_alpha, 1.0]  # decayed (hits, trials) of all requests
        self._hits: dict[str, float] = {}
        self._trials: dict[str, float] = {}
        self._full_draft: dict[str, list[int]] = {}
        self._shown: dict[str, int] = {}

    @property
    def alpha_all(self) -> float:
        """Acceptance over all requests' recent observations, in [0, 1]."""
        return self._all[0] / self._all[1]

    def alpha(self, req_id: str) -> float:
        """Estimated per-token acceptance probability of ``req_id``, in [0, 1]."""
        w = self.prior_weight
        return ((self._hits.get(req_id, 0.0) + w * self.alpha_all)
                / (self._trials.get(req_id, 0.0) + w))

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

    def expected_accepted(self, req_id: str, length: int) -> float:
        """Expected accepted tokens of a ``length``-token draft of ``req_id``:
        ``sum(alpha**j for j in 1..length)`` (geometric acceptance)."""
        a = self.alpha(req_id)
        return float(length) if a >= 1.0 else a * (1.0 - a ** length) / (1.0 - a)

    def withhold(self, req_ids: Sequence[str]) -> list[list[int]]:
        """Show no draft this step (the full drafts from :meth:`trim` stay as shadow
        drafts); returns one empty draft per request."""
        for rid in req_ids:
            if rid in self._shown:
                self._shown[rid] = 0
        return [[] for _ in req_ids]

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
        d = self.decay ** trials
        self._hits[req_id] = self._hits.get(req_id, 0.0) * d + hits
        self._trials[req_id] = self._trials.get(req_id, 0.0) * d + trials
        g = self.global_decay ** trials
        self._all = [self._all[0] * g + hits, self._all[1] * g + trials]

    def forget(self, req_id: str) -> None:
        """Drop the statistics of a finished request."""
        for table in (self._hits, self._trials, self._full_draft, self._shown):
            table.pop(req_id, None)


class StepCostModel:
    """Online fit of the target's step time ``T = a + b·n + c·s``.

    ``n`` is the number of tokens scheduled in the step and ``s`` is 1 when the step
    verified draft tokens (the speculative path: spec-decode metadata, the rejection
    sampler) and 0 for a plain step, so ``c`` (seconds) is the fixed price of drafting
    at all in a step. Exponentially weighted least squares with ridge priors: the slope
    is pulled towards ``prior_slope_ratio`` x the mean step time and ``c`` towards 0
    until the observations vary enough to measure them.

    Args:
        decay: weight kept per observation, in (0, 1).
        prior_slope_ratio: prior b/a (0.01: one extra token costs 1% of a step, what a
            memory-bound GPU step looks like).
        prior_weight: strength of the slope prior, in squared tokens.
        fixed_prior_weight: strength of the ``c = 0`` prior, in steps.
    """

    def __init__(self, decay: float = 0.99, prior_slope_ratio: float = 0.01,
                 prior_weight: float = 4.0, fixed_prior_weight: float = 1.0):
        self.decay = decay
        self.prior_slope_ratio = prior_slope_ratio
        self.prior_weight = prior_weight
        self.fixed_prior_weight = fixed_prior_weight
        self._xx = np.zeros((3, 3))  # decayed sum of x x^T, x = (1, n, s)
        self._xy = np.zeros(3)  # decayed sum of x T
        self._fit: tuple[float, float, float] | None = None  # cached coefficients

    def observe(self, tokens: int, seconds: float, speculative: bool = False) -> None:
        """Add one step: ``tokens`` scheduled tokens took ``seconds``; ``speculative``:
        the step verified draft tokens."""
        x = np.array([1.0, float(tokens), 1.0 if speculative else 0.0])
        self._xx *= self.decay
        self._xy *= self.decay
        self._xx += np.outer(x, x)
        self._xy += x * seconds
        self._fit = None

    @property
    def fitted(self) -> bool:
        """Whether any step has been observed."""
        return bool(self._xx[0, 0] > 0)

    def coefficients(self) -> tuple[float, float, float]:
        """``(a, b, c)``: seconds, seconds per token, seconds; zeros before any step."""
        if not self.fitted:
            return 0.0, 0.0, 0.0
        if self._fit is None:
            self._fit = self._solve()
        return self._fit

    def _solve(self) -> tuple[float, float, float]:
        mean_step = self._xy[0] / self._xx[0, 0]
        ridge = np.diag([0.0, self.prior_weight, self.fixed_prior_weight])
        target = np.array([0.0, self.prior_weight * self.prior_slope_ratio * mean_step, 0.0])
        a, b, c = np.linalg.lstsq(self._xx + ridge, self._xy + target, rcond=None)[0]
        b, c = max(0.0, float(b)), max(0.0, float(c))
        n_mean = self._xx[0, 1] / self._xx[0, 0]
        s_mean = self._xx[0, 2] / self._xx[0, 0]
        a = max(float(mean_step - b * n_mean - c * s_mean), 1e-9)  # refit after clipping
        return a, b, c

    def threshold(self, rows: int) -> float:
        """Emission probability a draft token must beat when ``rows`` requests decode.

        Returns ``b · rows / T(rows)`` with ``T(rows) = a + b·rows`` (a plain step); 0
        (draft everything) before the first step.
        """
        a, b, _ = self.coefficients()
        if rows <= 0 or not self.fitted:
            return 0.0
        return b * rows / (a + b * rows)

    def pays_off(self, rows: int, expected_accepted: float, draft_tokens: int) -> bool:
        """Whether drafting this step raises throughput: ``(rows + E) / (T(rows) + b·D + c)
        > rows / T(rows)``, i.e. ``E · T(rows) > rows · (b·D + c)``.

        Args:
            rows: requests decoding this step.
            expected_accepted: ``E``, expected accepted draft tokens over the batch.
            draft_tokens: ``D``, draft tokens that would be verified.
        """
        if draft_tokens <= 0:
            return False
        if not self.fitted:
            return True
        a, b, c = self.coefficients()
        return expected_accepted * (a + b * rows) > rows * (b * draft_tokens + c)
