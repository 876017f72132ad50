"""``lookahead``: lookahead decoding's n-gram pool and Jacobi window on vLLM's single draft
chain (Fu et al., "Break the Sequential Dependency of LLM Inference Using Lookahead
Decoding", ICML 2024, ``hao-ai-lab/LookaheadDecoding``; Huawei MindIE ``plugin_type: la``).

The paper's step runs two branches in one forward pass: a *lookahead branch*, a 2-D
window of W positions x (N-1) Jacobi iterations whose diagonals are harvested as N-grams
into a pool (per key token, the G most recent (N-1)-token continuations), and a
*verification branch* that checks all (up to G) pool n-grams starting with the last token.
vLLM verifies one linear chain of at most ``num_speculative_tokens`` (k) tokens per
request per step, so here:

* **Pool** (:class:`~vllm_specext.proposers.lookahead_pool.NgramPool`, per request): key
  n-grams of 1..N-1 tokens -> up to G continuations of N-1 tokens, filled from the prompt
  and the output as they grow (lade's ``POOL_FROM_PROMPT``, here always on, with longer
  keys too) and from Jacobi feedback (below, one-token keys as in lade).
* **Next-token table** (per request, an ``NgramPool`` of width 1): per token p, the G
  most recent tokens the target predicted right after p at a verified position
  (``targets[j]`` after ``draft[j-1]``, or after the context's last token for j = 0), as
  Token Recycling (Luo et al., ACL 2025) keeps the target's next tokens per token.
* **Prompt lookup first** (``prompt_lookup_max > 0``, not in the paper): when a suffix
  n-gram of 2..``prompt_lookup_max`` tokens of the context occurred before, its k-token
  continuation is drafted, as method ``ngram`` does (the same
  :class:`~vllm_specext.proposers.ngram.PromptLookup`): a copied span continues
  further than a chain of (N-1)-token pool continuations. Batch 1 in the engine, code
  editing (``benchmarks/e2e.py --methods lookahead,vllm_ngram --batch-sizes 1,32
  --workloads code_editing,summarization,open_chat --max-tokens 96 --batch1-prompts 4``):
  tau 2.93 for the pool and window alone, 3.20 with prompt lookup first, 3.10 for vLLM's
  ``ngram``.
* **Draft**: chained lookups; each takes the most recent continuation of the longest key
  (N-1 tokens down to 1) that ends context + draft so far, from the pool (then the shared
  pool) at that key length, the next-token table last, and the next lookup continues
  from the end of the drafted tokens, until k tokens.
* **Jacobi window** (per request, W guesses for the positions after the context): drafted
  instead when nothing continues the context's last token. Empty slots are filled with
  random tokens of the context (lade's ``copy_from`` initialisation).
* **Jacobi feedback** (:meth:`LookaheadProposer.observe_targets`, fed by the verifier):
  after each verified step the target's token ``targets[j]`` at every draft position --
  its prediction after ``draft[j-1]`` (accepted or not; argmax for greedy requests, the
  verifier's sample otherwise) -- is one Jacobi update of the draft. Every drafted token
  carries a *trajectory*: the N-1 tokens ending at it along which each token was predicted
  from the one before (lade's diagonal across Jacobi levels). For a token that was itself
  a target re-proposed from the window it is the previous trajectory shifted by one; for
  other tokens (pool drafts, random fills, the context) it is the N-1 tokens before it in
  context + draft. ``trajectory(prev) + targets[j]`` is harvested as an N-gram (key: its
  first token), and the targets replace the window's guesses at their positions, keeping
  their trajectories, so that window positions drafted again form longer diagonals.
* **Shared pool** (optional, ``shared_pool_size > 0``): the Jacobi n-grams, next tokens and
  output n-grams of every request also go to a pool and table shared across requests,
  consulted after the request's own; two halves of ``shared_pool_size // 2``
  continuations (n-grams and next tokens together), the older half dropped when the
  newer fills.

Design measurements (a greedy propose / verify / observe loop over the default model in
``transformers``, k = 8, 96 tokens, the first open_chat prompts of
``benchmarks/workloads.py``): diagonal trajectories gave tau 1.322 where n-grams of context
+ draft tokens gave 1.285 (10 prompts); the next-token table raised tau from 1.260 to 1.330
(6 prompts); drafting the window instead of pool continuations with one- or two-token
keys lowered it to 1.17. End-to-end numbers: ``benchmarks/lookahead_e2e.py``.

How N, W, G and k map (the paper's step verifies ``(N-1)(W+G)`` guess tokens plus one,
hence MindIE's ``speculationGamma >= (N-1)(W+G)``; here a step verifies one chain):

* N (``level``): n-gram length; continuations have N-1 tokens, keys up to N-1 tokens,
  trajectories N-1 tokens.
* W (``window``): Jacobi guesses kept per request, and drafted when nothing continues the
  context.
* G (``guess_set_size``): continuations kept per key (and next tokens per token). Only the
  most recent is drafted (the paper verifies all G in parallel), so G bounds the pool and
  does not cost draft tokens.
* k (``num_speculative_tokens``): the chain budget; one step must hold the window and one
  continuation, so ``k >= max(W, N-1)``, which is the derived default.

Not reproduced from the paper: the lookahead branch's N-1 Jacobi levels computed every
step independently of the draft (Jacobi updates happen only at drafted positions); the
parallel verification of up to G candidates (one chain: the most recent continuation of
the longest matching key); lade's window that advances one position per step whatever was
accepted (ours follows the committed tokens, guesses stay at their absolute positions);
lade's sampling acceptance rule over several candidates (vLLM's rejection sampler verifies
the chain, so outputs keep the target distribution); lade's replacement of EOS in the
window by random tokens.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vllm_specext.proposers.base import Proposer
from vllm_specext.proposers.lookahead_pool import NgramPool, draft_chain
from vllm_specext.proposers.ngram import PromptLookup

#: Draft kinds (``last_kinds``): Jacobi window, next-token table, n-gram pool with a key of
#: m tokens (``KIND_POOL_KEY_1 + min(m, 5) - 1``, i.e. 2..6), prompt lookup.
KIND_WINDOW, KIND_NEXT_TOKEN, KIND_POOL_KEY_1, KIND_PROMPT_LOOKUP = 0, 1, 2, 7


class _Pools:
    """An n-gram pool (continuations of N-1 tokens, keys of 1..N-1 tokens) and a next-token
    table (one-token keys and continuations), both capped at G per key."""

    __slots__ = ("grams", "nxt")

    def __init__(self, width: int, g: int):
        self.grams = NgramPool(width, width, g)
        self.nxt = NgramPool(1, 1, g)

    @property
    def num_entries(self) -> int:
        return self.grams.num_entries + self.nxt.num_entries

    @property
    def nbytes(self) -> int:
        return self.grams.nbytes + self.nxt.nbytes


class _Request:
    """Per-request state: pools, how far the context was inserted, Jacobi window, last draft."""

    __slots__ = ("pool", "indexed", "shared_indexed", "win", "win_traj", "win_start",
                 "draft", "draft_traj", "draft_start", "rng")

    def __init__(self, pool: _Pools, prompt_len: int, width: int):
        self.pool = pool
        self.indexed = 0                       # next continuation start for the own pool
        self.shared_indexed = prompt_len       # ... for the shared pool (outputs only)
        self.win = np.zeros(0, dtype=np.int32)           # Jacobi guesses at win_start + i
        self.win_traj = np.zeros((0, width), dtype=np.int32)
        self.win_start = 0
        self.draft = np.zeros(0, dtype=np.int32)         # the last draft, at draft_start + j
        #: the window draft's trajectories; None: horizontal (built when verified)
        self.draft_traj: np.ndarray | None = None
        self.draft_start = -1
        self.rng = np.random.default_rng(prompt_len)     # deterministic window fills


class LookaheadProposer(Proposer):
    """Lookahead decoding on a single draft chain (see the module docstring).

    Args:
        num_speculative_tokens: k, most draft tokens per step; ``k >= max(window, level-1)``.
        level: N, n-gram length (3..16).
        window: W, Jacobi window length (1..16).
        guess_set_size: G, continuations kept per key (1..16).
        shared_pool_size: most continuations in the pool shared across requests (0: none).
        prompt_lookup_max: longest suffix n-gram (from 2 tokens) whose continuation is
            drafted before the pools (0: no prompt lookup).

    Raises:
        ValueError: out-of-range arguments or ``k < max(window, level - 1)``.

    Memory: per request about ``4 (N-1)`` bytes per context token and Jacobi n-gram plus
    8-40 bytes per (key, continuation) link (up to N-1 keys per context token), and about
    40 bytes per next token; the shared pool at most ``shared_pool_size`` continuations
    of either kind.
    """

    method = "lookahead"
    uses_target_tokens = True

    def __init__(self, num_speculative_tokens: int, level: int = 4, window: int = 5,
                 guess_set_size: int = 5, shared_pool_size: int = 0,
                 prompt_lookup_max: int = 5):
        super().__init__(num_speculative_tokens)
        if not (3 <= level <= 16 and 1 <= window <= 16 and 1 <= guess_set_size <= 16
                and shared_pool_size >= 0 and 0 <= prompt_lookup_max <= 64):
            raise ValueError(f"need level in [3, 16], window and guess_set_size in [1, 16], "
                             f"shared_pool_size >= 0, prompt_lookup_max in [0, 64]; got "
                             f"{level}, {window}, {guess_set_size}, {shared_pool_size}, "
                             f"{prompt_lookup_max}")
        if num_speculative_tokens < max(window, level - 1):
            raise ValueError(f"num_speculative_tokens ({num_speculative_tokens}) must be >= "
                             f"max(window, level - 1) = {max(window, level - 1)}")
        self.level, self.window, self.g = int(level), int(window), int(guess_set_size)
        self.width = self.level - 1
        self.shared_pool_size = int(shared_pool_size)
        self.shared = [self._new_pool(), self._new_pool()] if shared_pool_size else []
        self._none = (np.zeros(0, np.uint64), np.zeros((0, 2), np.int32),
                      np.zeros((0, 1), np.int32))
        self._req: dict[str, _Request] = {}
        self._buf = np.empty(self.width + self.num_speculative_tokens, dtype=np.int32)
        #: row j: positions j+1 .. j+width of (context tail + draft), for _horizontal
        self._windows = (np.arange(1, self.num_speculative_tokens + 1)[:, None]
                         + np.arange(self.width)[None, :])
        self._info = np.zeros(2, dtype=np.int64)
        self.lookup = (PromptLookup(min(2, prompt_lookup_max), prompt_lookup_max)
                       if prompt_lookup_max else None)
        self._looked_up: dict[str, np.ndarray] = {}  # this call's prompt-lookup drafts
        #: drafts made by prompt lookup, from the pools and from the Jacobi window,
        #: Jacobi n-grams harvested
        self.counts = {"lookup": 0, "pool": 0, "window": 0, "grams": 0}

    def _new_pool(self) -> _Pools:
        return _Pools(self.width, self.g)

    # ------------------------------------------------------------ life cycle
    def _on_start(self, req_id: str) -> None:
        self._req[req_id] = _Request(self._new_pool(), self.prompt_len[req_id], self.width)
        if self.lookup is not None:
            self.lookup.start(req_id, self.tokens[req_id])

    def _on_update(self, req_id: str, old_len: int) -> None:
        if self.lookup is not None:
            self.lookup.sync(req_id, self.tokens[req_id])

    def _on_stop(self, req_id: str, finished: bool) -> None:
        if self.lookup is not None:
            self.lookup.stop(req_id)
        st = self._req.pop(req_id)
        if self.shared:  # the last outputs
            self._catch_up_shared(req_id, st)

    def _catch_up(self, req_id: str, st: _Request) -> None:
        """Insert the context n-grams completed since the last call."""
        buf = self.tokens[req_id]
        st.indexed = st.pool.grams.add_context(buf.storage, st.indexed, len(buf))
        if self.shared:
            self._catch_up_shared(req_id, st)

    def _catch_up_shared(self, req_id: str, st: _Request) -> None:
        """Insert the output n-grams completed since the last call into the shared pool."""
        buf = self.tokens[req_id]
        self._rotate()
        st.shared_indexed = self.shared[0].grams.add_context(buf.storage, st.shared_indexed,
                                                             len(buf))

    def _rotate(self) -> None:
        if self.shared[0].num_entries >= self.shared_pool_size // 2:
            self.shared = [self._new_pool(), self.shared[0]]

    # ------------------------------------------------------------ drafting
    def propose(self, req_ids: Sequence[str],
                max_tokens: Sequence[int] | None = None) -> list[list[int]]:
        """See :meth:`Proposer.propose`; prompt lookup runs for the whole batch in one
        call first, the pools and window per request where it found nothing."""
        if self.lookup is not None:
            found = self.lookup.draft(req_ids, self._caps(len(req_ids), max_tokens))
            self._looked_up = {req_ids[i]: draft for i, (draft, _) in found.items()}
        try:
            return super().propose(req_ids, max_tokens)
        finally:
            self._looked_up = {}

    def _tail(self, req_id: str) -> np.ndarray:
        """The context's last N-1 tokens, left-padded with -1; it may alias the token
        buffer, so callers must not write to it."""
        buf = self.tokens[req_id]
        n = len(buf)
        if n >= self.width:
            return buf.view()[n - self.width:]
        out = np.full(self.width, -1, dtype=np.int32)
        out[self.width - n:] = buf.view()
        return out

    def _horizontal(self, req_id: str, draft: np.ndarray) -> np.ndarray:
        """Trajectories of draft tokens that were not predicted from the token before them:
        row j = the N-1 tokens of context + draft ending at ``draft[j]`` (``len(draft)
        <= k``)."""
        seq = np.concatenate([self._tail(req_id), draft])
        return seq[self._windows[:len(draft)]]

    def _pools(self, st: _Request) -> tuple:
        """Lookup order at each key length: own n-grams, shared n-grams (newer half first),
        then the next-token tables (one-token keys only)."""
        shared = self.shared or [None, None]
        return (st.pool.grams.arrays,
                *[p.grams.arrays if p else self._none for p in shared],
                st.pool.nxt.arrays,
                *[p.nxt.arrays if p else self._none for p in shared])

    def _propose_one(self, req_id: str, max_tokens: int) -> list[int]:
        st = self._req[req_id]
        buf = self.tokens[req_id]
        length = len(buf)
        if length == 0:
            return []
        self._catch_up(req_id, st)
        drop = length - st.win_start  # guesses at committed positions are done
        if drop > 0:
            st.win, st.win_traj = st.win[drop:], st.win_traj[drop:]
            st.win_start = length
        looked_up = self._looked_up.get(req_id)
        n = 0
        if looked_up is None:
            n_ctx = min(length, self.width)
            self._buf[:n_ctx] = buf.view()[length - n_ctx:]
            n = draft_chain(self._pools(st), self._buf, n_ctx, self.width, max_tokens,
                            self._info)
        traj = None  # horizontal: built in observe_targets, if the draft is verified
        if looked_up is not None:
            draft = looked_up[:max_tokens].copy()
            self.counts["lookup"] += 1
            self._kind = KIND_PROMPT_LOOKUP
        elif n:
            draft = self._buf[n_ctx:n_ctx + n].copy()
            self.counts["pool"] += 1
            # _pools lists three n-gram pools, then the next-token tables
            self._kind = (KIND_POOL_KEY_1 + min(int(self._info[0]), 5) - 1
                          if self._info[1] < 3 else KIND_NEXT_TOKEN)
        else:
            self._fill_window(req_id, st)
            n = min(self.window, max_tokens)
            draft, traj = st.win[:n].copy(), st.win_traj[:n].copy()
            self.counts["window"] += 1
            self._kind = KIND_WINDOW
        st.draft, st.draft_traj, st.draft_start = draft, traj, length
        return draft.tolist()

    def _fill_window(self, req_id: str, st: _Request) -> None:
        """Pad the window to W guesses with random context tokens (horizontal trajectories)."""
        have = len(st.win)
        if have >= self.window:
            return
        ctx = self.tokens[req_id].view()
        fill = ctx[st.rng.integers(0, len(ctx), self.window - have)]
        win = np.concatenate([st.win, fill]).astype(np.int32)
        traj = self._horizontal(req_id, win)
        traj[:have] = st.win_traj
        st.win, st.win_traj = win, traj

    # ------------------------------------------------------------ Jacobi feedback
    def observe_targets(self, req_id: str, draft: Sequence[int],
                        targets: Sequence[int]) -> None:
        """Harvest the target's tokens at the last draft's positions (see module docstring).

        Args:
            draft: the verified draft tokens (a prefix of the last draft).
            targets: the target's token at each of those positions (only the first
                ``min(len(draft), len(targets))`` positions are used).

        Calls for unknown requests, or that do not follow the request's last draft (the
        context grew since), are ignored.
        """
        st = self._req.get(req_id)
        n = min(len(draft), len(targets))
        if st is None or n == 0 or st.draft_start != len(self.tokens[req_id]):
            return
        d = np.asarray(draft[:n], dtype=np.int32)
        t = np.asarray(targets[:n], dtype=np.int32)
        if (st.draft_traj is not None and n <= len(st.draft)
                and np.array_equal(st.draft[:n], d)):
            traj = st.draft_traj[:n]
        else:  # not a window draft, or not ours (e.g. trimmed differently): horizontal
            traj = self._horizontal(req_id, d)
        prev = np.concatenate([self._tail(req_id)[None, :], traj[:n - 1]])
        grams = np.concatenate([prev, t[:, None]], axis=1)
        nxt = grams[:, -2:]  # (token, the target's next token)
        nxt = nxt[nxt[:, 0] >= 0]
        grams = grams[grams.min(axis=1) >= 0]
        if self.shared:
            self._rotate()
        for pools in [st.pool] + self.shared[:1]:
            pools.grams.add_grams(grams)
            pools.nxt.add_grams(nxt)
        self.counts["grams"] += len(grams)
        # the targets are the new guesses at the draft's positions; later guesses stay
        new_traj = np.concatenate([prev[:, 1:], t[:, None]], axis=1)
        st.win = np.concatenate([t, st.win[n:]])[:self.window]
        st.win_traj = np.concatenate([new_traj, st.win_traj[n:]])[:self.window]
        st.win_start = st.draft_start

    def state_nbytes(self) -> int:
        """Token buffers, per-request pools and windows, and the shared pool."""
        own = sum(st.pool.nbytes + st.win_traj.nbytes
                  + (0 if st.draft_traj is None else st.draft_traj.nbytes)
                  for st in self._req.values())
        looked = self.lookup.nbytes if self.lookup is not None else 0
        return super().state_nbytes() + own + looked + sum(p.nbytes for p in self.shared)
