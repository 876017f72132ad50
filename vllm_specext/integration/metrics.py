"""``vllm_specext_proposer_errors_total``: proposer exceptions absorbed by the drafter,
exported on vLLM's ``/metrics``.

The drafter runs in a worker process; ``/metrics`` is served by the API-server process
from ``prometheus_client``'s global ``REGISTRY`` (vLLM 0.32,
``vllm/entrypoints/serve/instrumentator/metrics.py``). vLLM moves engine statistics to
the API server only inside its own ``SchedulerStats`` dataclass (no field a plugin can
fill), and prometheus multiprocess mode is on only with ``--api-server-count > 1``. So
the count travels through files:

* the first process that loads the plugin (the API server, or the process that calls
  ``LLM()``) creates a private directory and exports it as ``SPECEXT_METRICS_DIR``
  (a user-set value is kept); the engine-core and worker processes, started later,
  inherit it. The creating process removes the directory at exit;
* a worker that absorbs a proposer exception rewrites its own file
  ``proposer_errors.<pid>`` (the process's running count, atomic rename). Errors are
  rare, so the common path costs nothing;
* a collector registered in ``REGISTRY`` in every process sums the files at scrape
  time, so a restarted worker's count is kept and the counter never goes down.

With ``PROMETHEUS_MULTIPROC_DIR`` set (several API servers) ``/metrics`` reads only
prometheus' multiprocess files, so the worker also increments a ``prometheus_client``
counter, which multiprocess mode writes there.

Offline, ``LLM.get_metrics()`` lists only ``vllm:`` names: read
:func:`proposer_errors_total` (or ``REGISTRY``) instead. A process started by a process
that already loaded the plugin shares its directory (and count) unless
``SPECEXT_METRICS_DIR`` is removed from its environment.
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: not ``VLLM_``-prefixed: vLLM warns at start about every unknown ``VLLM_*`` variable
ENV = "SPECEXT_METRICS_DIR"
NAME = "vllm_specext_proposer_errors"  # exposed as ..._total
HELP = "Proposer exceptions absorbed by vllm_specext's drafter (the step got no drafts)."
_PREFIX = "proposer_errors."

_count = 0  # this process's running count
_prom_counter: Any = None
_installed = False


def install() -> None:
    """Create and export the counter directory (first process only) and register the
    collector in ``prometheus_client.REGISTRY`` (idempotent, cheap)."""
    global _installed
    if _installed:
        return
    if not os.environ.get(ENV):
        path = tempfile.mkdtemp(prefix="vllm_specext_metrics_")
        os.environ[ENV] = path
        owner = os.getpid()
        atexit.register(lambda: os.getpid() == owner and shutil.rmtree(path, True))
    from prometheus_client import REGISTRY

    REGISTRY.register(_Collector())
    _installed = True


def record_proposer_error() -> None:
    """Count one absorbed proposer exception in this process (worker side). Never
    raises for a missing or unwritable directory (it runs inside the drafter's error
    path): the count then stays in this process."""
    global _count, _prom_counter
    _count += 1
    path = os.environ.get(ENV)
    if path and os.path.isdir(path):
        tmp = os.path.join(path, f".{_PREFIX}{os.getpid()}")
        try:
            with open(tmp, "w") as f:
                f.write(str(_count))
            os.replace(tmp, os.path.join(path, f"{_PREFIX}{os.getpid()}"))
        except OSError:
            pass
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import Counter

        if _prom_counter is None:
            _prom_counter = Counter(NAME, HELP, registry=None)
        _prom_counter.inc()


def proposer_errors_total() -> int:
    """Sum of every process's count in ``$SPECEXT_METRICS_DIR`` (0 when unset)."""
    path = os.environ.get(ENV)
    if not path or not os.path.isdir(path):
        return 0
    total = 0
    for f in Path(path).glob(f"{_PREFIX}*"):
        try:
            total += int(f.read_text() or 0)
        except (OSError, ValueError):  # vanished or being replaced: next scrape has it
            continue
    return total


class _Collector:
    """Prometheus collector yielding the counter from the files at scrape time."""

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily

        yield CounterMetricFamily(NAME, HELP, value=proposer_errors_total())
