"""`vllm-specext serve` (the `vllm serve` passthrough) with speculation on: the OpenAI
chat endpoint answers plain and streamed requests, /metrics shows our drafts, and
SIGTERM stops the server cleanly."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from serve_helpers import Server, chat, chat_body, metrics, stream_chat, streamed_text

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    spec = {"method": "ngram", "num_speculative_tokens": 8}
    with Server(spec, tmp_path_factory.mktemp("serve") / "server.log") as s:
        yield s


BODY = chat_body("Repeat exactly: red green blue red green blue red green blue red green blue",
                 max_tokens=48)


def test_chat_plain_and_streamed(server):
    plain = chat(server.base, BODY, timeout=120)["choices"][0]["message"]["content"]
    assert plain
    assert streamed_text(stream_chat(server.base, BODY, timeout=120)) == plain
    assert metrics(server.base)["vllm:spec_decode_num_draft_tokens_total"] > 0


def test_sigterm_stops_cleanly(server):
    proc = server.proc
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


def test_an_invalid_speculative_config_is_a_one_line_error():
    """Refused in the API server process before any engine starts: status 2 and one
    ``error:`` line naming the key and its range, no traceback."""
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_specext.cli", "serve", "--speculative-config",
         '{"method": "ngram", "prompt_lookup_min": 0}'],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert ("vllm-specext serve: error: --speculative-config: invalid speculative_config for "
            "method 'ngram': 'prompt_lookup_min'") in proc.stderr
    assert "allowed: int in [1, 64]" in proc.stderr and "Traceback" not in proc.stderr
