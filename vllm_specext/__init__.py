"""vllm-specext: model-free and lightweight speculative decoding for vLLM.

Importing this package does not import vLLM; the vLLM plugin entry point is
:func:`vllm_specext.plugin.register`.
"""
__version__ = "0.1.0"
