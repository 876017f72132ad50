"""Helpers for tests and benchmarks that talk to a real ``vllm-specext serve`` on loopback.

:class:`Server` starts the server on the default model (fp32, eager, a free port on
127.0.0.1) in its own process group, waits for ``/health`` and stops the whole group on
exit. The request helpers speak the OpenAI chat API with vLLM's extras
(``return_token_ids``, ``stop_token_ids``, ``min_tokens``, ...).
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from vllm_specext.integration.metrics import ENV as metrics_env

MODEL_NAME = "smollm2"  # --served-model-name


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One ``vllm-specext serve`` process (group) on 127.0.0.1.

    Args:
        spec: the ``--speculative-config`` dict, or None for no speculation.
        log_path: file that receives the server's stdout and stderr.
        args: extra ``vllm serve`` flags.
        env: extra environment variables for the server.
        max_model_len: ``--max-model-len``.
    """

    def __init__(self, spec: dict | None, log_path: str | Path, args: tuple[str, ...] = (),
                 env: dict[str, str] | None = None, max_model_len: int = 2048):
        self.spec = spec
        self.log_path = Path(log_path)
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.cmd = [sys.executable, "-m", "vllm_specext.cli", "serve", "--host", "127.0.0.1",
                    "--port", str(self.port), "--dtype", "float32", "--enforce-eager",
                    "--max-model-len", str(max_model_len), "--served-model-name", MODEL_NAME,
                    *(["--speculative-config", json.dumps(spec)] if spec else []), *args]
        inherited = {k: v for k, v in os.environ.items() if k != metrics_env}
        self.env = {**inherited, **(env or {})}  # a fresh proposer-error counter
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 300) -> Server:
        """Start and wait until ``/health`` answers 200.

        Raises:
            RuntimeError: the server exited or was not healthy within ``timeout`` seconds
                (the message carries the tail of its log).
        """
        with open(self.log_path, "w") as out:
            self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT,
                                         env=self.env, start_new_session=True)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.log()[-4000:]}")
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(1)
        self.stop()
        raise RuntimeError(f"server not healthy after {timeout} s:\n{self.log()[-4000:]}")

    def stop(self, timeout: float = 60) -> None:
        """SIGTERM the process group; SIGKILL it if it outlives ``timeout`` seconds."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


# ------------------------------------------------------------------ plain requests
def post(base: str, path: str, body: dict, timeout: float = 300,
         headers: dict[str, str] | None = None) -> dict:
    """POST JSON, return the decoded JSON answer.

    Raises:
        urllib.error.HTTPError: non-2xx answer (its body is in ``err.read()``).
    """
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


def chat_body(content: str, **params: Any) -> dict:
    """A greedy chat request for one user message; ``params`` override the defaults."""
    return {"model": MODEL_NAME, "messages": [{"role": "user", "content": content}],
            "temperature": 0, "max_tokens": 64, "return_token_ids": True, **params}


def chat(base: str, body: dict, **kw: Any) -> dict:
    """``POST /v1/chat/completions``."""
    return post(base, "/v1/chat/completions", body, **kw)


def stream_chat(base: str, body: dict, timeout: float = 300) -> list[dict]:
    """Streamed chat: the decoded SSE ``data:`` events before ``[DONE]``, in order."""
    req = urllib.request.Request(base + "/v1/chat/completions",
                                 data=json.dumps({**body, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    events = []
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for raw in r:
            line = raw.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    return events


def streamed_text(events: list[dict], index: int = 0) -> str:
    """Concatenated ``delta.content`` of choice ``index`` over SSE events."""
    return "".join((c["delta"].get("content") or "") for e in events for c in e["choices"]
                   if c["index"] == index)


def metrics(base: str) -> dict[str, float]:
    """``/metrics`` as ``{sample name: value}``, summed over label sets."""
    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, value = line.rsplit(" ", 1)
        name = name_labels.split("{", 1)[0]
        out[name] = out.get(name, 0.0) + float(value)
    return out


def debug_state(base: str) -> list[dict | None]:
    """Each worker's ``specext_debug_state()`` via ``/collective_rpc`` (the server must run
    with ``VLLM_SERVER_DEV_MODE=1``)."""
    return post(base, "/collective_rpc", {"method": "specext_debug_state"})["results"]


# ------------------------------------------------------------------ concurrent requests
async def achat(session: Any, base: str, body: dict, stream: bool = False,
                abort_after: int | None = None) -> dict:
    """One chat request with ``aiohttp``.

    Args:
        stream: use SSE; the result's ``text``/``token_ids`` are the concatenated deltas.
        abort_after: streamed only: close the connection after this many SSE events
            (a client disconnect); the result then has ``aborted=True``.

    Returns:
        ``{"status", "text", "token_ids", "finish_reason", "aborted", "latency_s"}`` (and
        ``prompt_token_ids`` when not streamed);
        ``status`` is the HTTP status (``text`` holds the error body when not 200).
    """
    start = time.perf_counter()
    res = {"status": 0, "text": "", "token_ids": [], "finish_reason": None, "aborted": False}
    async with session.post(base + "/v1/chat/completions",
                            json={**body, "stream": stream}) as r:
        res["status"] = r.status
        if r.status != 200:
            res["text"] = await r.text()
        elif not stream:
            answer = await r.json()
            choice = answer["choices"][0]
            res.update(text=choice["message"]["content"], token_ids=choice.get("token_ids"),
                       finish_reason=choice["finish_reason"],
                       prompt_token_ids=answer.get("prompt_token_ids"))
        else:
            n = 0
            async for raw in r.content:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                n += 1
                for c in json.loads(line[6:])["choices"]:
                    res["text"] += c["delta"].get("content") or ""
                    res["token_ids"] += c.get("token_ids") or []
                    res["finish_reason"] = c.get("finish_reason") or res["finish_reason"]
                if abort_after is not None and n >= abort_after:
                    res["aborted"] = True
                    r.close()  # drop the connection mid-stream
                    break
    res["latency_s"] = time.perf_counter() - start
    return res


def wait_idle_state(base: str, timeout: float = 30) -> list[dict | None]:
    """Poll :func:`debug_state` until no worker's proposer tracks a request (vLLM tells
    the runner about finished requests one engine step later); the last states."""
    deadline = time.time() + timeout
    while True:
        states = debug_state(base)
        if all(s is None or (not s["active_requests"] and not s["request_keys"])
               for s in states) or time.time() > deadline:
            return states
        time.sleep(0.5)


def process_tree_rss(pid: int) -> dict[str, int]:
    """Resident set size in bytes of ``pid`` and each of its descendants (psutil), keyed
    ``"<pid> <process name>"`` (vLLM names its processes, e.g. ``VLLM::EngineCore``)."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return {}
    out = {}
    for p in procs:
        try:
            out[f"{p.pid} {p.name()}"] = p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return out
