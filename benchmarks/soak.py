"""Loopback soak: ``vllm-specext serve`` without and with speculation under concurrent load.

For each configuration (``none``, then the method) a fresh server on 127.0.0.1 (fp32,
default model) takes ``--clients`` concurrent clients for ``--duration`` seconds. Each
client loops: pick a prompt of the pool (12 chats of :mod:`workloads`: code editing,
summarization, open chat) and a mode: non-streamed (45%), streamed (35%) or aborted (20%:
streamed, connection closed after 1-5 SSE events, a client disconnect). Every request is
greedy with return_token_ids. New requests stop at the deadline; in-flight ones finish.

Reported per configuration: requests (completed, aborted), errors (non-2xx answers and
client exceptions other than our own disconnects), RSS of the server's process tree
(psutil) after warm-up, every 15 s and at the end (per process too), the proposer's
state bytes at the end (via ``/collective_rpc``; the servers run with
``VLLM_SERVER_DEV_MODE=1``), p50/p99 latency of completed requests (seconds, end to
end), output tokens/s, preemptions, drafts/accepted tokens and absorbed proposer errors
from ``/metrics``. Greedy check: the no-speculation server's warm-up answers
(each prompt once) are the reference; every completed response (both servers, streamed
or not) must have their token ids, and every aborted one must be a prefix of them.

Usage (writes JSON; exit status 1 on any error or mismatch)::

    python benchmarks/soak.py [--method suffix] [-k 8] [--clients 64] [--duration 150]
        [--out benchmarks/results/soak.json]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

from serve_helpers import (  # noqa: E402
    Server, achat, chat_body, debug_state, metrics, process_tree_rss)
from workloads import WORKLOADS  # noqa: E402

RESULTS = HERE / "results"
RSS_EVERY_S = 15
MODES = (("plain", 0.45), ("stream", 0.35), ("abort", 0.20))
METRICS = {"preemptions": "vllm:num_preemptions_total",
           "drafts": "vllm:spec_decode_num_drafts_total",
           "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
           "accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total",
           "proposer_errors": "vllm_specext_proposer_errors_total"}


def pool_bodies() -> list[dict]:
    """The soak's 12 greedy chat requests (fixed max_tokens per prompt)."""
    chats = ([(c, 64) for c in WORKLOADS["code_editing"][:4]]
             + [(c, 64) for c in WORKLOADS["summarization"][:4]]
             + [(c, 48) for c in WORKLOADS["open_chat"][:4]])
    return [chat_body(c[0]["content"], max_tokens=m) for c, m in chats]


async def soak(base: str, bodies: list[dict], clients: int, duration: float,
               seed: int = 0, request_timeout: float = 600) -> list[dict]:
    """Drive the server; one record per request.

    Returns:
        ``[{"prompt": index, "mode", "status", "text", "token_ids", "finish_reason",
        "aborted", "latency_s", "error": str | None}]``.
    """
    import aiohttp

    deadline = time.monotonic() + duration
    names, weights = zip(*MODES)
    records: list[dict] = []
    tmo = aiohttp.ClientTimeout(total=request_timeout)
    # A new connection per request: reusing a pooled one races the server's keep-alive
    # close (VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s) into a client-side ServerDisconnectedError.
    conn = aiohttp.TCPConnector(limit=clients + 4, force_close=True)
    async with aiohttp.ClientSession(timeout=tmo, connector=conn) as session:
        async def client(cid: int) -> None:
            rng = random.Random(seed * 100_003 + cid)
            while time.monotonic() < deadline:
                i = rng.randrange(len(bodies))
                mode = rng.choices(names, weights)[0]
                rec: dict[str, Any] = {"prompt": i, "mode": mode, "error": None}
                try:
                    rec.update(await achat(session, base, bodies[i], stream=mode != "plain",
                                           abort_after=rng.randint(1, 5)
                                           if mode == "abort" else None))
                except Exception as err:  # noqa: BLE001 - every failure is a finding
                    rec.update(status=0, text="", token_ids=[], finish_reason=None,
                               aborted=False, latency_s=None,
                               error=f"{type(err).__name__}: {err!r}")
                records.append(rec)

        await asyncio.gather(*(client(c) for c in range(clients)))
    return records


def check(records: list[dict], reference: dict[int, list[int]]) -> list[str]:
    """Greedy check against ``reference`` (prompt index -> token ids); the mismatches."""
    bad = []
    for r in records:
        if r["status"] != 200 or r["error"]:
            continue
        want, got = reference.get(r["prompt"]), r["token_ids"]
        if want is None:
            continue
        if r["aborted"] and got != want[:len(got)]:
            bad.append(f"prompt {r['prompt']} ({r['mode']}): aborted output is not a prefix")
        elif not r["aborted"] and got != want:
            bad.append(f"prompt {r['prompt']} ({r['mode']}): {len(got)} tokens differ "
                       f"from the reference ({len(want)})")
    return bad


def summarize(records: list[dict], seconds: float) -> dict[str, Any]:
    """Counts, errors and latency percentiles of one soak."""
    done = [r for r in records if r["status"] == 200 and not r["error"] and not r["aborted"]]
    errors = [r for r in records if r["status"] != 200 or r["error"]]
    lat = sorted(r["latency_s"] for r in done)

    def pct(p: float) -> float | None:
        return lat[min(len(lat) - 1, int(p * len(lat)))] if lat else None

    return {"requests": len(records), "completed": len(done),
            "aborted": sum(r["aborted"] for r in records), "errors": len(errors),
            "error_samples": sorted({(r["error"] or r["text"])[:300] for r in errors})[:5],
            "latency_p50_s": pct(0.50), "latency_p99_s": pct(0.99),
            "latency_mean_s": statistics.fmean(lat) if lat else None,
            "output_tokens_per_s": sum(len(r["token_ids"]) for r in records) / seconds}


def run_config(server: Server, bodies: list[dict], clients: int, duration: float,
               seed: int = 0) -> dict[str, Any]:
    """Warm up (:func:`warm_up`), then soak a started server.

    Returns:
        :func:`summarize`'s fields plus ``rss_start_mb``, ``rss_end_mb``,
        ``rss_series_mb`` (every :data:`RSS_EVERY_S` s), ``rss_by_process_mb``
        (``{process: [start, end]}``),
        ``proposer_state_mb`` (the drafter's state at the end; needs the server's
        ``VLLM_SERVER_DEV_MODE=1``, else None), ``seconds``,
        the :data:`METRICS` deltas, ``warmup`` (the warm-up records) and ``records``.
    """
    warm = asyncio.run(warm_up(server.base, bodies))
    before = metrics(server.base)

    def rss_mb() -> float:
        return round(sum(process_tree_rss(server.proc.pid).values()) / 2**20, 1)

    start_by = process_tree_rss(server.proc.pid)
    series, done = [round(sum(start_by.values()) / 2**20, 1)], threading.Event()

    def sample() -> None:
        while not done.wait(RSS_EVERY_S):
            series.append(rss_mb())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.perf_counter()
    records = asyncio.run(soak(server.base, bodies, clients, duration, seed))
    seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    after = metrics(server.base)
    out = summarize(records, seconds)
    states = debug_state(server.base) if server.env.get("VLLM_SERVER_DEV_MODE") else [None]
    end = process_tree_rss(server.proc.pid)
    out.update(rss_start_mb=series[0], rss_end_mb=round(sum(end.values()) / 2**20, 1),
               rss_series_mb=series,
               rss_by_process_mb={k: [round(start_by.get(k, 0) / 2**20, 1),
                                      round(v / 2**20, 1)] for k, v in end.items()},
               proposer_state_mb=states[0] and states[0]["state_bytes"] / 2**20,
               seconds=seconds, warmup=warm, records=records,
               **{k: after.get(m, 0.0) - before.get(m, 0.0) for k, m in METRICS.items()})
    return out


async def warm_up(base: str, bodies: list[dict]) -> list[dict]:
    """Each body once, all at once (warm-up; the no-speculation server's answers are the
    greedy reference)."""
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        recs = await asyncio.gather(*(achat(session, base, b) for b in bodies))
    return [{"prompt": i, "mode": "plain", "error": None, **r} for i, r in enumerate(recs)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--method", default="suffix")
    ap.add_argument("-k", type=int, default=8)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--duration", type=float, default=150, help="seconds per server")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=RESULTS / "soak.json")
    args = ap.parse_args(argv)
    bodies = pool_bodies()
    configs = {"none": None, args.method: {"method": args.method,
                                           "num_speculative_tokens": args.k}}
    results: dict[str, Any] = {"clients": args.clients, "duration_s": args.duration,
                               "pool": len(bodies), "configs": {}}
    reference: dict[int, list[int]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, spec in configs.items():
            with Server(spec, Path(tmp) / f"{name}.log",
                        env={"VLLM_SERVER_DEV_MODE": "1"}) as server:  # drafter state
                res = run_config(server, bodies, args.clients, args.duration, args.seed)
            if not reference:  # the no-speculation warm-up defines the greedy reference
                reference = {r["prompt"]: r["token_ids"] for r in res["warmup"]
                             if r["status"] == 200}
            res["mismatches"] = check(res["warmup"] + res["records"], reference)
            results["configs"][name] = res
            print(name, json.dumps({k: v for k, v in res.items()
                                    if k not in ("records", "warmup")}, indent=1), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    slim = {**results, "configs": {n: {k: v for k, v in r.items() if k not in ("records", "warmup")}
                                   for n, r in results["configs"].items()}}
    args.out.write_text(json.dumps(slim, indent=1))
    failed = any(r["errors"] or r["mismatches"] for r in results["configs"].values())
    print(f"wrote {args.out}; {'FAILED' if failed else 'ok'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
