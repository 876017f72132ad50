"""Replay tokenizers of each kind, built tiny inside the test (no downloads)."""
from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import pytest

from vllm_specext.replay.tokenizers import (
    HFTokenizer,
    SentencePieceTokenizer,
    Special,
    TiktokenTokenizer,
    load_tokenizer,
)

CORPUS = ["the quick brown fox jumps over the lazy dog", "hello world, hello replay",
          "speculative decoding drafts tokens and the target verifies them"] * 20


def make_hf_dir(directory: Path, chat_template: str | None = None) -> Path:
    """A BPE tokenizer.json trained on CORPUS, with <s>/</s> specials and a BOS
    post-processor, plus tokenizer_config.json (optionally with a chat template)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=120, special_tokens=["<unk>", "<s>", "</s>", "<|im_start|>"]))
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    cfg = {"bos_token": "<s>", "eos_token": {"content": "</s>"}}
    if chat_template:
        cfg["chat_template"] = chat_template
    (directory / "tokenizer_config.json").write_text(json.dumps(cfg))
    return directory


def make_sp_model(path: Path) -> Path:
    """A sentencepiece BPE model trained on CORPUS with [INST]/[/INST] control symbols."""
    spm = pytest.importorskip("sentencepiece")
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS), model_writer=buf, vocab_size=80, model_type="bpe",
        control_symbols=["[INST]", "[/INST]"], hard_vocab_limit=False, minloglevel=2)
    path.write_bytes(buf.getvalue())
    return path


def make_tiktoken_file(path: Path) -> Path:
    """A byte-level BPE file: the 256 bytes plus a few merges (``th``, ``the``, `` the``)."""
    pieces = [bytes([b]) for b in range(256)] + [b"th", b"the", b" the", b"he", b"ll"]
    path.write_text("".join(f"{base64.b64encode(p).decode()} {i}\n" for i, p in enumerate(pieces)))
    return path


def test_hf_tokenizer_json_and_dir(tmp_path):
    d = make_hf_dir(tmp_path / "hf", chat_template="{{ bos_token }}x")
    for spec in (str(d), str(d / "tokenizer.json"), f"hf:{d}"):
        tok = load_tokenizer(spec)
        assert isinstance(tok, HFTokenizer)
    assert tok.bos_token == "<s>" and tok.eos_token == "</s>" and tok.chat_template
    ids = tok.encode_text("hello world")
    assert tok.decode(ids).replace(" ", "") == "helloworld"
    assert tok.encode_prompt("hello") == [tok.special_id("<s>")] + tok.encode_text("hello")
    # special tokens written in text (as HF chat templates do) are parsed
    assert tok.encode_text("<|im_start|>hello")[0] == tok.special_id("<|im_start|>")
    assert tok.encode_segments([Special("</s>"), "hello"]) == [tok.special_id("</s>")] + \
        tok.encode_text("hello")
    with pytest.raises(ValueError, match="no token"):
        tok.special_id("[INST]")


def test_sentencepiece_model(tmp_path):
    path = make_sp_model(tmp_path / "tiny.model.v3")
    tok = load_tokenizer(str(path))
    assert isinstance(tok, SentencePieceTokenizer)
    assert tok.bos_token == "<s>" and tok.eos_token == "</s>"
    ids = tok.encode_text("hello world")
    assert tok.decode(ids) == "hello world"
    # one leading space is the dummy prefix: " hello" and "hello" encode alike
    assert tok.encode_text(" hello world") == ids
    assert tok.encode_prompt("hello") == [tok.special_id("<s>")] + tok.encode_text("hello")
    inst, end = tok.special_id("[INST]"), tok.special_id("[/INST]")
    assert tok.encode_segments([Special("[INST]"), "hello", Special("[/INST]")]) == \
        [inst] + tok.encode_text("hello") + [end]
    with pytest.raises(ValueError, match="no piece"):
        tok.special_id("<|im_start|>")


def test_tiktoken_bpe_file(tmp_path):
    path = make_tiktoken_file(tmp_path / "tiny.tiktoken")
    tok = load_tokenizer(str(path))
    assert isinstance(tok, TiktokenTokenizer)
    ids = tok.encode_text("the cat, the end")
    assert tok.decode(ids) == "the cat, the end"
    assert ids[0] == 257 and 258 in ids  # "the", " the" merges
    assert tok.bos_token is None and tok.encode_prompt("the") == [257]
    assert tok.special_id("<|endoftext|>") == 261  # first id after the ranks
    with pytest.raises(ValueError, match="no special token"):
        tok.special_id("<|im_start|>")
    assert load_tokenizer(f"tiktoken:{path}").name == tok.name
    assert isinstance(load_tokenizer(str(tmp_path)), TiktokenTokenizer)  # dir with *.tiktoken


def test_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_tokenizer(str(tmp_path / "missing.json"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no tokenizer"):
        load_tokenizer(str(tmp_path / "empty"))
    bad = tmp_path / "bad.tiktoken"
    bad.write_text("not base64 at all\n")
    with pytest.raises(ValueError, match="tiktoken"):
        load_tokenizer(str(bad))


SHARED = Path(__file__).resolve().parents[2] / "shared" / "tokenizers"


@pytest.mark.skipif(not SHARED.exists(), reason="shared/tokenizers not present")
def test_shared_tokenizers_known_vocabularies():
    qwen = load_tokenizer(str(SHARED / "qwen" / "qwen.tiktoken"))
    assert "(qwen)" in qwen.name and qwen.special_id("<|im_start|>") == 151644
    mistral = load_tokenizer(str(SHARED / "mistral"))
    assert mistral.special_id("[INST]") == 3 and mistral.special_id("[/INST]") == 4
