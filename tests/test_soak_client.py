"""The soak driver's bookkeeping without a server: a request that fails in the client
(here: connection refused) is a counted error whose record has every field, so that
``summarize`` reports it instead of failing on a missing key (CI, stop 22)."""
from __future__ import annotations

import asyncio

from conftest import load_benchmark

soak = load_benchmark("soak")


def test_client_failures_are_counted_errors():
    bodies = soak.pool_bodies()[:2]
    records = asyncio.run(soak.soak("http://127.0.0.1:9", bodies, clients=2, duration=0.3))
    assert records and all(r["status"] == 0 and r["error"] for r in records)
    out = soak.summarize(records, 0.3)
    assert (out["errors"], out["completed"], out["aborted"]) == (len(records), 0, 0)
    assert out["latency_p50_s"] is None and out["output_tokens_per_s"] == 0
    assert "ClientConnectorError" in out["error_samples"][0]
