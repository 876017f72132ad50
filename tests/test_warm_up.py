"""``warm_up`` leaves no compiled kernel for serving to load: after it, a workload that
outgrows each index's first allocation (the suffix trees and their arena, the shared
trie, the n-gram tables) compiles nothing new. A kernel first called mid-serving stalled
an engine step (140 ms where numba compiled ``suffix``'s growth and compaction kernels).
Checked in a fresh interpreter per method: numba's dispatchers are per process, and other
tests compile kernels too. ``mtp_ngram`` runs only in the engine, where its n-gram core is
warmed up when the runner's :class:`~vllm_specext.integration.mtp_hybrid.MtpNgramHybrid`
is made."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

SCRIPT = r"""
import importlib, json, pkgutil, sys
import numpy as np
from numba.core.registry import CPUDispatcher
import vllm_specext.proposers as package
from vllm_specext.proposers import build_proposer
from vllm_specext.proposers.base import warm_up

modules = [importlib.import_module(f"vllm_specext.proposers.{m.name}")
           for m in pkgutil.iter_modules(package.__path__)]

def compiled():
    return {f"{m.__name__}.{name}": len(f.signatures) for m in modules
            for name, f in vars(m).items() if isinstance(f, CPUDispatcher)}

method = sys.argv[1]
if method == "mtp_ngram":
    from vllm_specext.integration.mtp_hybrid import MtpNgramHybrid
    from vllm_specext.proposers.mtp_ngram import MtpNgramProposer
    MtpNgramHybrid({"num_speculative_tokens": 8, "num_model_steps": 1,
                    "prompt_lookup_min": 2, "prompt_lookup_max": 5}, 4096)
    make = lambda: MtpNgramProposer(8)
else:
    make = lambda: build_proposer(method, num_speculative_tokens=8)
    warm_up(make())
before = compiled()
p = make()
rng = np.random.default_rng(0)
for r in range(80):  # more requests and output than any index's first allocation holds
    rid = f"r{r}"
    p.start_request(rid, rng.integers(0, 50, 120).tolist())
    for _ in range(40):
        draft = p.propose([rid])[0]
        if draft:
            p.observe_targets(rid, draft, draft)
        p.update(rid, draft[:1] + [int(rng.integers(0, 50))])
    p.stop_request(rid, finished=r % 5 != 0)
after = compiled()
print(json.dumps({"new": sorted(k for k in after if after[k] != before[k]),
                  "compiled": sorted(k for k in after if after[k])}))
"""

#: kernels that only a grown or compacted index calls: the workload must reach them
GROWTH_KERNELS = {
    "suffix": ["suffix_tree.rehash", "suffix_tree.mark_referenced"],
    "memory_decoding": ["memory_trie._best_first_order", "memory_trie._relink"],
}


@pytest.mark.parametrize("method",
                         ["ngram", "suffix", "memory_decoding", "lookahead", "mtp_ngram"])
def test_serving_compiles_nothing_after_warm_up(method):
    out = subprocess.run([sys.executable, "-c", SCRIPT, method], capture_output=True,
                         text=True, timeout=600, check=True).stdout
    result = json.loads(out.splitlines()[-1])
    assert result["new"] == []
    assert result["compiled"]  # numba compiled something: the check was not vacuous
    for kernel in GROWTH_KERNELS.get(method, []):
        assert f"vllm_specext.proposers.{kernel}" in result["compiled"]
