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
import types
from importlib.metadata import EntryPoint
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from vllm_specext.config import SpecExtConfigError
from vllm_specext.integration import ascend
from vllm_specext.integration.engine_config import ADAPTER_CLASS
from vllm_specext.integration.verify_hook import rejection_module

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


# vllm-ascend 0.30's entry points (its setup.py), plus another package's
ASCEND_ENTRY_POINTS = {
    "vllm.platform_plugins": [("ascend", "vllm_ascend:register")],
    "vllm.general_plugins": [
        ("ascend_kv_connector", "vllm_ascend:register_connector"),
        ("ascend_model_loader", "vllm_ascend:register_model_loader"),
        ("ascend_service_profiling", "vllm_ascend:register_service_profiling"),
        ("ascend_model", "vllm_ascend:register_model"),
        ("vllm_specext", "vllm_specext.plugin:register")]}


@pytest.fixture
def ascend_installed(monkeypatch):
    def entry_points(group):
        return [EntryPoint(name, value, group)
                for name, value in ASCEND_ENTRY_POINTS.get(group, [])]

    monkeypatch.setattr(ascend, "entry_points", entry_points)


def test_missing_ascend_plugins(ascend_installed, monkeypatch):
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    assert ascend.missing_ascend_plugins() == []  # unset: vLLM loads every plugin
    assert ascend.missing_ascend_plugins(["vllm_specext"]) == [
        "ascend", "ascend_kv_connector", "ascend_model", "ascend_model_loader",
        "ascend_service_profiling"]
    everything = [n for group in ASCEND_ENTRY_POINTS.values() for n, _ in group]
    assert ascend.missing_ascend_plugins(everything) == []


def test_vllm_plugins_without_ascend_is_warned(ascend_installed, monkeypatch, caplog):
    monkeypatch.setenv("VLLM_PLUGINS", "vllm_specext,ascend_model")
    with caplog.at_level("WARNING", logger=ascend.__name__):
        missing = ascend.warn_missing_ascend_plugins()
    assert "ascend" in missing and "ascend_model" not in missing
    assert "VLLM_PLUGINS=ascend,ascend_kv_connector,ascend_model_loader," \
           "ascend_service_profiling,vllm_specext,ascend_model" in caplog.text
    caplog.clear()
    monkeypatch.setenv("VLLM_PLUGINS", ",".join(
        n for group in ASCEND_ENTRY_POINTS.values() for n, _ in group))
    assert ascend.warn_missing_ascend_plugins() == [] and not caplog.text


def test_register_warns_about_vllm_plugins():
    """``register()`` (in a fresh interpreter: it patches vLLM for good) logs the warning."""
    pytest.importorskip("vllm")
    code = ("from importlib.metadata import EntryPoint\n"
            "import vllm_specext.integration.ascend as a, vllm_specext.plugin as p\n"
            f"eps = {ASCEND_ENTRY_POINTS!r}\n"
            "a.entry_points = lambda group: [EntryPoint(n, v, group) "
            "for n, v in eps.get(group, [])]\n"
            "p.register()\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "VLLM_PLUGINS": "vllm_specext"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "leaves out vllm-ascend's plugin(s) ascend," in proc.stderr


def test_config_checks_only_on_ascend(monkeypatch):
    args = SimpleNamespace(pipeline_parallel_size=2)
    mtp_ngram = {"method": "mtp_ngram", "num_model_steps": 1}
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    monkeypatch.setattr(ascend, "ascend_platform_active", lambda: False)
    ascend.check_engine_args(args, mtp_ngram)  # another platform: nothing to refuse
    monkeypatch.setattr(ascend, "ascend_platform_active", lambda: True)
    with pytest.raises(SpecExtConfigError, match="VLLM_USE_V2_MODEL_RUNNER"):
        ascend.check_engine_args(args, {"verify_strategy": "greedy"})
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    ascend.check_engine_args(args, {"method": "ngram"})
    with pytest.raises(SpecExtConfigError, match="pipeline_parallel_size=1"):
        ascend.check_engine_args(args, mtp_ngram)


def _module(monkeypatch, name: str, source: str, **names):
    """A registered module ``name`` running ``source`` (``names`` predefined)."""
    module = types.ModuleType(name)
    module.__dict__.update(names)
    exec(source, module.__dict__)  # noqa: S102 (test fixture code)
    monkeypatch.setitem(sys.modules, name, module)
    return module


def test_rejection_module_walks_to_the_forward_that_calls_it(monkeypatch):
    """vllm-ascend's 310P sampler: ``forward`` in a module without ``rejection_sample``
    that delegates to ``super().forward``; a ``forward`` that does not delegate is refused."""
    base = _module(monkeypatch, "specext_test_base_rs",
                   "def rejection_sample(*a, **k): pass\n"
                   "class Sampler:\n    def forward(self): return rejection_sample()\n")
    sub = _module(monkeypatch, "specext_test_sub_rs",
                  "class Delegating(Base):\n    def forward(self): return super().forward()\n"
                  "class Own(Base):\n    def forward(self): return None\n"
                  "class Plain(Base):\n    pass\n", Base=base.Sampler)
    for name in ("Delegating", "Plain"):
        assert rejection_module(getattr(sub, name)()) is base
    with pytest.raises(RuntimeError, match="Own.forward reaches no"):
        rejection_module(sub.Own())


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
