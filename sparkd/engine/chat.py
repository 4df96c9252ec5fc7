"""Chat prompts from the GGUF's tokenizer.chat_template, and reasoning split out of replies.

Templates are Jinja2 written for Hugging Face transformers; they run here in an immutable
sandbox with the same helpers transformers provides (raise_exception, strftime_now, a tojson
that keeps non-ASCII text) and the same whitespace settings (trim_blocks, lstrip_blocks).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Mapping, Sequence

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from sparkd.engine.errors import EngineError

TEMPLATE_KEY = "tokenizer.chat_template"
# (open, close) markup of reasoning blocks, as the model families emit them.
THINK_TAGS: tuple[tuple[str, str], ...] = (
    ("<think>", "</think>"),
    ("<seed:think>", "</seed:think>"),
    ("◁think▷", "◁/think▷"),
    ("<|open|>think<|sep|>", "<|close|>think<|sep|>"),  # Kimi K3's XTML sections
)
# (open, close) of an answer section a family wraps its reply in (Kimi K3: after the think section,
# ended by <|close|>message<|sep|>); the content is what lies inside.
ANSWER_TAGS: tuple[tuple[str, str], ...] = (
    ("<|open|>response<|sep|>", "<|close|>response<|sep|>"),
)


class ChatTemplateError(EngineError):
    """The chat template is missing, does not parse, or refused the conversation."""


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(value: Any, indent: int | None = None, separators: tuple[str, str] | None = None,
            sort_keys: bool = False, ensure_ascii: bool = False) -> str:
    return json.dumps(value, indent=indent, separators=separators, sort_keys=sort_keys,
                      ensure_ascii=ensure_ascii)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.filters["from_json"] = json.loads  # DeepSeek V4 parses string tool-call arguments
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class ChatTemplate:
    """A compiled chat template; render() turns messages into the prompt text."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "", origin: str = TEMPLATE_KEY):
        self.source = source
        self.origin = origin
        self.bos_token = bos_token
        self.eos_token = eos_token
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ChatTemplateError(f"could not parse the chat template from {origin}: line {exc.lineno}: "
                                    f"{exc.message}") from exc

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any], tokenizer: Any, origin: str = "the model") -> "ChatTemplate":
        """From GGUF metadata; BOS/EOS texts come from the tokenizer (any object with
        tokens, bos_id, eos_id, like sparkd.engine.tokenizer.Tokenizer)."""
        source = metadata.get(TEMPLATE_KEY)
        if not source:
            raise ChatTemplateError(f"could not find a chat template in {origin}: metadata key "
                                    f"{TEMPLATE_KEY!r} is missing; pass a template file instead")

        def text(tid: int | None) -> str:
            return tokenizer.tokens[tid] if tid is not None else ""

        return cls(source, text(tokenizer.bos_id), text(tokenizer.eos_id), origin=f"{origin} ({TEMPLATE_KEY})")

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
               tools: Sequence[Mapping[str, Any]] | None = None, **extra: Any) -> str:
        """Prompt text for messages; extra keys (e.g. enable_thinking) go to the template."""
        for i, message in enumerate(messages):
            if "role" not in message:
                raise ChatTemplateError(f"could not render the chat: message {i} has no 'role'")
        context = dict(extra, messages=list(messages), add_generation_prompt=add_generation_prompt,
                       bos_token=self.bos_token, eos_token=self.eos_token)
        if tools is not None:
            context["tools"] = list(tools)
        try:
            return self._template.render(**context)
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"could not render the chat template from {self.origin}: {exc}") from exc


@dataclass(frozen=True)
class Reply:
    content: str
    reasoning_content: str | None


def split_reasoning(text: str, in_reasoning: bool = False) -> Reply:
    """Separate reasoning markup from the answer.

    in_reasoning: the prompt already opened the block (templates that end with "<think>"), so
    the reply starts inside it and only a closing tag may appear. An unclosed block is all
    reasoning (the generation stopped while thinking)."""
    # inside the block: the family whose closing tag appears (else the first, all reasoning)
    pairs = [next((p for p in THINK_TAGS if p[1] in text), THINK_TAGS[0])] if in_reasoning else THINK_TAGS
    for open_tag, close_tag in pairs:
        if in_reasoning:
            before, body = "", text.removeprefix(open_tag)
        else:
            start = text.find(open_tag)
            if start < 0:
                continue
            before, body = text[:start], text[start + len(open_tag):]
        reasoning, closed, after = body.partition(close_tag)
        return Reply(content=_answer((before + after).strip() if closed else before.strip()),
                     reasoning_content=reasoning.strip())
    return Reply(content=_answer(text), reasoning_content=None)


def _answer(text: str) -> str:
    """The inside of an answer section; the prompt may have opened it, so the opener is optional."""
    for open_tag, close_tag in ANSWER_TAGS:
        if open_tag in text or close_tag in text:
            return text.partition(open_tag)[2].partition(close_tag)[0].strip() if open_tag in text \
                else text.partition(close_tag)[0].strip()
    return text


def stop_token_ids(tokenizer: Any) -> frozenset[int]:
    """Token ids that end a generation: the tokenizer's end-of-generation set."""
    return frozenset(tokenizer.eog_ids)
