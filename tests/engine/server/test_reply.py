"""ReplyBuilder on literal token lists with the generated tokenizer: stop strings split across
tokens, reasoning and content channels, finish reasons."""

from __future__ import annotations

import pytest

from sparkd.engine.modelgen.tokenizer import make_tokenizer
from sparkd.engine.runtime import ThinkTags
from sparkd.engine.server.reply import Delta, ReplyBuilder
from sparkd.engine.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tok():
    spec = make_tokenizer(512)
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2", "tokenizer.ggml.tokens": spec.tokens,
          "tokenizer.ggml.token_type": spec.types, "tokenizer.ggml.merges": spec.merges,
          "tokenizer.ggml.eos_token_id": spec.eos_id, "tokenizer.ggml.bos_token_id": spec.bos_id}
    return Tokenizer(md)


def _bytes(tok, text: str) -> list[int]:
    """One token per character, so stop strings straddle token boundaries."""
    return [tok.ids[tok.tokens[tok.encode(c, add_special=False)[0]]] for c in text]


def _run(builder: ReplyBuilder, ids: list[int]) -> Delta:
    out = Delta()
    for t in ids:
        out += builder.push(t)
        if builder.done:
            break
    out += builder.finish()
    return out


def test_stop_string_across_tokens_is_cut_and_never_sent(tok):
    b = ReplyBuilder(tok, stop=["lo w"])
    sent = []
    for t in _bytes(tok, "hello world"):
        sent.append(b.push(t).content)
        if b.done:
            break
    assert "".join(sent) == "hel" and b.finish_reason == "stop" and b.completion_tokens == 7


def test_held_back_prefix_is_released_when_no_stop_follows(tok):
    out = _run(ReplyBuilder(tok, stop=["lox"]), _bytes(tok, "hello"))
    assert (out.content, ) == ("hello",)


def test_eog_token_stops(tok):
    b = ReplyBuilder(tok)
    out = _run(b, _bytes(tok, "hi") + [tok.ids["<|im_end|>"]] + _bytes(tok, "more"))
    assert (out.content, b.finish_reason, b.completion_tokens) == ("hi", "stop", 3)


def test_length_when_tokens_run_out(tok):
    b = ReplyBuilder(tok)
    assert _run(b, _bytes(tok, "abc")).content == "abc" and b.finish_reason == "length"


def test_reasoning_then_content(tok):
    think = ThinkTags(tok.ids["<think>"], tok.ids["</think>"], "<think>", "</think>")
    ids = [think.open_id] + _bytes(tok, "plan") + [think.close_id] + _bytes(tok, "answer")
    b = ReplyBuilder(tok, think=think)
    out = _run(b, ids)
    assert (out.reasoning, out.content, b.saw_reasoning) == ("plan", "answer", True)


def test_starting_inside_reasoning_and_cut_off(tok):
    think = ThinkTags(tok.ids["<think>"], tok.ids["</think>"], "<think>", "</think>")
    b = ReplyBuilder(tok, think=think, starts_in_reasoning=True)
    out = _run(b, _bytes(tok, "still thinking"))
    assert (out.reasoning, out.content, b.finish_reason) == ("still thinking", "", "length")


def test_without_think_tags_the_tags_are_plain_tokens(tok):
    b = ReplyBuilder(tok)
    out = _run(b, [tok.ids["<think>"]] + _bytes(tok, "x"))
    assert (out.reasoning, out.content) == ("", "x")  # control tokens decode to nothing
