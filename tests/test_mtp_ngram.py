"""mtp_ngram: config front door, the n-gram extension core, and the real engine on a tiny
MTP model (greedy outputs token-identical to no speculation).

The test model is a tiny MiMo checkpoint (``MiMoForCausalLM``: Qwen2 layers plus one MTP
layer, ``num_nextn_predict_layers=1``) written to a temporary directory with
safetensors. Its weights are random but shaped so that drafts get accepted: ``lm_head``
row ``j`` is the embedding of token ``perm[j]``, so the model mostly continues token
``x`` with ``succ[x]`` (``succ = perm^-1``, a random permutation), and the MTP layer
predicts ``succ`` of its input token; the transformer layers (std 0.1) make the rest of
the steps depend on the context. No tokenizer: prompts are token ids.

Run as a script (``python tests/test_mtp_ngram.py OUT.json`` with a job on stdin) it
runs one engine job; the engine tests start each job in a fresh process.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from vllm_specext.config import SpecExtConfigError, validate_config
from vllm_specext.integration.engine_config import normalise
from vllm_specext.proposers import build_proposer

VOCAB, HIDDEN, HEADS, KV_HEADS, FFN, LAYERS = 4096, 128, 2, 1, 256, 2
LAYER_STD = 0.1


# ---------------------------------------------------------------- tiny MTP model
def successor(seed: int = 0) -> np.ndarray:
    """``succ[x]``: the token the tiny model mostly emits after ``x`` (a permutation)."""
    perm = np.random.default_rng(seed).permutation(VOCAB)
    succ = np.empty(VOCAB, dtype=np.int64)
    succ[perm] = np.arange(VOCAB)
    return succ


def build_tiny_mimo(path: Path, seed: int = 0) -> Path:
    """Write a tiny random MiMo checkpoint (config.json + model.safetensors) to ``path``."""
    import torch
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    hd = HIDDEN // HEADS

    def randn(*shape, std=LAYER_STD):
        return torch.randn(*shape, generator=gen) * std

    def block(prefix):  # one Qwen2 decoder layer, HF initialisation at std LAYER_STD
        return {
            f"{prefix}self_attn.q_proj.weight": randn(HEADS * hd, HIDDEN),
            f"{prefix}self_attn.q_proj.bias": torch.zeros(HEADS * hd),
            f"{prefix}self_attn.k_proj.weight": randn(KV_HEADS * hd, HIDDEN),
            f"{prefix}self_attn.k_proj.bias": torch.zeros(KV_HEADS * hd),
            f"{prefix}self_attn.v_proj.weight": randn(KV_HEADS * hd, HIDDEN),
            f"{prefix}self_attn.v_proj.bias": torch.zeros(KV_HEADS * hd),
            f"{prefix}self_attn.o_proj.weight": randn(HIDDEN, HEADS * hd),
            f"{prefix}mlp.gate_proj.weight": randn(FFN, HIDDEN),
            f"{prefix}mlp.up_proj.weight": randn(FFN, HIDDEN),
            f"{prefix}mlp.down_proj.weight": randn(HIDDEN, FFN),
            f"{prefix}input_layernorm.weight": torch.ones(HIDDEN),
            f"{prefix}post_attention_layernorm.weight": torch.ones(HIDDEN),
        }

    embed = randn(VOCAB, HIDDEN, std=1.0)
    perm = torch.from_numpy(np.argsort(successor(seed)))  # perm[succ[x]] = x
    weights = {"model.embed_tokens.weight": embed, "lm_head.weight": embed[perm].clone(),
               "model.norm.weight": torch.ones(HIDDEN)}
    for i in range(LAYERS):
        weights.update(block(f"model.layers.{i}."))
    mtp = "model.mtp_layers.0."
    weights.update(block(mtp))
    weights[mtp + "input_proj.weight"] = torch.cat(  # [hidden | token embedding] -> token
        [torch.zeros(HIDDEN, HIDDEN), torch.eye(HIDDEN)], dim=1)
    for norm in ("token_layernorm", "hidden_layernorm", "final_layernorm"):
        weights[f"{mtp}{norm}.weight"] = torch.ones(HIDDEN)
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(path / "model.safetensors"),
              metadata={"format": "pt"})
    config = {
        "architectures": ["MiMoForCausalLM"], "model_type": "qwen2",
        "num_nextn_predict_layers": 1, "vocab_size": VOCAB, "hidden_size": HIDDEN,
        "intermediate_size": FFN, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "hidden_act": "silu", "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
        "bos_token_id": 1, "eos_token_id": 2, "dtype": "float32", "use_sliding_window": False,
    }
    (path / "config.json").write_text(json.dumps(config, indent=1))
    return path


def workload(seed: int = 0) -> list[list[int]]:
    """Token-id prompts: two that repeat the model's own path (the continuation is in the
    prompt: n-gram territory), one of random tokens, and one with decoys (bigrams of the
    coming path followed by random tokens: n-gram drafts that get rejected)."""
    succ, rng = successor(seed), np.random.default_rng(seed + 1)

    def path(start, n):
        out = [int(start)]
        while len(out) < n:
            out.append(int(succ[out[-1]]))
        return out

    def noise(n):
        return [int(t) for t in rng.integers(3, VOCAB, n)]

    p1 = path(rng.integers(VOCAB), 40)
    p2 = path(rng.integers(VOCAB), 24)
    p3 = path(rng.integers(VOCAB), 30)
    decoys = [t for i in range(10, 30, 5) for t in p3[i:i + 2] + noise(4)]
    return [p1 + p1[:4], p2 * 2 + p2[:3], noise(30), decoys + p3[:8]]


# ---------------------------------------------------------------- engine job (subprocess)
def run_job(job: dict) -> dict:
    """One ``LLM.generate`` over token-id prompts in this process; vLLM metrics included."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams

    llm = LLM(model=job["model"], dtype="float32", enforce_eager=True, seed=0,
              max_model_len=256, max_num_seqs=8, skip_tokenizer_init=True,
              speculative_config=job.get("spec"), disable_log_stats=False)
    params = SamplingParams(temperature=0.0, max_tokens=job["max_tokens"], ignore_eos=True,
                            detokenize=False)
    outs = llm.generate([{"prompt_token_ids": p} for p in job["prompts"]], params,
                        use_tqdm=False)
    metrics = {}
    for m in llm.get_metrics():
        if m.name.startswith("vllm:spec_decode"):
            metrics[m.name] = getattr(m, "values", None) or getattr(m, "value", 0)
    return {"token_ids": [list(o.outputs[0].token_ids) for o in outs], "metrics": metrics}


def run_in_subprocess(job: dict, timeout: float = 600) -> dict:
    """:func:`run_job` in a fresh Python process (one engine at a time)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
        proc = subprocess.run([sys.executable, __file__, out], input=json.dumps(job), env=env,
                              capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0 or not os.path.exists(out):
            raise RuntimeError(f"engine job failed (exit {proc.returncode}):\n"
                               f"{proc.stderr[-4000:]}\n{proc.stdout[-2000:]}")
        with open(out) as f:
            return json.load(f)


def split_acceptance(metrics: dict, m: int) -> dict:
    """Drafted and accepted tokens of the MTP part (positions < m) and the n-gram part."""
    drafts = int(metrics["vllm:spec_decode_num_drafts"])
    per_pos = [int(x) for x in metrics["vllm:spec_decode_num_accepted_tokens_per_pos"]]
    mtp_drafted = m * drafts  # every drafted step starts with m MTP tokens
    ngram_drafted = int(metrics["vllm:spec_decode_num_draft_tokens"]) - mtp_drafted
    mtp_acc, ngram_acc = sum(per_pos[:m]), sum(per_pos[m:])
    return {"steps": drafts, "mtp_drafted": mtp_drafted, "mtp_accepted": mtp_acc,
            "ngram_drafted": ngram_drafted, "ngram_accepted": ngram_acc,
            "mtp_rate": mtp_acc / max(mtp_drafted, 1),
            "ngram_rate": ngram_acc / max(ngram_drafted, 1),
            "accepted_per_pos": per_pos}


# ---------------------------------------------------------------- config
def test_front_door_rewrites_to_vllm_mtp():
    vllm_spec, ours = normalise({"method": "mtp_ngram", "num-model-steps": 2,
                                 "num_speculative_tokens": 5, "prompt_lookup_max": 4})
    assert vllm_spec == {"method": "mtp", "num_speculative_tokens": 5}
    assert ours["method"] == "mtp_ngram" and ours["num_model_steps"] == 2
    assert ours["prompt_lookup_max"] == 4
    vllm_spec, _ = normalise({"method": "mtp_ngram", "num_speculative_tokens": 3,
                              "model": "/weights/mtp"})
    assert vllm_spec["model"] == "/weights/mtp"


def test_fastdeploy_alias():
    vllm_spec, ours = normalise({"method": "mtp", "mtp_strategy": "with_ngram",
                                 "num_model_steps": 2, "num_speculative_tokens": 5,
                                 "max_ngram_size": 4, "min_ngram_size": 1})
    assert vllm_spec == {"method": "mtp", "num_speculative_tokens": 5}
    assert (ours["method"], ours["prompt_lookup_min"], ours["prompt_lookup_max"]) == (
        "mtp_ngram", 1, 4)
    # FastDeploy's default strategy is vLLM's own MTP, left to vLLM
    assert normalise({"method": "mtp", "mtp_strategy": "default",
                      "num_speculative_tokens": 1}) == (
        {"method": "mtp", "num_speculative_tokens": 1}, None)


@pytest.mark.parametrize("spec,keys", [
    ({"method": "mtp_ngram", "num_model_steps": 3, "num_speculative_tokens": 2},
     ["num_speculative_tokens", "num_model_steps"]),
    ({"method": "mtp_ngram", "num_model_steps": 0}, ["num_model_steps"]),
    ({"method": "mtp_ngram", "prompt_lookup_min": 4, "prompt_lookup_max": 2},
     ["prompt_lookup_min"]),
    ({"method": "mtp_ngram", "max_ngram_size": 4}, ["max_ngram_size"]),
    ({"method": "mtp", "mtp_strategy": "with_ngram", "num_model_steps": 4,
      "num_speculative_tokens": 2}, ["num_speculative_tokens", "num_model_steps"]),
    ({"method": "mtp", "mtp_strategy": "sometimes"}, ["mtp_strategy", "with_ngram"]),
    ({"method": "ngram", "mtp_strategy": "with_ngram"}, ["mtp_strategy"]),
])
def test_config_errors_name_keys(spec, keys):
    with pytest.raises(SpecExtConfigError) as err:
        normalise(spec)
    for key in keys:
        assert key in str(err.value)


def test_k_equal_m_is_plain_mtp_budget():
    cfg = validate_config({"method": "mtp_ngram", "num_model_steps": 2,
                           "num_speculative_tokens": 2})
    assert cfg.num_model_steps == cfg.num_speculative_tokens == 2


def test_build_proposer_needs_the_engine():
    with pytest.raises(SpecExtConfigError, match="inside vLLM"):
        build_proposer("mtp_ngram", num_speculative_tokens=4)


# ---------------------------------------------------------------- extension core
def _core(k=5, m=2, lo=2, hi=3):
    # imported here: this file is also the engine job's __main__, and numba (llvmlite)
    # imported before vllm-cpu's worker init breaks its kernel override scan
    from vllm_specext.proposers.mtp_ngram import MtpNgramProposer

    return MtpNgramProposer(num_speculative_tokens=k, num_model_steps=m,
                            prompt_lookup_min=lo, prompt_lookup_max=hi)


def test_extension_key_includes_mtp_drafts():
    p = _core(k=5, m=2)
    p.sync("a", np.array([10, 11, 12, 13, 20, 21, 22, 23, 24, 99, 10], dtype=np.int32))
    # without drafts the key ends "99 10": no earlier occurrence
    assert p.propose(["a"], [5]) == [[]]
    # with MTP drafts [11, 12] the key "10 11 12" (3-gram) matches -> 13, 20, 21
    assert p.propose(["a"], [5], [[11, 12]]) == [[11, 12, 13, 20, 21]]
    # other drafts, other key: "20 21" -> 22, 23, 24
    assert p.propose(["a"], [5], [[20, 21]]) == [[20, 21, 22, 23, 24]]
    # no match keeps the MTP drafts only
    assert p.propose(["a"], [5], [[7, 8]]) == [[7, 8]]


def test_extension_caps_batches_and_unknown_requests():
    p = _core(k=5, m=1)
    p.sync("a", np.array([1, 2, 3, 4, 1, 2], dtype=np.int32))
    p.sync("b", np.array([5, 6, 7, 5, 6], dtype=np.int32))
    out = p.propose(["a", "b", "zz"], [3, 5, 5], [[3], [7], [9]])
    assert out == [[3, 4, 1], [7, 5, 6, 7, 5], [9]]
    assert p.propose(["a"], [0], [[3]]) == [[]]
    assert p.propose(["a"], [1], [[3, 4]]) == [[3]]  # cap also cuts the model part


def test_sync_appends_and_resyncs():
    p = _core(k=4, m=1)
    ctx = np.array([1, 2, 3, 1, 2], dtype=np.int32)
    p.sync("a", ctx[:3])
    p.sync("a", ctx)  # appended: 1 2 3 1 2
    assert list(p.tokens["a"].view()) == [1, 2, 3, 1, 2]
    assert p.propose(["a"], None, [[3]]) == [[3, 1, 2, 3]]
    other = np.array([9, 8, 9, 8, 9], dtype=np.int32)  # same id, different history
    p.sync("a", other)
    assert list(p.tokens["a"].view()) == [9, 8, 9, 8, 9]
    p.stop_request("a")
    assert p.propose(["a"], None, [[8]]) == [[8]]


def test_core_rejects_bad_steps():
    with pytest.raises(ValueError, match="num_model_steps"):
        _core(k=2, m=3)


# ---------------------------------------------------------------- real engine
MAX_TOKENS = 32


@pytest.mark.engine
def test_engine_config_is_vllm_mtp_sync_v1(tmp_path):
    """EngineArgs -> VllmConfig (no engine started): vLLM's MTP with the total budget,
    our keys in additional_config, synchronous scheduling, the V1 runner."""
    from vllm.engine.arg_utils import EngineArgs

    model = str(build_tiny_mimo(tmp_path / "tiny_mimo"))
    spec = {"method": "mtp", "mtp_strategy": "with_ngram", "num_model_steps": 2,
            "num_speculative_tokens": 5}
    kwargs = {"model": model, "dtype": "float32", "max_model_len": 256,
              "skip_tokenizer_init": True}
    cfg = EngineArgs(**kwargs, speculative_config=dict(spec)).create_engine_config()
    assert cfg.speculative_config.method == "mtp"
    assert cfg.speculative_config.num_speculative_tokens == 5
    assert cfg.additional_config["vllm_specext"]["num_model_steps"] == 2
    assert not cfg.scheduler_config.async_scheduling
    assert "vllm_specext mtp_ngram" in cfg._get_v2_model_runner_unsupported_features()
    with pytest.raises(SpecExtConfigError, match="synchronous scheduling"):
        EngineArgs(**kwargs, speculative_config=dict(spec),
                   async_scheduling=True).create_engine_config()


@pytest.fixture(scope="module")
def tiny_mtp(tmp_path_factory):
    pytest.importorskip("vllm")
    model = build_tiny_mimo(tmp_path_factory.mktemp("tiny_mimo"))
    job = {"model": str(model), "prompts": workload(), "max_tokens": MAX_TOKENS}
    return job, run_in_subprocess({**job, "spec": None})


@pytest.mark.engine
@pytest.mark.parametrize("m,k", [(1, 4), (2, 5)])
def test_engine_greedy_identical(tiny_mtp, m, k):
    job, baseline = tiny_mtp
    res = run_in_subprocess({**job, "spec": {"method": "mtp_ngram", "num_model_steps": m,
                                             "num_speculative_tokens": k}})
    for i, (got, want) in enumerate(zip(res["token_ids"], baseline["token_ids"])):
        assert got == want, f"prompt {i} differs with mtp_ngram m={m} k={k}"
    split = split_acceptance(res["metrics"], m)
    print(f"\nmtp_ngram m={m} k={k}: {json.dumps(split)}")
    assert split["ngram_drafted"] > 0, "the n-gram extension never drafted"
    assert split["mtp_accepted"] > 0 and split["ngram_accepted"] > 0
    assert split["ngram_accepted"] < split["ngram_drafted"]  # the decoys were rejected
    assert len(split["accepted_per_pos"]) == k


def main() -> None:
    result = run_job(json.loads(sys.stdin.read()))
    with open(sys.argv[1], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
