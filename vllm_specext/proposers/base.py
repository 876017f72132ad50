"""The core proposer API shared by the vLLM adapter and the offline replay.

A proposer (drafter) guesses the next tokens of each active request from token ids
alone. It never imports vLLM: the same object runs inside the engine (through
:mod:`vllm_specext.integration.adapter`) and in offline trace replay.

Life cycle of one request, as the engine drives it::

    p.start_request(req_id, prompt_token_ids)      # once, when the request is scheduled
    loop:
        drafts = p.propose([req_id, ...])          # <= k draft tokens per request
        p.update(req_id, accepted + [bonus])       # tokens committed after verification
    p.stop_request(req_id, finished=True)          # finished; False = aborted/preempted

State is incremental: ``update`` costs O(len(new_token_ids)) and ``propose`` does not
rescan the context.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence

import numpy as np


def match_kind(match_len: int) -> int:
    """Draft kind (:attr:`Proposer.last_kinds`) of a draft that continues a context
    suffix of ``match_len`` tokens: 0 for none, then one kind per power of two (1, 2-3,
    4-7, 8-15, 16+ tokens -> 1..5). Longer matches are accepted more often (the premise
    of SuffixDecoding's ``max_spec_factor``, Oliaro et al. 2025)."""
    return min(5, max(0, int(match_len)).bit_length())


class TokenBuffer:
    """Append-only int32 token history with amortised O(1) appends.

    ``view()`` returns an int32 array of shape ``(len,)`` that aliases the buffer
    (valid until the next append).
    """

    __slots__ = ("_data", "_len", "_mv")

    #: appends of at most this many tokens are stored one by one through a memoryview
    #: (about 0.03 us a token; a numpy slice assignment from a list costs about 0.3 us)
    SHORT_APPEND = 8

    def __init__(self, tokens: Iterable[int] = (), capacity: int = 256):
        arr = np.asarray(list(tokens) if not isinstance(tokens, np.ndarray) else tokens,
                         dtype=np.int32)
        self._data = np.empty(max(capacity, 2 * len(arr), 16), dtype=np.int32)
        self._data[: len(arr)] = arr
        self._len = len(arr)
        self._mv = memoryview(self._data)

    def extend(self, tokens: Sequence[int]) -> None:
        """Append ``tokens`` (a sequence of int token ids within int32); grows the storage
        geometrically."""
        n = len(tokens)
        i = self._len
        if i + n > len(self._data):
            grown = np.empty(max(2 * len(self._data), i + n), dtype=np.int32)
            grown[:i] = self._data[:i]
            self._data = grown
            self._mv = memoryview(grown)
        if n > self.SHORT_APPEND:
            self._data[i: i + n] = tokens
        else:
            mv = self._mv
            for t in tokens:
                mv[i] = t
                i += 1
        self._len += n

    def view(self) -> np.ndarray:
        """The committed tokens, int32 ``(len,)``, aliasing the storage."""
        return self._data[: self._len]

    @property
    def storage(self) -> np.ndarray:
        """The whole backing array (capacity >= len); only ``[:len]`` is valid."""
        return self._data

    def __len__(self) -> int:
        return self._len

    @property
    def nbytes(self) -> int:
        return self._data.nbytes


class Proposer(ABC):
    """Base class of every vllm_specext proposer.

    Subclasses implement ``_propose_one`` (or override ``propose`` for a batched
    kernel) and may hook ``_on_start``/``_on_update``/``_on_stop``. The base class
    keeps each request's token history in a :class:`TokenBuffer` (prompt followed by
    committed output) and the prompt length.

    Args:
        num_speculative_tokens: k, the most draft tokens per request per step (>= 1).
    """

    #: the method name used in ``speculative_config``
    method: str = ""

    def __init__(self, num_speculative_tokens: int):
        if num_speculative_tokens < 1:
            raise ValueError("num_speculative_tokens must be >= 1")
        self.num_speculative_tokens = int(num_speculative_tokens)
        self.tokens: dict[str, TokenBuffer] = {}
        self.prompt_len: dict[str, int] = {}
        self._kind = 0  # set by _propose_one for its draft (see last_kinds)

    # ----------------------------------------------------------------- life cycle
    def start_request(self, req_id: str, prompt_token_ids: Sequence[int]) -> None:
        """Begin tracking ``req_id`` with its prompt (int token ids, any length >= 0).

        A request id that is still active is reset first (request-id reuse).
        """
        if req_id in self.tokens:
            self.stop_request(req_id, finished=False)
        self.tokens[req_id] = TokenBuffer(prompt_token_ids)
        self.prompt_len[req_id] = len(prompt_token_ids)
        self._on_start(req_id)

    def update(self, req_id: str, new_token_ids: Sequence[int]) -> None:
        """Append tokens committed after verification (accepted drafts + bonus).

        Raises:
            KeyError: ``req_id`` was never started (or already stopped).
        """
        if len(new_token_ids) == 0:
            return
        buf = self.tokens[req_id]
        old_len = len(buf)
        buf.extend(new_token_ids)
        self._on_update(req_id, old_len)

    def stop_request(self, req_id: str, finished: bool = True) -> None:
        """Forget ``req_id``. ``finished=True``: it completed normally and its output
        may feed cross-request caches; ``False``: aborted or preempted. Unknown ids
        are ignored."""
        if req_id not in self.tokens:
            return
        self._on_stop(req_id, finished)
        del self.tokens[req_id]
        del self.prompt_len[req_id]

    @property
    def active_requests(self) -> set[str]:
        return set(self.tokens)

    # ----------------------------------------------------------------- drafting
    def propose(self, req_ids: Sequence[str],
                max_tokens: Sequence[int] | None = None) -> list[list[int]]:
        """Draft tokens for a batch.

        Args:
            req_ids: active request ids (unknown ids get ``[]``).
            max_tokens: optional per-request cap on the draft length (e.g. the
                tokens left before ``max_model_len`` or the adaptive length); the
                effective cap is ``min(k, max_tokens[i])``.

        Returns:
            One list of int token ids per request, each of length 0..k;
            ``[]`` means no speculation for that request this step.
        """
        out: list[list[int]] = []
        kinds: list[int] = []
        for rid, cap in zip(req_ids, self._caps(len(req_ids), max_tokens)):
            self._kind = 0
            if cap <= 0 or rid not in self.tokens:
                out.append([])
            else:
                out.append(self._propose_one(rid, cap))
            kinds.append(self._kind)
        self.last_kinds = kinds
        return out

    def _caps(self, n: int, max_tokens: Sequence[int] | None) -> list[int]:
        """Per-row draft caps of a :meth:`propose` call: ``min(k, max_tokens[i])``."""
        k = self.num_speculative_tokens
        return [k] * n if max_tokens is None else [min(k, int(m)) for m in max_tokens]

    @abstractmethod
    def _propose_one(self, req_id: str, max_tokens: int) -> list[int]:
        """Draft at most ``max_tokens`` (>= 1) tokens for one active request; may set
        ``self._kind`` (see :attr:`last_kinds`)."""

    #: Per row of the last :meth:`propose` call, a small int naming what its draft was
    #: made from (0 when the proposer does not tell kinds apart; e.g. ``lookahead``: 0
    #: Jacobi-window guesses, 1 next-token table, 1 + m an n-gram pool key of m tokens;
    #: ``ngram``: :func:`~vllm_specext.proposers.ngram.ngram_kind`; ``memory_decoding``:
    #: :func:`~vllm_specext.proposers.memory_decoding.draft_kind`; a rejected tail of
    #: ``suffix`` or ``memory_decoding``:
    #: :data:`~vllm_specext.proposers.rejected_tail.TAIL_KIND`, above every other kind).
    #: The adaptive controller tracks acceptance per request and kind. None: no kinds.
    last_kinds: list[int] | None = None

    #: True for proposers that learn from the target model's tokens at draft positions
    #: (the engine then computes and passes them to :meth:`observe_targets`).
    uses_target_tokens: bool = False

    def observe_targets(self, req_id: str, draft: Sequence[int],
                        targets: Sequence[int]) -> None:
        """The target model's token at each verified draft position of ``req_id``'s last
        step (argmax for greedy requests, the verifier's sample otherwise), whether the
        draft token was accepted or not: one Jacobi update of the draft (Fu et al. 2024).

        Args:
            draft: the draft tokens that were verified (length n).
            targets: the target's token at each of those n positions.
        """

    # ----------------------------------------------------------------- hooks
    def warm_up_kernels(self) -> None:
        """Load the compiled kernels that :func:`warm_up`'s short synthetic requests do
        not reach (e.g. those that only a growing or compacting index calls), so that
        their first call does not stall a serving step; default: none."""

    def _on_start(self, req_id: str) -> None:
        """Called after the prompt is stored."""

    def _on_update(self, req_id: str, old_len: int) -> None:
        """Called after tokens ``[old_len:]`` were appended to ``self.tokens[req_id]``."""

    def _on_stop(self, req_id: str, finished: bool) -> None:
        """Called before the request's state is dropped."""

    # ----------------------------------------------------------------- accounting
    def state_nbytes(self) -> int:
        """Bytes held by this proposer's state (token buffers plus subclass state)."""
        return sum(b.nbytes for b in self.tokens.values())


def warm_up(proposer: Proposer, steps: int = 12) -> None:
    """Run two synthetic requests through ``proposer`` so that its compiled kernels
    (numba's on-disk cache, first-call dispatch) are loaded before real traffic.

    Start, ``steps`` rounds of update / propose / observe_targets, a normal finish (feeds
    cross-request caches), then a second request over the same tokens that is aborted;
    then :meth:`Proposer.warm_up_kernels` for the kernels those requests do not reach.
    Use a throwaway instance: the synthetic tokens stay in its caches.

    Args:
        proposer: a freshly built proposer.
        steps: draft-and-commit rounds per request (>= 1).
    """
    pattern = list(range(3, 23))
    for rid, finished in (("specext-warmup-0", True), ("specext-warmup-1", False)):
        proposer.start_request(rid, pattern * 3)
        for i in range(steps):
            draft = proposer.propose([rid])[0]
            if draft:
                proposer.observe_targets(rid, draft, draft)
            proposer.update(rid, draft[:1] + [pattern[i % len(pattern)]])
        proposer.stop_request(rid, finished=finished)
    proposer.warm_up_kernels()
