"""Tell the drafter whether requests are waiting: the scheduler's queue rides on its output.

What an accepted draft token is worth depends on the queue (:func:`vllm_specext.adaptive.
shown_drafts`, ``remaining``; used with ``adaptive_drain``): with requests waiting, a
request that finishes sooner frees its slot for the next one, so every accepted token adds
throughput; with none waiting the engine drains a finite set of requests (``LLM.generate``
on a list, the tail of any batch), whose time is set by the last of them to finish. The
worker does not see the queue, so :func:`patch_scheduler` sets :data:`WAITING_ATTR` on
each ``SchedulerOutput`` (the object handed to the model runner, or pickled to it with its
attributes under multiprocessing); :func:`waiting_requests` reads it back, None where it
is missing (a scheduler this patch does not know).
"""
from __future__ import annotations

import functools
from typing import Any

#: Attribute of ``SchedulerOutput``: requests waiting to be scheduled after this step.
WAITING_ATTR = "specext_num_waiting"


def waiting_requests(scheduler_output: Any) -> int | None:
    """Requests that were still waiting when ``scheduler_output`` was scheduled (None:
    not known)."""
    return getattr(scheduler_output, WAITING_ATTR, None)


def patch_scheduler() -> None:
    """Wrap ``Scheduler.schedule`` once (idempotent) so that its output carries the
    number of waiting requests (``get_request_counts()[1]``, or ``len(waiting)`` where
    that method is missing)."""
    from vllm.v1.core.sched.scheduler import Scheduler

    schedule = Scheduler.schedule
    if getattr(schedule, "_specext_wrapped", False):
        return

    @functools.wraps(schedule)
    def _schedule(self, *args, **kwargs):
        out = schedule(self, *args, **kwargs)
        counts = getattr(self, "get_request_counts", None)
        try:
            waiting = counts()[1] if counts is not None else len(self.waiting)
            setattr(out, WAITING_ATTR, int(waiting))
        except (AttributeError, TypeError):  # an output or scheduler of another shape
            pass
        return out

    _schedule._specext_wrapped = True
    Scheduler.schedule = _schedule
