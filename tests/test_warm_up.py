"""``warm_up`` leaves no compiled kernel for serving to load: after it, a workload that
grows and compacts every index of a proposer compiles nothing new. A kernel first called
mid-serving stalled an engine step (140 ms where numba compiled ``suffix``'s arena
compaction). Checked in a fresh interpreter per method: numba's dispatchers are per
process, and other tests compile kernels too."""
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
warm_up(build_proposer(method, num_speculative_tokens=8))
before = compiled()
p = build_proposer(method, num_speculative_tokens=8)
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
print(json.dumps(sorted(k for k in after if after[k] != before[k])))
"""


@pytest.mark.parametrize("method", ["ngram", "suffix", "memory_decoding", "lookahead"])
def test_serving_compiles_nothing_after_warm_up(method):
    out = subprocess.run([sys.executable, "-c", SCRIPT, method], capture_output=True,
                         text=True, timeout=600, check=True).stdout
    assert json.loads(out.splitlines()[-1]) == []
