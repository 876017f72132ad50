"""The thin layer that adapts proposer cores to vLLM's runners (the only vLLM-aware code)."""
