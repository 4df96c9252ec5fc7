"""Generated tokens → reply text: reasoning and content channels, stop sequences, finish reason.

Pure (no torch, no I/O), so streaming and non-streaming replies are the same code and the
edge cases (a stop string split across tokens, a UTF-8 character split across tokens, a reply
cut off while thinking) are tested with literal token lists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from sparkd.engine.think import ANSWER_CLOSE, ANSWER_OPEN, CLOSE, OPEN, TagMatcher, ThinkTags


@dataclass
class Delta:
    reasoning: str = ""
    content: str = ""

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content)

    def __iadd__(self, other: "Delta") -> "Delta":
        self.reasoning += other.reasoning
        self.content += other.content
        return self


class _Channel:
    """One text stream with its own UTF-8 decoder and stop-string hold-back."""

    def __init__(self, tokenizer: Any, stop: Sequence[str]):
        self._decoder = tokenizer.stream(whole_text=True)
        self._stop = [s for s in stop if s]
        self._held = ""

    def push(self, token: int) -> tuple[str, bool]:
        return self._emit(self._held + self._decoder.push(token))

    def flush(self) -> str:
        text, _ = self._emit(self._held + self._decoder.flush(), final=True)
        return text

    def _emit(self, text: str, final: bool = False) -> tuple[str, bool]:
        """(text safe to send, whether a stop string was found)."""
        hits = [i for i in (text.find(s) for s in self._stop) if i >= 0]
        if hits:
            self._held = ""
            return text[:min(hits)], True
        keep = 0 if final else self._partial_stop_len(text)
        self._held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep], False

    def _partial_stop_len(self, text: str) -> int:
        """Length of the longest tail of text that could start a stop string."""
        best = 0
        for s in self._stop:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if s.startswith(text[-n:]):
                    best = n
                    break
        return best


class ReplyBuilder:
    """Feed tokens with push(); read finish_reason and completion_tokens at the end.

    answer: the tags of an answer section (Kimi K3 wraps its reply in <|open|>response<|sep|> …
    <|close|>response<|sep|>): the tags are never content, and what follows the close tag (K3's
    tool sections, the message close) is outside the answer and dropped — as chat.split_reasoning
    does on whole texts."""

    def __init__(self, tokenizer: Any, stop: Sequence[str] = (), think: ThinkTags | None = None,
                 starts_in_reasoning: bool = False, answer: ThinkTags | None = None):
        self._eog = tokenizer.eog_ids
        self._tags = TagMatcher(think, answer) if think is not None else None
        self._past_answer = False
        self._content = _Channel(tokenizer, stop)
        self._reasoning = _Channel(tokenizer, stop) if think is not None else None
        self.in_reasoning = starts_in_reasoning and think is not None
        self.completion_tokens = 0
        self.finish_reason: str | None = None
        self.saw_reasoning = self.in_reasoning

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def push(self, token: int) -> Delta:
        if self.done:
            return Delta()
        self.completion_tokens += 1
        if token in self._eog:
            self.finish_reason = "stop"
            return self.flush()
        items = self._tags.push(token) if self._tags is not None else [token]
        return self._take(items)

    def _take(self, items: list[int | str]) -> Delta:
        """Plain tokens to the current channel, OPEN/CLOSE switch it; stops at a stop string."""
        out = Delta()
        for item in items:
            if item in (OPEN, CLOSE):
                out += self._switch(item == OPEN)
                continue
            if item in (ANSWER_OPEN, ANSWER_CLOSE):
                out += self._answer_tag(item == ANSWER_OPEN)
                continue
            if self._past_answer and not self.in_reasoning:
                continue
            channel = self._reasoning if self.in_reasoning else self._content
            text, stopped = channel.push(item)
            out += Delta(reasoning=text) if self.in_reasoning else Delta(content=text)
            if stopped:
                self.finish_reason = "stop"
                break
        return out

    def _switch(self, to_reasoning: bool) -> Delta:
        if to_reasoning == self.in_reasoning:
            return Delta()
        out = Delta(reasoning=self._reasoning.flush()) if self.in_reasoning else Delta(content=self._content.flush())
        self.in_reasoning = to_reasoning
        self.saw_reasoning = self.saw_reasoning or to_reasoning
        return out

    def _answer_tag(self, opens: bool) -> Delta:
        """An answer section starts (it also ends reasoning) or ends (the rest is not content)."""
        out = self._switch(False)
        if not opens:
            out.content += self._content.flush()
        self._past_answer = not opens
        return out

    def flush(self) -> Delta:
        """Everything held back: tokens of a tag that never completed, text of a partial stop."""
        out = self._take(self._tags.flush()) if self._tags is not None else Delta()
        out.content += self._content.flush()
        if self._reasoning is not None:
            out.reasoning += self._reasoning.flush()
        return out

    def finish(self, cancelled: bool = False) -> Delta:
        """End of generation without a stop: the token limit (or the context) ran out."""
        out = self.flush()
        if self.finish_reason is None:
            self.finish_reason = "cancelled" if cancelled else "length"
        return out
