"""Tokenizers for trace replay: HF ``tokenizer.json``, sentencepiece ``.model``, tiktoken BPE.

All three load from local files only (no hub access). :func:`load_tokenizer` picks the
kind from the path; a ``hf:``, ``sp:`` or ``tiktoken:`` prefix forces it.

Every tokenizer turns a prompt made of *segments* into token ids: a ``str`` segment is
ordinary text, a :class:`Special` segment is one special/control token looked up by
its name (``<s>``, ``[INST]``, ``<|im_start|>``). Chat templates are rendered into
segments (see :mod:`vllm_specext.replay.traces`), so control tokens that a
sentencepiece model cannot produce from text (Mistral's ``[INST]``) still get their ids.
"""
from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

#: Regex pre-tokenizers of known tiktoken vocabularies, keyed by the number of BPE ranks
#: in the file, with their special tokens. Sources: tiktoken ``tiktoken_ext/openai_public.py``
#: (cl100k_base, r50k_base) and Qwen's ``tokenization_qwen.py`` (PAT_STR, ENDOFTEXT,
#: IMSTART, IMEND, numbered from the first id after the ranks).
_CL100K_PAT = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+"""
               r"""| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s""")
_QWEN_PAT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"""
             r"""[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
_R50K_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
_KNOWN_TIKTOKEN: dict[int, tuple[str, str, dict[str, int]]] = {
    100256: ("cl100k_base", _CL100K_PAT,
             {"<|endoftext|>": 100257, "<|fim_prefix|>": 100258, "<|fim_middle|>": 100259,
              "<|fim_suffix|>": 100260, "<|endofprompt|>": 100276}),
    151643: ("qwen", _QWEN_PAT,
             {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645}),
    50256: ("r50k_base", _R50K_PAT, {"<|endoftext|>": 50256}),
}


@dataclass(frozen=True)
class Special:
    """A prompt segment that is exactly one special token, by name (e.g. ``"</s>"``)."""

    name: str


Segment = str | Special


class ReplayTokenizer:
    """Common interface of the replay tokenizers.

    Attributes:
        name: a short description (kind and file name) for reports.
        bos_token: the BOS token's name, or ``None`` if the tokenizer adds none.
        eos_token: the EOS token's name, or ``None``.
        chat_template: a Jinja chat template (HF tokenizers only), else ``None``.
    """

    name: str = ""
    bos_token: str | None = None
    eos_token: str | None = None
    chat_template: str | None = None

    def encode_text(self, text: str) -> list[int]:
        """Token ids of plain text (no BOS/EOS added)."""
        raise NotImplementedError

    def special_id(self, name: str) -> int:
        """The id of special token ``name``.

        Raises:
            ValueError: the tokenizer has no such special token.
        """
        raise NotImplementedError

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` (for debugging and tests)."""
        raise NotImplementedError

    def encode_segments(self, segments: Sequence[Segment]) -> list[int]:
        """Token ids of a rendered prompt: text segments encoded one by one, specials by id."""
        ids: list[int] = []
        for seg in segments:
            if isinstance(seg, Special):
                ids.append(self.special_id(seg.name))
            elif seg:
                ids.extend(self.encode_text(seg))
        return ids

    def encode_prompt(self, text: str) -> list[int]:
        """A raw completion prompt as an engine tokenizes it: BOS (if any) + text."""
        bos = [self.special_id(self.bos_token)] if self.bos_token else []
        return bos + self.encode_text(text)


class HFTokenizer(ReplayTokenizer):
    """A Hugging Face ``tokenizer.json`` (``tokenizers`` library), with the chat
    template, BOS and EOS of a ``tokenizer_config.json`` beside it if there is one.

    Text is encoded with ``add_special_tokens=False``; added special tokens written in
    the text (as HF chat templates write them) are parsed into their ids. ``encode_prompt``
    applies the tokenizer's post-processor (``add_special_tokens=True``), as vLLM does.
    """

    def __init__(self, path: Path):
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(path))
        self.name = f"hf:{path.parent.name}/{path.name}"
        cfg_path = path.parent / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
        self.bos_token = _token_str(cfg.get("bos_token"))
        self.eos_token = _token_str(cfg.get("eos_token"))
        template = cfg.get("chat_template")
        if isinstance(template, list):  # named templates: use "default"
            template = {t["name"]: t["template"] for t in template}.get("default")
        jinja = path.parent / "chat_template.jinja"
        self.chat_template = template or (jinja.read_text() if jinja.exists() else None)

    def encode_text(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_prompt(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=True).ids

    def special_id(self, name: str) -> int:
        tid = self._tok.token_to_id(name)
        if tid is None:
            raise ValueError(f"tokenizer {self.name} has no token {name!r}")
        return tid

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)


class SentencePieceTokenizer(ReplayTokenizer):
    """A sentencepiece ``.model`` (Llama-2, Mistral ``.model.v3``).

    sentencepiece prepends a ``▁`` (dummy prefix) to every text it encodes, so one
    leading space of a text segment is dropped first: a recorded output ``" Title"``
    and ``"Title"`` both become ``▁Title``, the token the model emitted. BOS is the
    model's ``bos_id`` piece (``<s>``).
    """

    def __init__(self, path: Path):
        import sentencepiece as spm

        self._sp = spm.SentencePieceProcessor(model_file=str(path))
        self.name = f"sentencepiece:{path.name}"
        bos, eos = self._sp.bos_id(), self._sp.eos_id()
        self.bos_token = self._sp.id_to_piece(bos) if bos >= 0 else None
        self.eos_token = self._sp.id_to_piece(eos) if eos >= 0 else None

    def encode_text(self, text: str) -> list[int]:
        return self._sp.encode(text[1:] if text.startswith(" ") else text)

    def special_id(self, name: str) -> int:
        tid = self._sp.piece_to_id(name)
        if tid == self._sp.unk_id() and name != self._sp.id_to_piece(tid):
            raise ValueError(f"tokenizer {self.name} has no piece {name!r}")
        return tid

    def decode(self, ids: Sequence[int]) -> str:
        return self._sp.decode(list(ids))


class TiktokenTokenizer(ReplayTokenizer):
    """A tiktoken BPE file (lines ``base64(token) rank``), e.g. cl100k_base, qwen.tiktoken.

    The regex pre-tokenizer and special tokens come from the table of known
    vocabularies (recognised by their number of ranks: cl100k_base, Qwen, r50k);
    any other file gets cl100k's regex and ``<|endoftext|>`` as the first id after its
    ranks. tiktoken adds no BOS.
    """

    def __init__(self, path: Path):
        import tiktoken

        ranks: dict[bytes, int] = {}
        for line in path.read_bytes().splitlines():
            if line.strip():
                tok, rank = line.split()
                ranks[base64.b64decode(tok)] = int(rank)
        kind, pat, specials = _KNOWN_TIKTOKEN.get(
            len(ranks), ("custom", _CL100K_PAT, {"<|endoftext|>": len(ranks)}))
        self._enc = tiktoken.Encoding(name=f"{kind}:{path.name}", pat_str=pat,
                                      mergeable_ranks=ranks, special_tokens=specials)
        self._specials = specials
        self.name = f"tiktoken:{path.name} ({kind})"
        self.eos_token = "<|endoftext|>"

    def encode_text(self, text: str) -> list[int]:
        return self._enc.encode_ordinary(text)

    def special_id(self, name: str) -> int:
        if name not in self._specials:
            raise ValueError(f"tokenizer {self.name} has no special token {name!r}; "
                             f"it has {sorted(self._specials)}")
        return self._specials[name]

    def decode(self, ids: Sequence[int]) -> str:
        return self._enc.decode(list(ids))


def _token_str(tok: object) -> str | None:
    """``tokenizer_config.json`` writes tokens as strings or ``{"content": ...}``."""
    if isinstance(tok, dict):
        return tok.get("content")
    return tok if isinstance(tok, str) else None


def load_tokenizer(spec: str) -> ReplayTokenizer:
    """Load a tokenizer from a local path.

    Args:
        spec: a path, optionally prefixed ``hf:``, ``sp:`` or ``tiktoken:``. Without a
            prefix: a directory with ``tokenizer.json`` (HF), ``tokenizer.model``
            (sentencepiece) or one ``*.tiktoken`` file; a ``*.json`` file is HF, a file
            named ``*.model`` or ``*.model.v<N>`` is sentencepiece, anything else is
            read as a tiktoken BPE file.

    Raises:
        FileNotFoundError: the path does not exist or the directory holds no tokenizer.
        ValueError: the file cannot be parsed as the chosen kind, or the library for
            it (``tokenizers``, ``sentencepiece``, ``tiktoken``) is not installed.
    """
    kind, _, rest = spec.partition(":")
    if kind not in ("hf", "sp", "tiktoken") or not rest:
        kind, rest = "", spec
    path = Path(rest).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"tokenizer path {str(path)!r} does not exist")
    if path.is_dir():
        path, kind = _find_in_dir(path, kind)
    if not kind:
        name = path.name
        if name.endswith(".json"):
            kind = "hf"
        elif name.endswith(".model") or ".model.v" in name:
            kind = "sp"
        else:
            kind = "tiktoken"
    cls = {"hf": HFTokenizer, "sp": SentencePieceTokenizer, "tiktoken": TiktokenTokenizer}[kind]
    try:
        return cls(path)
    except ImportError as err:
        raise ValueError(f"a {kind} tokenizer needs the Python package {err.name!r} "
                         f"(pip install {err.name})") from err
    except (ValueError, RuntimeError, OSError, UnicodeDecodeError) as err:
        raise ValueError(f"cannot read {str(path)!r} as a {kind} tokenizer: {err}") from err


def _find_in_dir(directory: Path, kind: str) -> tuple[Path, str]:
    candidates = [("hf", directory / "tokenizer.json"), ("sp", directory / "tokenizer.model")]
    candidates += [("tiktoken", p) for p in sorted(directory.glob("*.tiktoken"))]
    candidates += [("sp", p) for p in sorted(directory.glob("*.model.v*"))]
    for k, p in candidates:
        if p.is_file() and kind in ("", k):
            return p, k
    raise FileNotFoundError(
        f"no tokenizer.json, tokenizer.model or *.tiktoken in {str(directory)!r}")
