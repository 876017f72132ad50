"""``vllm_specext_proposer_errors_total``: counts written by other processes (the
workers) are summed by the collector at scrape time, in plain and in prometheus
multiprocess mode (no engine)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from vllm_specext.integration import metrics

prometheus_client = pytest.importorskip("prometheus_client")


def _record_in_child(n: int, env: dict[str, str]) -> None:
    code = ("from vllm_specext.integration.metrics import record_proposer_error\n"
            f"for _ in range({n}): record_proposer_error()\n")
    subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, check=True)


def test_counts_of_worker_processes_are_summed(tmp_path, monkeypatch):
    monkeypatch.setenv(metrics.ENV, str(tmp_path))
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    _record_in_child(2, {})
    _record_in_child(3, {})
    assert metrics.proposer_errors_total() == 5
    registry = prometheus_client.CollectorRegistry()
    registry.register(metrics._Collector())
    assert registry.get_sample_value("vllm_specext_proposer_errors_total") == 5
    text = prometheus_client.generate_latest(registry).decode()
    assert "# TYPE vllm_specext_proposer_errors_total counter" in text


def test_missing_directory_never_raises(tmp_path, monkeypatch):
    monkeypatch.setenv(metrics.ENV, str(tmp_path / "gone"))
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    metrics.record_proposer_error()
    assert metrics.proposer_errors_total() == 0


def test_prometheus_multiprocess_mode(tmp_path):
    """With several API servers vLLM serves only prometheus' multiprocess files."""
    from prometheus_client import multiprocess

    _record_in_child(4, {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), metrics.ENV: ""})
    registry = prometheus_client.CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(tmp_path))
    assert registry.get_sample_value("vllm_specext_proposer_errors_total") == 4
