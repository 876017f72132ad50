"""Ascend (vllm-ascend) integration: :mod:`vllm_specext.integration.ascend`.

The unit tests here need neither vllm-ascend nor an NPU. ``test_against_vllm_ascend``
runs ``tests/ascend_stubs/ascend_checks.py`` in a subprocess against vllm-ascend's real
Python classes on CPU (NPU-only imports stood in by ``tests/ascend_stubs/npu_stubs.py``).
It needs vllm-ascend's source, found at ``$SPECEXT_VLLM_ASCEND_SRC`` (a checkout, or an
sdist ``.tar.gz``) or as an sdist in ``.cache/vllm-ascend/``; fetch it once with::

    python3 -m venv /tmp/sdist-venv
    /tmp/sdist-venv/bin/pip install -q setuptools setuptools-scm wheel
    SOC_VERSION=ascend910b1 /tmp/sdist-venv/bin/pip download -q --no-deps \\
        --no-build-isolation vllm-ascend==0.30.0rc2 -d .cache/vllm-ascend

(``SOC_VERSION`` only answers the chip-type question vllm-ascend's ``setup.py`` asks while
pip reads its metadata; nothing is built.) Without the source that test is skipped.
"""
from __future__ import annotations

import importlib.util
import inspect
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from vllm_specext.integration import ascend
from vllm_specext.integration.engine_config import ADAPTER_CLASS

REPO = Path(__file__).resolve().parents[1]
CHECKS = REPO / "tests" / "ascend_stubs" / "ascend_checks.py"
SOURCE_ENV = "SPECEXT_VLLM_ASCEND_SRC"
RUNNER_FILE = Path("vllm_ascend") / "worker" / "model_runner_v1.py"


# ------------------------------------------------------------------ no vllm-ascend needed
def test_routes_to_specext_only_for_our_custom_class():
    def cfg(method, model):
        return SimpleNamespace(speculative_config=SimpleNamespace(method=method, model=model))

    assert ascend.routes_to_specext(cfg("custom_class", ADAPTER_CLASS))
    assert not ascend.routes_to_specext(cfg("custom_class", "other.Proposer"))
    assert not ascend.routes_to_specext(cfg("mtp", None))  # mtp_ngram keeps the MTP drafter
    assert not ascend.routes_to_specext(SimpleNamespace(speculative_config=None))


def test_ascend_verify_modes():
    cfg = SimpleNamespace(additional_config={
        "enable_reduce_sample": True,
        "rejection_sampler_config": {"enable_block_verify": False,
                                     "enable_entropy_verify": True}})
    assert ascend.ascend_verify_modes(cfg) == [
        "enable_reduce_sample", "rejection_sampler_config.enable_entropy_verify"]
    assert ascend.ascend_verify_modes(SimpleNamespace(additional_config=None)) == []


def ascend_style_module(logits_name: str):
    """A module whose ``rejection_sample`` has vllm-ascend's signature; records calls."""
    calls = []
    exec_ns: dict = {"calls": calls}
    exec(f"""
def rejection_sample(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens,
                     draft_probs, {logits_name}, bonus_token_ids, sampling_metadata,
                     synthetic_mode=False, synthetic_conditional_rates=None,
                     ori_target_logits=None):
    calls.append(({logits_name}, ori_target_logits))
    return "ascend"
""", exec_ns)
    return SimpleNamespace(rejection_sample=exec_ns["rejection_sample"]), calls


@pytest.mark.parametrize("logits_name", ["target_logits_or_tuple", "target_logits"])
def test_adapter_has_vllm_names_and_passes_calls_through(logits_name):
    module, calls = ascend_style_module(logits_name)
    assert ascend.adapt_rejection_sample(module)
    assert not ascend.adapt_rejection_sample(module)  # idempotent
    params = list(inspect.signature(module.rejection_sample).parameters)
    assert params[5] == "target_logits" and "ori_target_logits" in params
    logits = torch.zeros(2, 3)
    assert module.rejection_sample(*range(5), target_logits=logits, bonus_token_ids=None,
                                   sampling_metadata=None) == "ascend"
    assert calls[-1][0] is logits


def test_front_drops_raw_logits_and_unpacks_tuples():
    module, calls = ascend_style_module("target_logits_or_tuple")
    ascend.adapt_rejection_sample(module)
    ascend.cover_rejection_sample(module)
    front = module.rejection_sample
    ascend.cover_rejection_sample(module)
    assert module.rejection_sample is front  # idempotent
    logits, raw = torch.zeros(2, 3), torch.ones(2, 3)
    front(*range(5), (logits, None), None, None, synthetic_mode=False, ori_target_logits=raw)
    assert calls[-1] == (logits, None)  # unpacked, raw logits dropped
    candidates = (logits, torch.zeros(2, 3, dtype=torch.long))  # reduce-sample
    front(*range(5), candidates, None, None, ori_target_logits=raw)
    assert calls[-1] == (candidates, raw)  # vllm-ascend's own path, untouched


def test_patch_ascend_is_a_no_op_without_vllm_ascend():
    if importlib.util.find_spec("vllm_ascend") is not None:
        pytest.skip("vllm-ascend is installed here")
    assert ascend.patch_ascend() is False


# ------------------------------------------------------------------ vllm-ascend's classes
def vllm_ascend_source(tmp_dir: Path) -> Path | None:
    """A directory holding ``vllm_ascend/``: ``$SPECEXT_VLLM_ASCEND_SRC`` or the newest
    sdist in ``.cache/vllm-ascend/`` (sdists are unpacked into ``tmp_dir``)."""
    given = os.environ.get(SOURCE_ENV)
    path = Path(given) if given else REPO / ".cache" / "vllm-ascend"
    if (path / RUNNER_FILE).is_file():
        return path
    sdists = sorted(path.glob("vllm_ascend-*.tar.gz")) if path.is_dir() else \
        [path] if path.name.endswith(".tar.gz") and path.is_file() else []
    if not sdists:
        return None
    with tarfile.open(sdists[-1]) as tar:
        members = [m for m in tar.getmembers() if "/vllm_ascend/" in m.name]
        tar.extractall(tmp_dir, members=members, filter="data")
    roots = [p.parent.parent.parent for p in tmp_dir.glob("*/" + str(RUNNER_FILE))]
    return roots[0] if roots else None


def test_against_vllm_ascend(tmp_path):
    """Dispatch, call shapes, dummy_run/load_model and our verify kernel through
    vllm-ascend's NPUModelRunner and AscendRejectionSampler (see ascend_checks.py)."""
    pytest.importorskip("vllm")
    src = vllm_ascend_source(tmp_path)
    if src is None:
        pytest.skip(f"vllm-ascend source not found (set {SOURCE_ENV} or put an sdist in "
                    ".cache/vllm-ascend/; see this file's docstring)")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore",
         str(CHECKS)], cwd=REPO, env={**os.environ, SOURCE_ENV: str(src)},
        capture_output=True, text=True, timeout=900)
    tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
    assert proc.returncode == 0, f"ascend_checks.py against {src} failed:\n{tail}"
