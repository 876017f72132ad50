"""``SpecExtProposer``: the one vLLM drafter class that runs every vllm_specext method.

vLLM instantiates it through ``method="custom_class"`` (see
:mod:`vllm_specext.integration.engine_config`) in each worker of the last pipeline
stage. :mod:`vllm_specext.integration.runner` binds it to its model runner so that it
sees request ids, prompt lengths and finished requests, which the bare
``custom_class`` call does not pass.

Each step vLLM calls ``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)``
after bookkeeping: row ``i`` of the persistent batch holds request
``input_batch.req_ids[i]`` whose committed tokens are
``token_ids_cpu[i, :num_tokens_no_spec[i]]`` and which just committed
``sampled_token_ids[i]``. The adapter keeps the core proposer in sync (start on first
sight, ``update`` with the committed tokens, a full resync whenever the lengths
disagree, e.g. after preemption) and returns one draft list (0..k tokens) per row.

Only the tensor-parallel rank whose output vLLM reads drafts; the others return empty
drafts without touching proposer state. A proposer exception never reaches the engine:
the step gets no drafts, the error is logged once and counted
(:mod:`vllm_specext.integration.metrics`), and the affected requests are resynced.
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from vllm_specext.adaptive import DraftLengthController, StepCostModel, shown_drafts
from vllm_specext.integration.decision_log import DecisionLog
from vllm_specext.integration.engine_config import ADDITIONAL_CONFIG_KEY
from vllm_specext.integration.metrics import record_proposer_error
from vllm_specext.integration.queue_signal import waiting_requests
from vllm_specext.proposers import build_proposer
from vllm_specext.proposers.base import warm_up

logger = logging.getLogger(__name__)

#: Test hook: a proposer step raises whenever a request id in its batch contains this
#: substring (exercises the error path: no drafts, logged once, counted in /metrics).
FAULT_ENV = "VLLM_SPECEXT_TEST_FAIL_REQUEST"


def _is_drafting_rank() -> bool:
    """True on the tensor-parallel rank whose drafts vLLM uses (TP rank 0)."""
    try:
        from vllm.distributed.parallel_state import get_tp_group

        return get_tp_group().rank_in_group == 0
    except (ImportError, AssertionError, AttributeError):  # not initialised: single process
        return True


def _draft_inputs(sampled_token_ids: Sequence[Sequence[int]], num_tokens_no_spec: np.ndarray,
                  token_ids_cpu: np.ndarray, slot_mappings: Any = None):
    """The inputs of :meth:`SpecExtProposer.propose` after the budget, bound by vLLM's
    parameter names (``slot_mappings`` is dropped)."""
    return sampled_token_ids, num_tokens_no_spec, token_ids_cpu


class SpecExtProposer:
    """vLLM ``custom_class`` drafter wrapping a :class:`~vllm_specext.proposers.Proposer`.

    Args:
        vllm_config: vLLM's ``VllmConfig``; ``additional_config["vllm_specext"]`` holds the
            validated method config written by the config front door.

    Raises:
        RuntimeError: the config did not come through the vllm_specext front door.
    """

    def __init__(self, vllm_config: Any, runner: Any = None):
        specext = (vllm_config.additional_config or {}).get(ADDITIONAL_CONFIG_KEY)
        if not specext:
            raise RuntimeError(
                "SpecExtProposer needs additional_config['vllm_specext']; pass "
                "speculative_config={'method': <vllm_specext method>, ...} with the "
                "vllm_specext plugin installed")
        self.config = dict(specext)
        self.method = self.config["method"]
        self.proposer = build_proposer(**self.config)
        self.k = self.proposer.num_speculative_tokens
        self.max_model_len = vllm_config.model_config.max_model_len
        self.runner = runner
        self.is_drafting_rank = _is_drafting_rank()
        self._error_logged = False
        self.num_errors = 0  # proposer failures absorbed so far
        self._fault = os.environ.get(FAULT_ENV) or None
        self.controller = (DraftLengthController(self.k, decay=self.config["adaptive_decay"])
                           if self.config.get("adaptive", True) else None)
        self.fixed_threshold = self.config.get("adaptive_threshold")
        self.cost_model = StepCostModel(margin=self.config.get("adaptive_margin", 1.0),
                                        verified_scale=self.config.get(
                                            "adaptive_verified_scale", 3))
        self._step: tuple[float, int, bool] | None = None  # (start, tokens, drafted)
        self._waiting: int | None = None  # requests waiting when this step was scheduled
        self.drain_aware = self.config.get("adaptive_drain", False)
        #: per-step decisions, when ``VLLM_SPECEXT_DECISION_LOG`` is set (drafting rank only)
        self.decision_log = DecisionLog.from_env(self.method) if self.is_drafting_rank else None
        self._initial_keys = {name: set(d) for name, d in self._tables().items()}  # debug_state

    # ------------------------------------------------------------- runner hooks
    def bind_runner(self, runner: Any) -> None:
        """Give the drafter access to the model runner (request ids, prompt lengths)."""
        self.runner = runner

    def on_verified(self, step: Any) -> None:
        """Verify-hook listener: pass the target's tokens at the draft positions of each
        request to the proposer (:meth:`Proposer.observe_targets`)."""
        if not self.is_drafting_rank or step.req_ids is None:
            return
        drafts = step.draft_token_ids.tolist()
        targets = step.target_token_ids.tolist()
        start = 0
        for rid, n in zip(step.req_ids, step.num_draft_tokens):
            if n and rid in self.proposer.tokens:
                self.proposer.observe_targets(rid, drafts[start:start + n],
                                              targets[start:start + n])
            start += n

    def on_step_start(self, scheduler_output: Any) -> None:
        """Called when the runner starts a step: release finished requests' state and,
        when every scheduled request decodes (1 token plus its drafts), start timing the
        step for the cost model.

        Steps with a prefill chunk are not timed: they follow another cost curve (a
        2,400-token batch-8 prefill took 1.3 s, ~0.5 ms per token, against ~1 ms per extra
        decode token), and one of them outweighed a hundred decode steps in the fit,
        misplacing ``b`` and ``c`` until speculation stopped for whole batches.
        """
        for rid in scheduler_output.finished_req_ids:
            self._stop(rid, finished=True)
        self._waiting = waiting_requests(scheduler_output)
        tokens = getattr(scheduler_output, "total_num_scheduled_tokens", 0)
        drafts = getattr(scheduler_output, "scheduled_spec_decode_tokens", None) or {}
        per_request = getattr(scheduler_output, "num_scheduled_tokens", None) or {}
        decoding = all(n == 1 + len(drafts.get(rid, ())) for rid, n in per_request.items())
        self._step = ((time.perf_counter(), tokens, bool(drafts), len(per_request))
                      if tokens and decoding else None)

    def _stop(self, req_id: str, finished: bool) -> None:
        self.proposer.stop_request(req_id, finished=finished)
        if self.controller is not None:
            self.controller.forget(req_id)

    def _tables(self) -> dict[str, dict]:
        """Every dict attribute of the proposer and the adaptive controller."""
        return {f"{owner}.{name}": value
                for owner, obj in (("proposer", self.proposer), ("controller", self.controller))
                if obj is not None for name, value in vars(obj).items()
                if isinstance(value, dict)}

    def debug_state(self) -> dict[str, Any]:
        """Debug hook for leak tests (via ``collective_rpc("specext_debug_state")``).

        Returns:
            ``{"method", "num_errors", "active_requests": sorted ids the proposer tracks,
            "state_bytes": the proposer's ``state_nbytes()``, "tables":
            {"<owner>.<attribute>": entries} for every dict attribute of the proposer and
            the adaptive controller, "request_keys": entries of those dicts added since
            construction (per-request state; fixed keys such as counters' names
            excluded), "requests_waiting": the scheduler's queue at the last step
            (:mod:`~vllm_specext.integration.queue_signal`; None: not known)}``; with no
            request in flight ``active_requests`` and ``request_keys`` must be empty / 0.
        """
        tables = self._tables()
        return {"method": self.method, "num_errors": self.num_errors,
                "active_requests": sorted(self.proposer.active_requests),
                "state_bytes": self.proposer.state_nbytes(),
                "tables": {name: len(d) for name, d in tables.items()},
                "request_keys": sum(len(d.keys() - self._initial_keys.get(name, set()))
                                    for name, d in tables.items()),
                "requests_waiting": self._waiting}

    def mark_log(self, label: str) -> None:
        """Write a mark into the decision log, if one is kept (via
        ``collective_rpc("specext_mark_log", args=(label,))``)."""
        if self.decision_log is not None:
            self.decision_log.mark(label)

    # vLLM calls these on drafters.
    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """No weights to load (called unconditionally by the CPU runner, after the target's
        weights). Runs a throwaway copy of the proposer once so that its compiled kernels
        are loaded before the first request instead of during it (up to ~1.2 s of a first
        step), then freezes the worker's start-up heap with vLLM's ``freeze_gc_heap``: the
        drafter allocates per step, and each full garbage collection of an unfrozen worker
        heap stalled a step by ~415 ms on CPU."""
        from vllm.utils.gc_utils import freeze_gc_heap

        try:
            warm_up(build_proposer(**self.config))
        except Exception:  # a warm-up failure must not stop the engine from serving
            logger.exception("vllm_specext %s proposer warm-up failed", self.method)
        freeze_gc_heap()

    def dummy_run(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to warm up."""

    # ------------------------------------------------------------- drafting
    def propose(self, *args: Any, **kwargs: Any) -> list[list[int]]:
        """Draft tokens for every row of the persistent batch.

        Accepts vLLM's ``custom_class`` call ``(sampled_token_ids, num_tokens_no_spec,
        token_ids_cpu, slot_mappings=None)`` and the n-gram-style calls of vLLM and
        vllm-ascend that also pass the scheduler's draft budget, first or as
        ``num_speculative_tokens=``; any argument may be given by name.

        Args:
            num_speculative_tokens: optional int, the step's draft budget
                (``num_spec_tokens_to_schedule``; <= k under dynamic K); drafts are capped
                to it.
            sampled_token_ids: ``list[list[int]]``, tokens committed this step per row
                (``[]`` for rows that did not decode, e.g. partial prefill).
            num_tokens_no_spec: int32 ``(max_num_reqs,)`` committed length per row.
            token_ids_cpu: int32 ``(max_num_reqs, max_model_len)`` token history per row.
            slot_mappings: ignored.

        Returns:
            ``list[list[int]]`` with one list per row, each 0..min(k, budget) tokens.

        Raises:
            TypeError: a call matching neither shape.
        """
        budget = kwargs.pop("num_speculative_tokens", None)
        if budget is None and args and isinstance(args[0], (int, np.integer)):
            budget, args = args[0], args[1:]
        budget = self.k if budget is None else min(self.k, int(budget))
        sampled, num_tokens, token_ids = _draft_inputs(*args, **kwargs)
        num_rows = len(sampled)
        if not self.is_drafting_rank or self.runner is None:
            return [[] for _ in range(num_rows)]
        req_ids = self.runner.input_batch.req_ids[:num_rows]
        timed = None
        if self._step is not None:  # the step that just ran: model time vs tokens
            start, tokens, drafted, rows = self._step
            seconds = time.perf_counter() - start
            self.cost_model.observe(tokens, seconds, drafted, rows)
            if self.decision_log is not None:
                timed = [tokens, round(1e3 * seconds, 3), drafted]
            self._step = None
        try:
            left = self._budgets_left(req_ids, num_tokens)
            caps = [min(c, budget) if n is None else min(c, budget, n)
                    for c, n in zip(self._sync(req_ids, sampled, num_tokens, token_ids), left)]
            if self._fault and any(self._fault in (rid or "") for rid in req_ids):
                raise RuntimeError(f"{FAULT_ENV}={self._fault!r}: injected proposer failure")
            rows = sum(1 for new in sampled if len(new))  # requests decoding this step
            if self.controller is not None:  # long-withheld requests only probe
                caps = [c if c > 0 and self.controller.proposes(rid) else 0
                        for rid, c in zip(req_ids, caps)]
            drafts = self.proposer.propose(req_ids, caps)
            logged = self._decision_fields(sampled, drafts, rows, timed)
            if self.controller is None:
                shown = drafts
            else:
                draining = (self.drain_aware and self._waiting == 0 and rows == num_rows
                            and None not in left)
                shown = shown_drafts(self.controller, self.cost_model, req_ids, drafts,
                                     self.proposer.last_kinds or [0] * num_rows, rows,
                                     self.fixed_threshold, left if draining else None)
            if logged is not None:
                self.decision_log.write(**logged, shown=sum(map(len, shown)),
                                        shown_rows=sum(1 for d in shown if d))
            return shown
        except Exception as err:  # never take the engine down: no drafts this step
            self.num_errors += 1
            record_proposer_error()
            if not self._error_logged:
                logger.exception("vllm_specext %s proposer failed (requests %s): %s; this step "
                                 "gets no drafts and the requests are resynced (logged once; "
                                 "counted in vllm_specext_proposer_errors_total)", self.method,
                                 list(req_ids), err)
                self._error_logged = True
            for rid in req_ids:
                self._stop(rid, finished=False)
            return [[] for _ in range(num_rows)]

    def _decision_fields(self, sampled: Sequence[Sequence[int]], drafts: list[list[int]],
                         rows: int, timed: list | None) -> dict[str, Any] | None:
        """The fields of a decision-log line known before the adaptive rule decides
        (:mod:`~vllm_specext.integration.decision_log`); None when no log is kept."""
        if self.decision_log is None:
            return None
        offered = sum(map(len, drafts))
        model = self.cost_model
        threshold = (0.0 if self.controller is None else self.fixed_threshold
                     if self.fixed_threshold is not None else model.threshold(rows, offered))
        return {"rows": rows, "batch": len(sampled), "committed": sum(map(len, sampled)),
                "timed": timed, "offered": offered,
                "offered_rows": sum(1 for d in drafts if d), "threshold": round(threshold, 4),
                "plain_ms": round(1e3 * model.step_time(rows), 3),
                "exploring": model.exploring}

    def _budgets_left(self, req_ids: Sequence[str], num_tokens: np.ndarray) -> list[int | None]:
        """Draft tokens each row's request can still use: its ``max_tokens`` minus the
        output it has, minus the bonus token every step emits (>= 0; vLLM schedules drafts
        past ``max_tokens`` and drops what they add). None where the runner keeps no
        ``max_tokens`` for it, or where vLLM set it to fill the model length (a budget no
        one chose, which the ``max_model_len`` cap already covers)."""
        requests = getattr(self.runner, "requests", None) or {}
        rows = len(req_ids)
        prompt_lens = self.runner.input_batch.num_prompt_tokens[:rows].tolist()
        lengths = num_tokens[:rows].tolist()
        left = []
        for rid, prompt_len, length in zip(req_ids, prompt_lens, lengths):
            params = getattr(requests.get(rid), "sampling_params", None)
            max_tokens = getattr(params, "max_tokens", None)
            if max_tokens is None or prompt_len + max_tokens >= self.max_model_len:
                left.append(None)
            else:
                left.append(max(0, int(max_tokens) - (length - prompt_len) - 1))
        return left

    def _sync(self, req_ids: Sequence[str], sampled: Sequence[Sequence[int]],
              num_tokens: np.ndarray, token_ids: np.ndarray) -> list[int]:
        """Bring the core proposer in line with the batch; returns per-row draft caps."""
        rows = len(req_ids)
        prompt_lens = self.runner.input_batch.num_prompt_tokens[:rows].tolist()
        p, controller, buffers = self.proposer, self.controller, self.proposer.tokens
        caps = []
        for i, (rid, n, new) in enumerate(zip(req_ids, num_tokens[:rows].tolist(), sampled)):
            buf = buffers.get(rid)
            if buf is not None and len(buf) + len(new) == n:
                p.update(rid, new)
                if controller is not None:
                    controller.observe(rid, new)
            elif buf is None or len(buf) != n:
                # first sight, or lengths disagree (preempted/resumed, id reuse): resync
                n_prompt = min(prompt_lens[i], n)
                if controller is not None:  # its pending drafts follow other tokens
                    controller.forget(rid)
                p.start_request(rid, token_ids[i, :n_prompt])
                p.update(rid, token_ids[i, n_prompt:n])
            # a row that did not decode (partial prefill) gets no draft
            caps.append(min(self.k, self.max_model_len - n - 1) if new else 0)
        return caps
