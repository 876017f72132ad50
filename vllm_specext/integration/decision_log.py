"""A per-step log of the adaptive decisions of the drafting worker, for debugging.

Set ``VLLM_SPECEXT_DECISION_LOG=<prefix>`` before the engine starts and every drafting
worker appends one JSON object per engine step to ``<prefix>.<method>.<pid>.jsonl``
(one file per engine, so several engines may share a prefix). Off by default: one line
costs a few microseconds. ``python benchmarks/decision_log.py <prefix>*.jsonl`` sums a log up.

``collective_rpc("specext_mark_log", args=(label,))`` appends ``{"mark": label, "time":
t}`` (the e2e benchmark marks each warm-up and cell this way). A step's line, written
when vLLM asks for the next step's drafts:

* ``step``: count of ``propose`` calls of this worker; ``time``: when the line was written
  (Unix seconds, to line up several engines' logs); ``rows``: requests that decoded
  in the step that just ran (the batch's rows, of which ``batch`` exist);
* ``committed``: tokens those rows committed (``committed - rows`` of them were
  accepted draft tokens);
* ``timed``: that step as the cost model saw it, ``[tokens, milliseconds, verified]``,
  or null when it was not timed (a prefill chunk in it, or the first step);
* ``offered`` / ``offered_rows``: draft tokens the proposer made for the next step and
  the rows with one; ``shown`` / ``shown_rows``: what the adaptive rule let through
  (everything offered with ``"adaptive": false``);
* ``threshold``: the emission probability a draft token had to beat
  (:meth:`~vllm_specext.adaptive.StepCostModel.threshold`, ``adaptive_threshold`` when
  set, 0 with ``"adaptive": false``), ``plain_ms``: the modelled
  plain step time ``P(rows)``, ``exploring``: whether the cost model wanted a verified
  step measured (:attr:`~vllm_specext.adaptive.StepCostModel.exploring`).
"""
from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

logger = logging.getLogger(__name__)

#: Environment variable naming the log files' prefix (unset: no log).
DECISION_LOG_ENV = "VLLM_SPECEXT_DECISION_LOG"


class DecisionLog:
    """Append-only JSON-lines writer of one worker's decisions.

    Args:
        path: the file to append to (created with its parent folders).
    """

    def __init__(self, path: str):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.path = path
        self._file = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
        self._step = 0

    @classmethod
    def from_env(cls, method: str) -> DecisionLog | None:
        """The log named by :data:`DECISION_LOG_ENV` for this process; None when the
        variable is unset, or (with a warning naming it) when the file cannot be opened:
        a debugging aid never stops the engine."""
        prefix = os.environ.get(DECISION_LOG_ENV)
        if not prefix:
            return None
        path = f"{prefix}.{method}.{os.getpid()}.jsonl"
        try:
            return cls(path)
        except OSError as err:
            logger.warning("%s=%r: cannot write the decision log %s (%s); no log is kept",
                           DECISION_LOG_ENV, prefix, path, err)
            return None

    def mark(self, label: str) -> None:
        """Append ``{"mark": label, "time": t}``: the steps after it belong to what
        ``label`` names (e.g. a benchmark cell); not counted as a step."""
        self._append({"mark": str(label), "time": round(time.time(), 4)})

    def write(self, **fields: Any) -> None:
        """Append one line: ``{"step": n, "time": t, **fields}`` (values
        JSON-serialisable). After a failed write (disk full, file gone) it logs a warning
        once and writes nothing more; it never raises ``OSError``."""
        self._step += 1
        self._append({"step": self._step, "time": round(time.time(), 4), **fields})

    def _append(self, record: dict[str, Any]) -> None:
        if self._file is None:
            return
        try:
            self._file.write(json.dumps(record) + "\n")
        except OSError as err:
            logger.warning("decision log %s: write failed (%s); logging stops", self.path,
                           err)
            self._file = None
