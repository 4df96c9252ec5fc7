"""Reasoning-block tags as token sequences, and a matcher that finds them in a token stream.

Most families mark reasoning with single control tokens (<think> … </think>); Kimi K3 spells its
tags with three tokens each (<|open|> think <|sep|> … <|close|> think <|sep|>). Both are a
sequence here: single-token tags are the 1-length case.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from sparkd.engine.tokenizer import CONTROL, USER_DEFINED

# the longest token sequence accepted as a tag; longer encodings are ordinary text, not markers
MAX_TAG_TOKENS = 8
OPEN, CLOSE = "open", "close"
# an answer section's tags (Kimi K3's <|open|>response<|sep|> ... <|close|>response<|sep|>)
ANSWER_OPEN, ANSWER_CLOSE = "answer_open", "answer_close"


@dataclass(frozen=True)
class ThinkTags:
    """Token sequences that open and close a reasoning block, and their text."""

    open_ids: tuple[int, ...]
    close_ids: tuple[int, ...]
    open_text: str
    close_text: str


def find_think_tags(tokenizer: Any, pairs: Sequence[tuple[str, str]]) -> ThinkTags | None:
    """The first (open, close) pair whose texts both encode to a short token sequence that
    decodes back to the same text; None when the vocabulary has none."""
    for open_text, close_text in pairs:
        open_ids, close_ids = _tag_ids(tokenizer, open_text), _tag_ids(tokenizer, close_text)
        if open_ids and close_ids:
            return ThinkTags(open_ids, close_ids, open_text, close_text)
    return None


def _tag_ids(tokenizer: Any, text: str) -> tuple[int, ...] | None:
    if text in tokenizer.ids:  # a single token, whatever its type
        return (tokenizer.ids[text],)
    ids = tuple(tokenizer.encode(text, add_special=False, parse_special=True))
    # a tag spelled in plain bytes (no control token in it) is ordinary text the model may also write
    has_control = any(tokenizer.types[i] in (CONTROL, USER_DEFINED) for i in ids)
    if 0 < len(ids) <= MAX_TAG_TOKENS and has_control and tokenizer.decode(ids, special=True) == text:
        return ids
    return None


class TagMatcher:
    """Follows generated tokens: holds back a proper prefix of any tag, reports a whole tag as
    OPEN or CLOSE (ANSWER_OPEN or ANSWER_CLOSE for the answer tags, when given), and releases
    tokens that can no longer become a tag, in order."""

    def __init__(self, tags: ThinkTags, answer: ThinkTags | None = None):
        self._tags = {tags.open_ids: OPEN, tags.close_ids: CLOSE}
        if answer is not None:
            self._tags.update({answer.open_ids: ANSWER_OPEN, answer.close_ids: ANSWER_CLOSE})
        self._held: list[int] = []

    @property
    def held(self) -> tuple[int, ...]:
        return tuple(self._held)

    def push(self, token: int) -> list[int | str]:
        """Plain token ids and OPEN/CLOSE markers, in stream order."""
        seq, out = self._held + [token], []
        while seq:
            whole = self._tags.get(tuple(seq))
            if whole is not None:
                out.append(whole)
                seq = []
            elif self._is_prefix(seq):
                break
            else:  # the first token starts no tag; the rest may
                out.append(seq.pop(0))
        self._held = seq
        return out

    def flush(self) -> list[int]:
        """The held tokens as plain tokens (the generation ended inside a would-be tag)."""
        out, self._held = self._held, []
        return out

    def rest_of(self, marker: str) -> list[int]:
        """Tokens that complete the tag `marker` from what is held (all of it when nothing fits)."""
        ids = next(k for k, v in self._tags.items() if v == marker)
        n = len(self._held)
        return list(ids[n:]) if tuple(self._held) == ids[:n] else list(ids)

    def _is_prefix(self, seq: list[int]) -> bool:
        n = len(seq)
        return any(n < len(ids) and ids[:n] == tuple(seq) for ids in self._tags)
