"""Draft verification: strategies, accept policies and the fused, vectorised kernel.

Pure torch (CPU, CUDA and Ascend tensors); imports nothing from vLLM. The vLLM hook that
routes ``RejectionSampler`` through this kernel is
:func:`vllm_specext.integration.verify_hook.install_verify`.

>>> out = verify_drafts(drafts, cu_num_draft_tokens, target_logits, bonus, is_greedy,
...                     strategy="target_match", accept_policy="normal")
>>> out.output_token_ids  # [B, max_spec_len + 1] int32, -1 padded, as vLLM's sampler
"""
from vllm_specext.verify.kernel import VerifyOutput, verify_drafts
from vllm_specext.verify.strategies import (
    DEFAULT_TOP_P,
    POLICY_NAMES,
    STRATEGY_ALIASES,
    STRATEGY_NAMES,
    VerifySpec,
    normalize_policy,
    normalize_strategy,
    parse_request_override,
)

__all__ = [
    "DEFAULT_TOP_P",
    "POLICY_NAMES",
    "STRATEGY_ALIASES",
    "STRATEGY_NAMES",
    "VerifyOutput",
    "VerifySpec",
    "normalize_policy",
    "normalize_strategy",
    "parse_request_override",
    "verify_drafts",
]
