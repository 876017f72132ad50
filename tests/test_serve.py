"""`vllm-specext serve` (the `vllm serve` passthrough) with speculation on: the OpenAI
chat endpoint answers plain and streamed requests, /metrics shows our drafts, and
SIGTERM stops the server cleanly."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

pytestmark = pytest.mark.engine


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict) -> urllib.request.Request:
    return urllib.request.Request(url, data=json.dumps(body).encode(),
                                  headers={"Content-Type": "application/json"})


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = _free_port()
    log = tmp_path_factory.mktemp("serve") / "server.log"
    spec = json.dumps({"method": "ngram", "num_speculative_tokens": 8})
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vllm_specext.cli", "serve", "--host", "127.0.0.1",
             "--port", str(port), "--dtype", "float32", "--enforce-eager",
             "--max-model-len", "2048", "--served-model-name", "smollm2",
             "--speculative-config", spec],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ},
            start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 300
    while time.time() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"server exited early:\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            time.sleep(1)
    else:
        proc.kill()
        pytest.fail(f"server did not become healthy:\n{log.read_text()[-4000:]}")
    yield base, proc
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


MESSAGES = [{"role": "user", "content": "Repeat exactly: red green blue red green blue red "
             "green blue red green blue"}]


def test_chat_plain_and_streamed(server):
    base, _ = server
    body = {"model": "smollm2", "messages": MESSAGES, "max_tokens": 48, "temperature": 0}
    with urllib.request.urlopen(_post(base + "/v1/chat/completions", body), timeout=120) as r:
        plain = json.load(r)["choices"][0]["message"]["content"]
    assert plain
    chunks = []
    with urllib.request.urlopen(_post(base + "/v1/chat/completions", {**body, "stream": True}),
                                timeout=120) as r:
        for raw in r:
            line = raw.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                delta = json.loads(line[6:])["choices"][0]["delta"]
                chunks.append(delta.get("content") or "")
    assert "".join(chunks) == plain

    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
        metrics = r.read().decode()
    drafts = [line for line in metrics.splitlines()
              if line.startswith("vllm:spec_decode_num_draft_tokens_total")]
    assert drafts and float(drafts[0].split()[-1]) > 0


def test_sigterm_stops_cleanly(server):
    _, proc = server
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=60) is not None
    deadline = time.time() + 30
    while time.time() < deadline:  # engine and worker processes exit too
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.5)
    subprocess.run(["ps", "-o", "pid,cmd", "-g", str(proc.pid)])
    pytest.fail("processes of the server's group outlived SIGTERM by 30 s")
