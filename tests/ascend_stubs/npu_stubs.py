"""Import-boundary stand-ins that let vllm-ascend's Python modules import on a CPU-only
machine without the CANN toolkit. Tests only, and only in a subprocess: installing them
changes the interpreter for good (``torch.npu``, ``sys.modules``).

What is stood in for, and why:

* NPU-only packages: ``torch_npu`` (and submodules), CANN's ``acl``, ``vllm_ascend``'s
  compiled ``vllm_ascend_C`` and its generated ``_build_info``. Attribute access returns a
  ``MagicMock``; nothing on the code paths under test calls them (vllm-ascend falls back to
  its PyTorch implementations when Triton has no backend, as on this CPU).
* ``scipy``, a vllm-ascend dependency that the CPU environment lacks; imported at module
  level by attention modules that the tests never run. Stood in only when missing.
* Pinned host memory, which torch_npu's runtime provides: vllm-ascend's PyTorch
  fallbacks build small host tensors with ``pin_memory=True``, which a CPU-only torch
  rejects. :func:`install` drops that flag in torch's tensor factories (it only changes
  transfer speed).
* Version skew: names that vllm-ascend main imports from vLLM main but vLLM 0.32 lacks
  (:data:`VLLM_SKEW_MODULES`, :data:`VLLM_SKEW_NAMES`); none is used on the paths under
  test. Extend these when a newer checkout imports more.
"""
from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.util
import sys
import types
from pathlib import Path
from unittest.mock import MagicMock

#: Top-level names of NPU-only modules (and their submodules).
NPU_ONLY = ("torch_npu", "acl", "vllm_ascend.vllm_ascend_C", "vllm_ascend._build_info")
#: vLLM modules that vllm-ascend main imports and vLLM 0.32 does not have.
VLLM_SKEW_MODULES = ("vllm.model_executor.layers.attention.pcp",)
#: ``(module, name)`` that vllm-ascend main imports from vLLM and vLLM 0.32 lacks.
VLLM_SKEW_NAMES = (("vllm.v1.outputs", "RoutedExpertsLists"),
                   ("vllm.v1.outputs", "RoutedExpertsTensors"))


class _StubModule(types.ModuleType):
    """A module whose missing attributes are MagicMocks (dunder names stay missing)."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        value = MagicMock(name=f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves :class:`_StubModule` for the given module names and their submodules."""

    def __init__(self, prefixes: tuple[str, ...]):
        self.prefixes = prefixes

    def find_spec(self, name, path=None, target=None):
        if any(name == p or name.startswith(p + ".") for p in self.prefixes):
            return importlib.util.spec_from_loader(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        if spec.name == "scipy":
            module.__version__ = "1.15.0"  # numba checks scipy's version on import
        if spec.name == "vllm_ascend._build_info":
            module.__device_type__ = "A2"
        return module

    def exec_module(self, module):
        pass


def _drop_pin_memory(torch) -> None:
    """Make ``torch.<factory>(..., pin_memory=True)`` work without an accelerator."""
    for name in ("tensor", "arange", "ones", "zeros", "full", "empty"):
        factory = getattr(torch, name)

        @functools.wraps(factory)
        def unpinned(*args, _factory=factory, **kwargs):
            kwargs.pop("pin_memory", None)
            return _factory(*args, **kwargs)

        setattr(torch, name, unpinned)


def install(src: Path) -> None:
    """Make ``import vllm_ascend...`` work on CPU with the checkout at ``src``.

    Args:
        src: a directory holding the ``vllm_ascend`` package (a vllm-ascend checkout).
    """
    import numba  # noqa: F401  (before a scipy stand-in: numba inspects scipy on import)
    import torch

    prefixes = NPU_ONLY + VLLM_SKEW_MODULES
    if importlib.util.find_spec("scipy") is None:
        prefixes += ("scipy",)
    sys.meta_path.insert(0, _StubFinder(prefixes))
    torch.npu = MagicMock(name="torch.npu")  # vllm-ascend calls torch.npu.* at import time
    torch.npu.is_available = lambda: False  # keeps transformers off its NPU paths
    _drop_pin_memory(torch)
    for module, name in VLLM_SKEW_NAMES:
        mod = importlib.import_module(module)
        if not hasattr(mod, name):
            setattr(mod, name, type(name, (), {}))
    sys.path.insert(0, str(src))
    # vllm-ascend's import order (its ops package first avoids an import cycle)
    importlib.import_module("vllm_ascend.utils")
    importlib.import_module("vllm_ascend.ops")
