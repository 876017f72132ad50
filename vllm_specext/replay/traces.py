"""Load JSONL request traces and render their prompts (schema: ``shared/traces/README.md``).

One line is one request, in arrival order::

    {"id", "category", "model", "prompt": str, "output": str}          # completion trace
    {"id", "category", "model", "messages": [{"role", "content"}...], "output": str}  # chat

A completion ``prompt`` is the exact model input (the tokenizer's BOS is added, as an
engine does). A chat trace's ``messages`` is the whole conversation *before* the
recorded reply, with no template applied: a second turn holds
``[user, assistant, user]`` where the assistant message is the earlier turn's recorded
output, and ``output`` is the reply to the last user message. The prompt is the
rendered template with the generation prompt (``ASSISTANT:``, ``[/INST]``,
``<|im_start|>assistant\\n``) at the end; earlier turns are part of the prompt.

Templates (rendered into text and :class:`~vllm_specext.replay.tokenizers.Special`
segments):

- ``vicuna_v1.1`` (FastChat): ``<s>`` + ``"{system} USER: {q} ASSISTANT:"``, each
  finished assistant turn followed by ``</s>``; default system prompt as in FastChat.
- ``chatml`` (Qwen2-Instruct): ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per
  message, default system ``You are a helpful assistant.``, then
  ``<|im_start|>assistant\\n``.
- ``mistral_inst`` (mistral-common v3): ``<s>`` then ``[INST] {user}[/INST]`` and
  ``{assistant}</s>`` with ``[INST]``/``[/INST]``/``</s>`` as control tokens; a system
  message is prepended to the last user message with a blank line.
- ``hf``: the tokenizer's own Jinja ``chat_template`` (HF tokenizers only), rendered
  with ``add_generation_prompt=True`` as ``transformers`` does.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vllm_specext.replay.tokenizers import ReplayTokenizer, Segment, Special

VICUNA_SYSTEM = ("A chat between a curious user and an artificial intelligence assistant. "
                 "The assistant gives helpful, detailed, and polite answers to the user's "
                 "questions.")
CHATML_SYSTEM = "You are a helpful assistant."
TEMPLATES = ("vicuna_v1.1", "chatml", "mistral_inst", "hf")
#: ``--template auto``: a model name containing the key (lower case) uses the template
AUTO_TEMPLATES = {"vicuna": "vicuna_v1.1", "qwen": "chatml", "mistral": "mistral_inst"}


class TraceError(ValueError):
    """A malformed trace line, or a chat trace with no usable template."""


@dataclass
class TraceRecord:
    """One request of a trace file.

    Attributes:
        line: 1-based line number in the file (request ids need not be unique).
        id, category, model: as recorded (``category`` defaults to ``"all"``).
        output: the recorded generated text.
        prompt: the raw completion prompt, or ``None`` for chat traces.
        messages: the chat messages before the reply, or ``None``.
    """

    line: int
    id: str
    category: str
    model: str
    output: str
    prompt: str | None = None
    messages: list[dict] | None = field(default=None, repr=False)


def load_traces(path: str | Path, limit: int | None = None) -> list[TraceRecord]:
    """Read the first ``limit`` requests (all if ``None``) of a JSONL trace file.

    Raises:
        TraceError: a line is not JSON, lacks ``output``, or has neither ``prompt`` nor
            ``messages``.
    """
    records: list[TraceRecord] = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if limit is not None and len(records) >= limit:
                break
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise TraceError(f"{path}:{lineno}: not JSON ({err})") from None
            if not isinstance(row.get("output"), str):
                raise TraceError(f"{path}:{lineno}: missing string field 'output'")
            prompt, messages = row.get("prompt"), row.get("messages")
            if not isinstance(prompt, str) and not isinstance(messages, list):
                raise TraceError(f"{path}:{lineno}: needs 'prompt' (str) or 'messages' (list)")
            records.append(TraceRecord(
                line=lineno, id=str(row.get("id", lineno)),
                category=str(row.get("category") or "all"), model=str(row.get("model") or ""),
                output=row["output"], prompt=prompt if isinstance(prompt, str) else None,
                messages=messages if not isinstance(prompt, str) else None))
    return records


def resolve_template(name: str, model: str, tokenizer: ReplayTokenizer) -> str:
    """The template for a chat request: ``name`` itself, or for ``"auto"`` the one
    :data:`AUTO_TEMPLATES` gives for ``model``, else ``hf`` if the tokenizer has one.

    Raises:
        TraceError: unknown name, or ``auto`` found nothing for ``model``.
    """
    if name != "auto":
        if name not in TEMPLATES:
            raise TraceError(
                f"unknown chat template {name!r}; allowed: auto, {', '.join(TEMPLATES)}")
        return name
    for key, template in AUTO_TEMPLATES.items():
        if key in model.lower():
            return template
    if tokenizer.chat_template:
        return "hf"
    raise TraceError(f"no chat template known for model {model!r}: pass --template "
                     f"({', '.join(TEMPLATES)})")


def render_chat(messages: Sequence[dict], template: str,
                tokenizer: ReplayTokenizer) -> list[Segment]:
    """Render chat ``messages`` with a named template, ending with the generation prompt.

    Returns:
        Segments for :meth:`ReplayTokenizer.encode_segments`.

    Raises:
        TraceError: unknown template, a role the template cannot express, or ``hf``
            with a tokenizer that has no chat template.
    """
    if template == "vicuna_v1.1":
        return _render_vicuna(messages)
    if template == "chatml":
        return _render_chatml(messages)
    if template == "mistral_inst":
        return _render_mistral(messages)
    if template == "hf":
        return [_render_hf(messages, tokenizer)]
    raise TraceError(f"unknown chat template {template!r}; allowed: {', '.join(TEMPLATES)}")


def _render_vicuna(messages: Sequence[dict]) -> list[Segment]:
    system = VICUNA_SYSTEM
    segs: list[Segment] = [Special("<s>")]
    text = ""
    for m in messages:
        role, content = m["role"], m["content"]
        if role == "system":
            system = content
        elif role == "user":
            text += f" USER: {content}"
        elif role == "assistant":
            segs.append(f"{text} ASSISTANT: {content}".lstrip())
            segs.append(Special("</s>"))
            text = ""
        else:
            raise TraceError(f"vicuna_v1.1 cannot render role {role!r}")
    segs.append(f"{text} ASSISTANT:".lstrip())
    segs[1] = f"{system} {segs[1]}"
    return segs


def _render_chatml(messages: Sequence[dict]) -> list[Segment]:
    msgs = list(messages)
    if not msgs or msgs[0]["role"] != "system":
        msgs.insert(0, {"role": "system", "content": CHATML_SYSTEM})
    segs: list[Segment] = []
    for m in msgs:
        segs += [Special("<|im_start|>"), f"{m['role']}\n{m['content']}",
                 Special("<|im_end|>"), "\n"]
    return segs + [Special("<|im_start|>"), "assistant\n"]


def _render_mistral(messages: Sequence[dict]) -> list[Segment]:
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    turns = [m for m in messages if m["role"] != "system"]
    last_user = max((i for i, m in enumerate(turns) if m["role"] == "user"), default=-1)
    segs: list[Segment] = [Special("<s>")]
    for i, m in enumerate(turns):
        if m["role"] == "user":
            content = f"{system}\n\n{m['content']}" if system and i == last_user else m["content"]
            segs += [Special("[INST]"), content, Special("[/INST]")]
        elif m["role"] == "assistant":
            segs += [m["content"], Special("</s>")]
        else:
            raise TraceError(f"mistral_inst cannot render role {m['role']!r}")
    return segs


def _render_hf(messages: Sequence[dict], tokenizer: ReplayTokenizer) -> str:
    if not tokenizer.chat_template:
        raise TraceError(f"tokenizer {tokenizer.name} has no chat_template; pick --template "
                         f"from {', '.join(TEMPLATES[:-1])}")
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str):
        raise TraceError(f"chat template: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(tokenizer.chat_template).render(
            messages=list(messages), add_generation_prompt=True,
            bos_token=tokenizer.bos_token or "", eos_token=tokenizer.eos_token or "")
    except TemplateError as err:
        raise TraceError(f"chat template of {tokenizer.name} failed: {err}") from None


def tokenize_record(rec: TraceRecord, tokenizer: ReplayTokenizer,
                    template: str = "auto") -> tuple[list[int], list[int]]:
    """Prompt and output token ids of one request.

    The output is encoded on its own (no BOS/EOS), as the tokens the model emitted
    after the prompt; a chat prompt is the rendered template (see module docstring).

    Raises:
        TraceError: no usable chat template; ValueError: a special token the tokenizer
        lacks (e.g. ChatML with a vocabulary that has no ``<|im_start|>``).
    """
    if rec.prompt is not None:
        prompt = tokenizer.encode_prompt(rec.prompt)
    else:
        name = resolve_template(template, rec.model, tokenizer)
        prompt = tokenizer.encode_segments(render_chat(rec.messages, name, tokenizer))
    return prompt, tokenizer.encode_text(rec.output)
