"""Offline trace replay: score proposers on recorded (prompt, output) traces without a GPU.

Modules: :mod:`.traces` (JSONL + chat templates), :mod:`.tokenizers` (HF, sentencepiece,
tiktoken), :mod:`.simulate` (teacher-forced loop and metrics), :mod:`.oracle` (retrieval
bound), :mod:`.sweep` (configurations), :mod:`.runner` (files x configurations),
:mod:`.report` (JSON/CSV/PNG), :mod:`.cli` (``vllm-specext replay``).
"""
