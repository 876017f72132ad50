"""vLLM plugin entry point (group ``vllm.general_plugins``).

vLLM calls :func:`register` in every process it starts (API server, engine core,
workers). It is idempotent and cheap: it wraps the config front door
(:mod:`vllm_specext.integration.engine_config`), lets the engine core take the drafts
from the model output (:mod:`vllm_specext.integration.draft_handoff`) and defers the
model-runner patches (:mod:`vllm_specext.integration.runner`) to worker construction.
"""
from __future__ import annotations

import logging

logger = logging.getLogger(__name__)
_registered = False


def register() -> None:
    """Install vllm_specext's hooks into vLLM (safe to call any number of times).

    It must not import numba: in each worker vLLM then scans every loaded module to
    install its CPU kernel overrides, and that scan fails on llvmlite's lazy wrappers.

    Raises:
        ImportError: vLLM is not installed.
    """
    global _registered
    if _registered:
        return
    from vllm_specext.integration.engine_config import patch_engine_args
    from vllm_specext.integration.metrics import install as install_metrics
    from vllm_specext.integration.runner import patch_worker_base

    patch_engine_args()
    patch_worker_base()
    from vllm_specext.integration.draft_handoff import patch_engine_core

    patch_engine_core()  # drafts arrive with the model output (no extra RPC per step)
    from vllm_specext.integration.queue_signal import patch_scheduler

    patch_scheduler()  # the worker learns whether requests wait (what a token is worth)
    install_metrics()  # vllm_specext_proposer_errors_total on /metrics
    from vllm_specext.integration.mtp_hybrid import patch_mtp_hybrid

    patch_mtp_hybrid()  # mtp_ngram: sync scheduling, V1 runner, MTP + n-gram runner hooks
    from vllm_specext.integration.ascend import warn_missing_ascend_plugins

    warn_missing_ascend_plugins()  # VLLM_PLUGINS without vllm-ascend's on an Ascend install
    _registered = True
    logger.debug("vllm_specext registered")
