"""The end-to-end benchmark's prompt sets: sizes, distinct prompts, written in the repo."""
from __future__ import annotations

import ast

from conftest import BENCH, load_benchmark

PATH = BENCH / "workloads.py"
NAMES = ["code_editing", "summarization", "extraction", "open_chat", "code_generation"]


def _load():
    return load_benchmark("workloads").WORKLOADS


def test_five_workloads_of_32_distinct_chats():
    workloads = _load()
    assert list(workloads) == NAMES
    everything = []
    for name, chats in workloads.items():
        assert len(chats) == 32, name
        for chat in chats:
            assert len(chat) == 1 and chat[0]["role"] == "user"
            assert chat[0]["content"].strip()
        contents = [c[0]["content"] for c in chats]
        assert len(set(contents)) == 32, f"{name} repeats a prompt"
        everything += contents
    assert len(set(everything)) == len(everything)


def test_documents_have_realistic_lengths():
    workloads = _load()
    for name in ("code_editing", "summarization", "extraction"):
        words = [len(c[0]["content"].split()) for c in workloads[name]]
        assert 80 <= min(words) and max(words) <= 320, (name, min(words), max(words))


def test_small_prefixes_mix_documents():
    for name in ("code_editing", "summarization", "extraction"):
        firsts = [c[0]["content"].split("\n\n", 1) for c in _load()[name][:4]]
        assert len({doc for _, doc in firsts}) == 4 and len({ins for ins, _ in firsts}) == 4


def test_no_outside_data():
    """Plain literals only: no imports (so no files, network or packages) and no open()."""
    tree = ast.parse(PATH.read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            assert isinstance(node, ast.ImportFrom) and node.module == "__future__"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id not in ("open", "__import__", "exec", "eval")
