"""Offline generation with a vllm_specext method through vLLM's own `LLM()` API.

    python examples/offline_llm.py [examples/configs/memory_decoding.json]

With no argument it uses examples/configs/ngram.json.

The plugin is found through the `vllm.general_plugins` entry point: nothing to import.
"""
import json
import os
import sys

from vllm import LLM, SamplingParams

from vllm_specext.model import default_model_path

if __name__ == "__main__":  # vLLM spawns workers: the guard is required
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(__file__), "configs", "ngram.json")
    with open(path) as f:
        spec = json.load(f)
    llm = LLM(model=str(default_model_path()), dtype="float32", enforce_eager=True,
              max_model_len=4096, speculative_config=spec, disable_log_stats=False)
    chat = [{"role": "user", "content": "Repeat exactly: to be or not to be, that is the question."}]
    out = llm.chat(chat, SamplingParams(temperature=0, max_tokens=64))
    print(out[0].outputs[0].text)
    metrics = {m.name: getattr(m, "value", None) for m in llm.get_metrics()}
    drafts = metrics.get("vllm:spec_decode_num_drafts") or 0
    accepted = metrics.get("vllm:spec_decode_num_accepted_tokens") or 0
    print(f"mean acceptance length: {1 + accepted / drafts if drafts else 1.0:.2f}")
