"""Unit test of the scheduler's queue riding on its output to the drafter. The engine
path is covered by tests/test_engine_lifecycle.py (the drafter's ``requests_waiting``)."""
from __future__ import annotations

import pickle
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")

from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402

from vllm_specext.integration.queue_signal import patch_scheduler, waiting_requests  # noqa: E402


class _Output:  # stands in for SchedulerOutput, a plain dataclass (pickled to workers)
    pass


def test_schedule_output_carries_the_waiting_count(monkeypatch):
    monkeypatch.setattr(Scheduler, "schedule", lambda self: _Output())
    patch_scheduler()
    patch_scheduler()  # idempotent
    scheduler = SimpleNamespace(get_request_counts=lambda: (8, 3))
    out = Scheduler.schedule(scheduler)
    assert waiting_requests(out) == 3
    assert waiting_requests(pickle.loads(pickle.dumps(out))) == 3
    assert waiting_requests(_Output()) is None  # not patched: unknown
