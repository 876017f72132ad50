"""Bad speculative configs fail at config time with a message naming the key."""
from __future__ import annotations

import pytest

from vllm_specext.config import SpecExtConfigError, validate_config
from vllm_specext.integration.engine_config import ADAPTER_CLASS, normalise

BAD = [
    ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 129}, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": "eight"}, "num_speculative_tokens"),
    ({"method": "ngram", "prompt_lookup_min": 0}, "prompt_lookup_min"),
    ({"method": "ngram", "prompt_lookup_max": 65}, "prompt_lookup_max"),
    ({"method": "ngram", "prompt_lookup_min": 6, "prompt_lookup_max": 3}, "prompt_lookup_min"),
    ({"method": "ngram", "prompt_lookup_mn": 2}, "prompt_lookup_mn"),
    ({"method": "naive", "prompt_lookup_min": 2}, "prompt_lookup_min"),
    ({"method": "ngram", "verify_strategy": "sometimes"}, "verify_strategy"),
    ({"method": "ngram", "accept_policy": "maybe"}, "accept_policy"),
    ({"method": "nrgam"}, "nrgam"),
    ({"method": "ngram", "num_speculative_tokens": 4.5}, "num_speculative_tokens"),
    ({"method": "ngram", "verify_top_p": 0}, "verify_top_p"),
    ({"method": "ngram", "adaptive_decay": 1.0}, "adaptive_decay"),
    ({"method": "ngram", "adaptive_threshold": 2}, "adaptive_threshold"),
    ({"method": "suffix", "adaptive_margin": 0.5}, "adaptive_margin"),
    ({"method": "suffix", "adaptive_verified_scale": 65}, "adaptive_verified_scale"),
    ({"method": "suffix", "adaptive_verified_scale": True}, "adaptive_verified_scale"),
    ({"method": "ngram", "adaptive": "sometimes"}, "adaptive"),
    ({"method": "suffix", "suffix_decoding_max_tree_depth": 0}, "suffix_decoding_max_tree_depth"),
    ({"method": "suffix", "suffix_decoding_max_cached_requests": -2},
     "suffix_decoding_max_cached_requests"),
    ({"method": "suffix", "suffix_decoding_min_token_prob": 1.5}, "suffix_decoding_min_token_prob"),
    ({"method": "suffix", "suffix_decoding_max_spec_factor": -1}, "suffix_decoding_max_spec_factor"),
    ({"method": "memory_decoding", "decoding_length": 17}, "decoding_length"),
    ({"method": "memory_decoding", "decoding_length": 16, "num_speculative_tokens": 8},
     "decoding_length"),
    ({"method": "memory_decoding", "dynamic_algo": "often"}, "dynamic_algo"),
    ({"method": "memory_decoding", "max_nodes": 10}, "max_nodes"),
    ({"method": "mtp_ngram", "num_model_steps": 4, "num_speculative_tokens": 2},
     "num_model_steps"),
    ({"method": "lookahead", "level": 2}, "level"),
    ({"plugin_type": "mystery"}, "plugin_type"),
    ({"plugin_type": "memory_decoding", "method": "ngram"}, "plugin_type"),
    ({"method": "ngram", "mtp_strategy": "with_ngram"}, "mtp_strategy"),
]


@pytest.mark.parametrize("spec,key", BAD)
def test_bad_config_names_key(spec, key):
    with pytest.raises(SpecExtConfigError) as err:
        validate_config(spec)
    assert key in str(err.value)


def test_range_is_stated():
    with pytest.raises(SpecExtConfigError, match=r"\[1, 128\]"):
        validate_config({"method": "ngram", "num_speculative_tokens": 0})


def test_open_bounds_are_stated():
    with pytest.raises(SpecExtConfigError, match=r"allowed: float in \(0\.0, 1\.0\)"):
        validate_config({"method": "ngram", "adaptive_decay": 1.0})
    with pytest.raises(SpecExtConfigError, match=r"allowed: float in \(0\.0, 1\.0\]"):
        validate_config({"method": "ngram", "verify_top_p": 0})


@pytest.mark.parametrize("typo,meant", [("memory-decoding", "memory_decoding"),
                                        ("lookahed", "lookahead"), ("Suffix", "suffix")])
def test_mistyped_method_suggests_ours(typo, meant):
    for check in (validate_config, normalise):  # normalise: before vLLM's own method list
        with pytest.raises(SpecExtConfigError, match=f"did you mean '{meant}'"):
            check({"method": typo})


def test_memory_decoding_lengths_from_a_numeric_string_and_errors_on_the_given_key():
    cfg = validate_config({"method": "memory_decoding", "num_speculative_tokens": "4"})
    assert (cfg.num_speculative_tokens, cfg.decoding_length) == (4, 4)
    with pytest.raises(SpecExtConfigError) as err:
        validate_config({"method": "memory_decoding", "decoding_length": 0})
    assert "decoding_length" in str(err.value) and "num_speculative_tokens" not in str(err.value)


@pytest.mark.parametrize("spec", [{"method": "ngram", "num_speculative_tokens": True},
                                  {"method": "memory_decoding", "decoding_length": True},
                                  {"method": "ngram", "adaptive_threshold": True}])
def test_a_boolean_is_not_a_number(spec):
    key = next(k for k in spec if k != "method")
    with pytest.raises(SpecExtConfigError, match=f"'{key}'.*not a boolean"):
        validate_config(spec)


@pytest.mark.parametrize("dl", [4, 4.0, "4", "4.0"])
def test_memory_decoding_k_follows_a_whole_decoding_length(dl):
    cfg = validate_config({"method": "memory_decoding", "decoding_length": dl})
    assert (cfg.num_speculative_tokens, cfg.decoding_length) == (4, 4)


def test_use_builtin_is_an_engine_key():
    with pytest.raises(SpecExtConfigError, match="where vLLM starts"):
        validate_config({"method": "ngram", "use_builtin": True})


def test_not_a_dict():
    with pytest.raises(SpecExtConfigError, match="dict"):
        validate_config(["ngram"])  # type: ignore[arg-type]


def test_defaults_and_dash_keys():
    cfg = validate_config({"method": "ngram", "prompt-lookup-max": 7})
    assert cfg.prompt_lookup_max == 7 and cfg.num_speculative_tokens == 8


def test_normalise_rewrites_our_methods():
    vllm_spec, ours = normalise({"method": "ngram", "num_speculative_tokens": 4})
    assert vllm_spec == {"method": "custom_class", "model": ADAPTER_CLASS,
                         "num_speculative_tokens": 4}
    assert ours["method"] == "ngram" and ours["num_speculative_tokens"] == 4


def test_normalise_leaves_builtin_and_foreign_methods():
    assert normalise({"method": "ngram", "use_builtin": True, "num_speculative_tokens": 3}) == (
        {"method": "ngram", "num_speculative_tokens": 3}, None)
    assert normalise({"method": "eagle", "model": "x"}) == ({"method": "eagle", "model": "x"}, None)


def test_normalise_rejects_bad_input():
    with pytest.raises(SpecExtConfigError, match="prompt_lookup_min"):
        normalise({"method": "ngram", "prompt_lookup_min": -1})


@pytest.mark.engine
def test_engine_rejects_bad_config_at_start():
    """LLM() fails before any engine process starts, naming the key."""
    from vllm.engine.arg_utils import EngineArgs

    from vllm_specext.model import default_model_path

    args = EngineArgs(model=str(default_model_path()), dtype="float32",
                      speculative_config={"method": "ngram", "prompt_lookup_max": 100})
    with pytest.raises(SpecExtConfigError, match="prompt_lookup_max"):
        args.create_engine_config()


def test_example_configs_are_valid():
    from pathlib import Path

    import json

    paths = sorted((Path(__file__).parents[1] / "examples" / "configs").glob("*.json"))
    assert paths
    for path in paths:
        normalise(json.loads(path.read_text()))  # raises on an invalid example


def test_mindie_plugin_type_alias():
    cfg = validate_config({"plugin_type": "memory_decoding", "decoding_length": 8})
    assert cfg.method == "memory_decoding" and cfg.num_speculative_tokens == 8
    vllm_spec, ours = normalise({"plugin_type": "memory_decoding"})
    assert vllm_spec["method"] == "custom_class" and ours["method"] == "memory_decoding"


def test_fastdeploy_spellings():
    assert validate_config({"method": "ngram", "verify_strategy": "topp"}).verify_strategy == "top_p"
    _, ours = normalise({"method": "mtp", "mtp_strategy": "with_ngram", "num_model_steps": 1,
                         "num_speculative_tokens": 4})
    assert ours["method"] == "mtp_ngram"


@pytest.mark.parametrize("spec,key", [
    ({"method": "ngram", "use_builtin": "false"}, "use_builtin"),
    ({"method": "memory_decoding", "use_builtin": True}, "use_builtin"),
    ({"method": "suffix", "use_builtin": True, "adaptive": False}, r"\['adaptive'\]"),
    ({"method": "ngram", "use_builtin": True, "rejected_tail": 2, "prompt_lookup_min": 2},
     r"has no key\(s\) \['rejected_tail'\]"),
])
def test_use_builtin_is_validated(spec, key):
    with pytest.raises(SpecExtConfigError, match=key):
        normalise(spec)


@pytest.mark.parametrize("spec,key", [
    ({"method": "suffix", "suffix_decoding_max_spec_offset": float("nan")},
     "suffix_decoding_max_spec_offset"),
    ({"method": "suffix", "suffix_decoding_max_spec_offset": "inf"},
     "suffix_decoding_max_spec_offset"),
    ({"method": "suffix", "suffix_decoding_max_spec_offset": 1e20},
     "suffix_decoding_max_spec_offset"),
    ({"method": "suffix", "suffix_decoding_max_spec_factor": float("inf")},
     "suffix_decoding_max_spec_factor"),
    ({"method": "suffix", "suffix_decoding_max_spec_factor": 1e39},
     "suffix_decoding_max_spec_factor"),
    ({"method": "suffix", "suffix_decoding_max_cached_requests": 10 ** 30},
     "suffix_decoding_max_cached_requests"),
    ({"method": "ngram", "adaptive_threshold": float("nan")}, "adaptive_threshold"),
    ({"method": "mtp_ngram", "model": ""}, "model"),
])
def test_non_finite_and_unbounded_numbers_are_refused(spec, key):
    """An infinite or huge draft-cap factor/offset would silently turn drafting off."""
    with pytest.raises(SpecExtConfigError, match=key):
        validate_config(spec)


@pytest.mark.parametrize("spec,names", [
    ({"method": "ngram", "num_speculative_tokens": 8, "num-speculative-tokens": 2},
     ("num_speculative_tokens", "num-speculative-tokens")),
    ({"method": "memory_decoding", "decoding_length": 8, "decoding-length": 4},
     ("decoding_length", "decoding-length")),
    ({"method": "mtp", "mtp_strategy": "with_ngram", "max_ngram_size": 5,
      "prompt_lookup_max": 3}, ("max_ngram_size", "prompt_lookup_max")),
    ({"plugin_params": {"plugin_type": "la", "level": 4}, "level": 5}, ("level",)),
])
def test_a_key_given_twice_is_refused(spec, names):
    for check in (validate_config, normalise):
        with pytest.raises(SpecExtConfigError, match="give") as err:
            check(dict(spec))
        assert all(n in str(err.value) for n in names)


def test_fastdeploy_alias_agreeing_with_ours_is_fine():
    _, ours = normalise({"method": "mtp", "mtp_strategy": "with_ngram", "max_ngram_size": 4,
                         "prompt_lookup_max": 4, "num_model_steps": 1})
    assert ours["prompt_lookup_max"] == 4


@pytest.mark.parametrize("spec,match", [
    ({"method": ["ngram"]}, "'method': got list"),
    ({"plugin_type": ["la"]}, "'plugin_type': got"),
    ({}, "'method' is missing"),
    ({"Method": "ngram"}, "did you mean 'method'"),
    ({"method ": "ngram"}, "did you mean 'method'"),
    ({"plugin_params": "{not json"}, "'plugin_params': not valid JSON"),
    ({"plugin_params": [1, 2]}, "'plugin_params': got list"),
])
def test_method_key_errors_are_ours(spec, match):
    with pytest.raises(SpecExtConfigError, match=match):
        validate_config(spec)
    if spec:  # vLLM infers a missing method from its draft model; ours are checked
        with pytest.raises(SpecExtConfigError, match=match):
            normalise(spec)


def test_a_null_method_is_left_to_vllm():
    """vLLM infers a null method from its draft model; only ours need one."""
    spec = {"method": None, "model": "some/draft-model", "num_speculative_tokens": 2}
    assert normalise(dict(spec)) == (spec, None)
    with pytest.raises(SpecExtConfigError, match="'method' is missing"):
        validate_config(spec)


@pytest.mark.parametrize("params", [
    {"plugin_type": "memory_decoding", "decoding_length": 8, "dynamic_algo": True},
    '{"plugin_type": "memory_decoding", "decoding_length": 8, "dynamic_algo": true}',
])
def test_mindie_plugin_params_wrapper(params):
    cfg = validate_config({"plugin_params": params})
    assert (cfg.method, cfg.decoding_length, cfg.num_speculative_tokens, cfg.dynamic_algo) == (
        "memory_decoding", 8, 8, True)


@pytest.mark.parametrize("spec,k", [
    ({"method": "lookahead", "window": "10"}, 10),
    ({"method": "lookahead", "window": 10}, 10),
    ({"method": "lookahead", "level": "8"}, 7),
    ({"method": "lookahead", "level": 8}, 7),
    ({"method": "lookahead", "num_speculative_tokens": 3.0}, 3),
    ({"method": "lookahead", "num_speculative_tokens": "3"}, 3),
])
def test_lookahead_reads_numeric_strings_like_ints(spec, k):
    assert validate_config(spec).num_speculative_tokens == k
