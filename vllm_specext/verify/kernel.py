"""One fused, batch-vectorised verification pass over a ragged batch of drafts.

The output follows vLLM's rejection-sampler contract exactly (``vllm/v1/sample/
rejection_sampler.py``): row ``i`` of ``[B, max_spec_len + 1]`` int32 holds the accepted
draft prefix, then one recovered or bonus token, then ``-1`` padding. Strategies and
accept policies are described in :mod:`vllm_specext.verify.strategies`; rows of one
batch may mix greedy and random requests, strategies and policies.

How the target's token ``t_j`` at draft position ``j`` is drawn (random rows): with
``u_j, v_j`` uniform (the request's own generator when it is seeded),
``t_j = d_j`` if ``p_j(d_j) / q_j(d_j) > u_j`` (``q = 1`` without draft probabilities)
else a draw with ``v_j`` from ``max(p_j - q_j, 0)``, or from ``p_j`` with ``d_j`` masked
out. For ``q = 1`` this is an exact sample ``t_j ~ p_j`` (it equals ``d_j`` with
probability ``p_j(d_j)``); with draft probabilities it is the standard rejection-sampling
coupling (Leviathan et al. 2023). ``standard`` accepts while the test passes,
``target_match`` accepts while ``d_j == t_j`` (the test with ``q = 1``), and every
strategy emits ``t`` at the first rejection, so all strategies share one set of random
numbers and one code path. Greedy rows use ``t_j = argmax p_j``.

Cost: one ``[T, V]`` argmax (greedy rows) and/or one tiled ``[T, V]`` softmax pass
(random rows, ``top_p``) that keeps only ``p(draft)``, then ``[B, V]`` work for the one
recovered token per request; ``[T, V]`` sampling only when ``return_target_tokens`` asks
for the target's token at every position. Compared with vLLM's sampler: no ``[T, V]``
probability buffer, no ``[B, V]`` exponentials, no recovered token at every position.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from vllm_specext.verify.ops import (
    argmax_last,
    draw_uniforms,
    ragged_layout,
    sample_rows,
    softmax_tiles,
)
from vllm_specext.verify.strategies import (
    DEFAULT_TOP_P,
    POLICY_NAMES,
    STRATEGY_NAMES,
    Policy,
    Strategy,
    check_top_p,
    normalize_policy,
    normalize_strategy,
)

#: Tensor or a Python bool that stands for "this holds for every row".
RowMask = torch.Tensor | bool


@dataclass(frozen=True)
class VerifyOutput:
    """Result of :func:`verify_drafts`.

    Attributes:
        output_token_ids: ``[B, max_spec_len + 1]`` int32: accepted drafts, one
            recovered/bonus token, ``-1`` padding (vLLM's ``sampled_token_ids``).
        num_accepted: ``[B]`` int64, accepted drafts per request (``0..n_i``).
        target_token_ids: ``[T]`` int64, the target's token at every draft position
            (argmax for greedy rows, the sampled token ``t_j`` otherwise, see the module
            docstring), or None unless ``return_target_tokens`` was set. Under the
            ``normal`` policy it equals the draft at accepted positions of
            ``standard``/``greedy``/``target_match`` rows; at the first rejected position
            it always equals the emitted token.
    """

    output_token_ids: torch.Tensor
    num_accepted: torch.Tensor
    target_token_ids: torch.Tensor | None


def verify_drafts(
    draft_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    target_logits: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    is_greedy: torch.Tensor | bool,
    generators: Mapping[int, torch.Generator] | None = None,
    *,
    num_draft_tokens: Sequence[int] | None = None,
    max_spec_len: int | None = None,
    strategy: str | Sequence[str] = "standard",
    accept_policy: str | Sequence[str] = "normal",
    top_p: float | Sequence[float] | torch.Tensor = DEFAULT_TOP_P,
    draft_probs: torch.Tensor | None = None,
    return_target_tokens: bool = False,
) -> VerifyOutput:
    """Verify a flattened ragged batch of drafts in one vectorised pass.

    Args:
        draft_token_ids: ``[T]`` int, drafts of all requests back to back; ``-1`` marks a
            draft that must be rejected (grammar-invalidated or padding).
        cu_num_draft_tokens: ``[B]`` int, inclusive cumulative draft counts (zero-length
            requests allowed); read only when ``num_draft_tokens`` is None.
        target_logits: ``[T, V]`` float, the target's processed logits at each draft
            position (temperature, top-k/top-p and logits processors already applied to
            random rows, as vLLM's ``RejectionSampler.forward`` does). Not modified.
        bonus_token_ids: ``[B]`` or ``[B, 1]`` int, the token sampled after the last
            draft; emitted when all of a request's drafts are accepted.
        is_greedy: ``[B]`` bool, or True/False for an all-greedy/all-random batch.
        generators: batch row -> ``torch.Generator`` of seeded requests.
        num_draft_tokens: host list ``[B]`` of per-request draft counts (must match
            ``cu_num_draft_tokens``); derived from it, with one device sync, when None.
        max_spec_len: output width minus one; ``max(num_draft_tokens)`` when None.
        strategy: one name for all rows or one per row (see
            :mod:`~vllm_specext.verify.strategies`; ``topp`` is accepted).
        accept_policy: ``normal`` | ``accept_all`` | ``reject_all``, or one per row.
        top_p: nucleus mass in ``(0, 1]`` for ``top_p`` rows (one, or ``[B]``).
        draft_probs: ``[T, V]`` draft probabilities ``q`` or None for one-hot drafts;
            only ``standard`` uses them.
        return_target_tokens: also return the target's token at every draft position
            (costs one extra ``[T, V]`` sampling pass on random rows).

    Returns:
        :class:`VerifyOutput`.

    Raises:
        SpecExtConfigError: unknown strategy/policy name or ``top_p`` outside ``(0, 1]``.
        ValueError: a per-row list whose length is not ``B``.
    """
    device = target_logits.device
    num_tokens, vocab = target_logits.shape
    batch = cu_num_draft_tokens.shape[0]
    if num_draft_tokens is None:
        cu = cu_num_draft_tokens.to(torch.int64)
        num_draft_tokens = torch.diff(cu, prepend=cu.new_zeros(1)).tolist()
    if max_spec_len is None:
        max_spec_len = max(num_draft_tokens, default=0)
    strat, strat_set = _row_codes(strategy, STRATEGY_NAMES, normalize_strategy, batch, device)
    policy, policy_set = _row_codes(accept_policy, POLICY_NAMES, normalize_policy, batch, device)
    bonus = bonus_token_ids.reshape(-1).to(torch.int32)

    out = torch.full((batch, max_spec_len + 1), -1, dtype=torch.int32, device=device)
    if num_tokens == 0:
        out[:, 0] = bonus
        empty = torch.empty(0, dtype=torch.int64, device=device)
        return VerifyOutput(out, torch.zeros(batch, dtype=torch.int64, device=device),
                            empty if return_target_tokens else None)

    num, start, tok_req, tok_pos = ragged_layout(num_draft_tokens, device)

    def per_token(row_value):
        """Expand a ``[B]`` tensor to ``[T]``; Python scalars stand for every row."""
        return row_value[tok_req] if isinstance(row_value, torch.Tensor) else row_value

    # Row roles (bool when uniform over the batch, so unused branches cost nothing).
    greedy_rows: RowMask = is_greedy if isinstance(is_greedy, bool) else is_greedy.to(device)
    top_p_rows = _eq(strat, Strategy.TOP_P, strat_set)
    greedy_strategy_rows = _eq(strat, Strategy.GREEDY, strat_set)
    argmax_rows = _or(greedy_rows, greedy_strategy_rows)  # t_j = argmax p_j on these rows
    argmax_verify_rows = _or(_and(greedy_rows, _not(top_p_rows)), greedy_strategy_rows)
    need_argmax = argmax_rows is not False
    need_sample = argmax_rows is not True
    need_probs = need_sample or Strategy.TOP_P in strat_set

    draft = draft_token_ids.to(torch.int64)
    # argmax is never -1 or >= V, so pure argmax verification needs no validity mask.
    valid = safe = None
    if need_probs or Policy.ACCEPT_ALL in policy_set:
        valid = (draft >= 0) & (draft < vocab)
        safe = torch.where(valid, draft, 0).unsqueeze(-1)

    argmax = argmax_last(target_logits) if need_argmax else None
    std_rows: RowMask = False  # rows whose test and recovery use draft_probs
    u_accept = u_recover = None
    if need_sample:
        u_accept, u_recover = draw_uniforms(num_draft_tokens, generators or {}, device)
        if draft_probs is not None:
            std_rows = _eq(strat, Strategy.STANDARD, strat_set)

    # One pass over row tiles of the target's probabilities: p(draft), the mass above it
    # (top_p) and, when every position's target token is asked for, the recovered tokens.
    p_draft = mass_above = recovered = None
    if need_probs:
        p_draft = torch.empty(num_tokens, dtype=torch.float32, device=device)
        if Strategy.TOP_P in strat_set:
            mass_above = torch.empty_like(p_draft)
        if return_target_tokens and need_sample:
            recovered = torch.empty_like(draft)
        for rows, probs in softmax_tiles(target_logits):
            tile_p_draft = probs.gather(1, safe[rows]).squeeze(-1)
            p_draft[rows] = tile_p_draft
            if mass_above is not None:
                mass_above[rows] = torch.where(probs > tile_p_draft.unsqueeze(-1), probs,
                                               0.0).sum(-1)
            if recovered is not None:  # consumes probs
                recovered[rows] = _recover(
                    probs, safe[rows], valid[rows], u_recover[rows],
                    None if draft_probs is None else draft_probs[rows],
                    std_rows[tok_req[rows]] if isinstance(std_rows, torch.Tensor) else std_rows)

    test = None
    if need_sample:
        ratio = p_draft
        if std_rows is not False:
            q_draft = draft_probs.gather(1, safe).squeeze(-1)
            std_ratio = torch.where(q_draft > 0, p_draft / q_draft, 0.0)
            ratio = _select(per_token(std_rows), std_ratio, p_draft)
        test = valid & (ratio > u_accept)

    in_nucleus = None
    if mass_above is not None:
        # Inside the nucleus iff p > 0 and the mass of strictly more probable tokens is
        # < top_p; top_p = 1 keeps the whole support despite float rounding of that mass.
        top_p_tok = per_token(_top_p_rows(top_p, batch, device))
        in_nucleus = valid & (p_draft > 0) & ((mass_above < top_p_tok) | (top_p_tok >= 1.0))

    accept = _select(per_token(top_p_rows), in_nucleus,
                     _select(per_token(argmax_verify_rows),
                             (draft == argmax) if need_argmax else None, test))
    if policy_set != {Policy.NORMAL}:
        accept_all = per_token(_eq(policy, Policy.ACCEPT_ALL, policy_set))
        reject_all = per_token(_eq(policy, Policy.REJECT_ALL, policy_set))
        accept = _select(reject_all, False, _select(accept_all, valid, accept))
        if isinstance(accept, bool):
            accept = torch.full_like(draft, accept, dtype=torch.bool)

    # First rejected position per request (n_i when all are accepted).
    rejected_pos = torch.where(accept, max_spec_len + 1, tok_pos)
    num_accepted = num.clone().scatter_reduce_(0, tok_req, rejected_pos, "amin")
    at = (start + num_accepted).clamp_(max=num_tokens - 1)

    target_tokens = None
    if return_target_tokens:
        sampled = torch.where(test, draft, recovered) if need_sample else None
        target_tokens = _select(per_token(argmax_rows), argmax, sampled)
        emit = target_tokens[at]
    else:
        sampled = None
        if need_sample:  # the recovered token only where it may be emitted: [B, V] work
            probs_at = target_logits[at].softmax(-1, dtype=torch.float32)
            q_at = None if draft_probs is None else draft_probs[at]
            rec = _recover(probs_at, safe[at], valid[at], u_recover[at], q_at, std_rows)
            sampled = torch.where(test[at], draft[at], rec)
        emit = _select(argmax_rows, argmax[at] if need_argmax else None, sampled)

    out[tok_req, tok_pos] = draft_token_ids.to(torch.int32)
    cols = torch.arange(max_spec_len + 1, device=device)
    out.masked_fill_(cols >= num_accepted.unsqueeze(-1), -1)
    last = torch.where(num_accepted == num, bonus, emit.to(torch.int32))
    out.scatter_(1, num_accepted.unsqueeze(-1), last.unsqueeze(-1))
    return VerifyOutput(out, num_accepted, target_tokens)


def _recover(p_rows: torch.Tensor, d: torch.Tensor, ok: torch.Tensor, u: torch.Tensor,
             q_rows: torch.Tensor | None, std: RowMask) -> torch.Tensor:
    """Recovered token per row; ``p_rows`` ``[R, V]`` is overwritten.

    Drawn with ``u`` ``[R]`` from ``max(p - q, 0)`` on ``std`` rows (bool or ``[R]``;
    needs ``q_rows``), else from ``p`` with the draft ``d`` (``[R, 1]``, masked where
    ``ok`` ``[R]``) removed: vLLM's recovered-token distributions.
    """
    residual = None
    if q_rows is not None and std is not False:
        residual = (p_rows - q_rows).clamp_(min=0.0)
    p_rows.scatter_(1, d, torch.where(ok.unsqueeze(-1), 0.0, p_rows.gather(1, d)))
    if residual is not None:
        p_rows = _select(std if isinstance(std, bool) else std.unsqueeze(-1), residual, p_rows)
    return sample_rows(p_rows, u)


def _row_codes(value, names, normalize, batch: int, device: torch.device):
    """``(code or [B] int64 codes, set of codes present)`` for a name or per-row names."""
    if isinstance(value, str):
        code = names[normalize(value)]
        return code, {code}
    codes = [names[normalize(v)] for v in value]
    if len(codes) != batch:
        raise ValueError(f"expected {batch} per-row names, got {len(codes)}")
    present = set(codes)
    if len(present) == 1:
        return codes[0], present
    return torch.tensor(codes, dtype=torch.int64, device=device), present


def _top_p_rows(top_p, batch: int, device: torch.device) -> torch.Tensor | float:
    if isinstance(top_p, torch.Tensor):
        return top_p.to(device=device, dtype=torch.float32)
    if isinstance(top_p, (int, float)):
        return check_top_p(top_p)
    values = [check_top_p(v) for v in top_p]
    if len(values) != batch:
        raise ValueError(f"expected {batch} per-row top_p values, got {len(values)}")
    return torch.tensor(values, dtype=torch.float32, device=device)


def _eq(codes, code: int, present: set[int]) -> RowMask:
    """Rows whose code is ``code``; a bool when that holds for none or all rows."""
    if code not in present:
        return False
    return codes == code if isinstance(codes, torch.Tensor) else True


def _not(a: RowMask) -> RowMask:
    return (not a) if isinstance(a, bool) else ~a


def _and(a: RowMask, b: RowMask) -> RowMask:
    if a is False or b is False:
        return False
    if a is True:
        return b
    return a if b is True else a & b


def _or(a: RowMask, b: RowMask) -> RowMask:
    if a is True or b is True:
        return True
    if a is False:
        return b
    return a if b is False else a | b


def _select(cond: RowMask, a, b):
    """``torch.where(cond, a, b)``, skipping the unused branch when ``cond`` is a bool.

    A None branch was not computed because no row needs it; it reads as False.
    """
    if cond is True:
        return a
    if cond is False:
        return b
    return torch.where(cond, False if a is None else a, False if b is None else b)
