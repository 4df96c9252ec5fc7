"""ReplyBuilder on literal token lists with the generated tokenizer: stop strings split across
tokens, reasoning and content channels, finish reasons."""

from __future__ import annotations

import pytest

from sparkd.engine.modelgen.tokenizer import make_tokenizer
from sparkd.engine.chat import ANSWER_TAGS, THINK_TAGS, split_reasoning
from sparkd.engine.server.reply import Delta, ReplyBuilder
from sparkd.engine.think import ThinkTags, find_think_tags
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
    think = find_think_tags(tok, THINK_TAGS)
    assert think == ThinkTags((tok.ids["<think>"],), (tok.ids["</think>"],), "<think>", "</think>")
    ids = [*think.open_ids] + _bytes(tok, "plan") + [*think.close_ids] + _bytes(tok, "answer")
    b = ReplyBuilder(tok, think=think)
    out = _run(b, ids)
    assert (out.reasoning, out.content, b.saw_reasoning) == ("plan", "answer", True)


def test_starting_inside_reasoning_and_cut_off(tok):
    think = find_think_tags(tok, THINK_TAGS)
    b = ReplyBuilder(tok, think=think, starts_in_reasoning=True)
    out = _run(b, _bytes(tok, "still thinking"))
    assert (out.reasoning, out.content, b.finish_reason) == ("still thinking", "", "length")


def test_without_think_tags_the_tags_are_plain_tokens(tok):
    b = ReplyBuilder(tok)
    out = _run(b, [tok.ids["<think>"]] + _bytes(tok, "x"))
    assert (out.reasoning, out.content) == ("", "x")  # control tokens decode to nothing


# --- Kimi K3: tags of several tokens (<|open|> think <|sep|> ... <|close|> think <|sep|>) ----------

def k3_tokenizer_metadata(n_vocab: int = 512) -> dict:
    """The generated tokenizer with K3's section markers in place of <think>/</think>."""
    spec = make_tokenizer(n_vocab)
    rename = {"<think>": "<|open|>", "</think>": "<|close|>", "[PAD0]": "<|sep|>"}
    tokens = [rename.get(t, t) for t in spec.tokens]
    types = list(spec.types)
    types[tokens.index("<|sep|>")] = types[tokens.index("<|open|>")]  # control, like the others
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": spec.merges,
            "tokenizer.ggml.eos_token_id": spec.eos_id, "tokenizer.ggml.bos_token_id": spec.bos_id}


@pytest.fixture(scope="module")
def k3():
    tok = Tokenizer(k3_tokenizer_metadata())
    return tok, find_think_tags(tok, THINK_TAGS)


def _k3_ids(tok, text: str) -> list[int]:
    return tok.encode(text, add_special=False, parse_special=True)


def test_k3_tags_are_found_as_token_sequences(k3):
    tok, think = k3
    assert (think.open_text, think.close_text) == ("<|open|>think<|sep|>", "<|close|>think<|sep|>")
    assert think.open_ids[0] == tok.ids["<|open|>"] and think.close_ids[-1] == tok.ids["<|sep|>"]
    assert len(think.open_ids) > 1 and tok.decode(think.close_ids, special=True) == think.close_text


def test_vocabulary_without_tags_has_none(k3):
    tok, _ = k3
    assert find_think_tags(tok, [("<think>", "</think>")]) is None  # plain bytes, no control token


@pytest.mark.parametrize("starts_in_reasoning", [False, True])
def test_k3_reasoning_then_content(k3, starts_in_reasoning):
    tok, think = k3
    opener = "" if starts_in_reasoning else "<|open|>think<|sep|>"
    b = ReplyBuilder(tok, think=think, starts_in_reasoning=starts_in_reasoning)
    out = _run(b, _k3_ids(tok, opener + "plan it<|close|>think<|sep|>the answer"))
    assert (out.reasoning, out.content, b.saw_reasoning) == ("plan it", "the answer", True)


def test_k3_tag_tokens_send_no_text_until_the_tag_is_decided(k3):
    tok, think = k3
    b = ReplyBuilder(tok, think=think, starts_in_reasoning=True)
    sent = [b.push(t) for t in _k3_ids(tok, "ok<|close|>think<|sep|>")]
    assert [d.reasoning for d in sent[-len(think.close_ids):]] == [""] * len(think.close_ids)
    assert not b.in_reasoning and b.push(_k3_ids(tok, "y")[0]).content == "y"


def test_k3_false_start_is_released_to_the_current_channel(k3):
    tok, think = k3
    b = ReplyBuilder(tok, think=think, starts_in_reasoning=True)
    # <|open|> then "response": not the think tag, so those tokens are reasoning text
    # (<|open|> is a control token and decodes to nothing) and reasoning continues
    out = _run(b, _k3_ids(tok, "a<|open|>response<|sep|>b<|close|>think<|sep|>c"))
    assert (out.reasoning, out.content) == ("aresponseb", "c")


def test_k3_released_tail_that_starts_a_new_tag(k3):
    tok, think = k3
    b = ReplyBuilder(tok, think=think)
    # "<|close|>" then the whole opener: the first token is released, the rest is the tag
    out = _run(b, _k3_ids(tok, "x<|close|><|open|>think<|sep|>why<|close|>think<|sep|>y"))
    assert (out.reasoning, out.content) == ("why", "xy")
    # a half opener broken by the start of a whole one
    out = _run(ReplyBuilder(tok, think=think), _k3_ids(tok, "<|open|>th<|open|>think<|sep|>r"))
    assert (out.reasoning, out.content) == ("r", "th")


def test_k3_tag_cut_by_the_end_of_generation_is_released(k3):
    tok, think = k3
    b = ReplyBuilder(tok, think=think, starts_in_reasoning=True)
    ids = _k3_ids(tok, "deep<|close|>think")  # the generation ran out inside the close tag
    out = _run(b, ids)
    assert (out.reasoning, out.content, b.finish_reason) == ("deepthink", "", "length")
    b = ReplyBuilder(tok, think=think, starts_in_reasoning=True)
    out = _run(b, ids + [tok.ids["<|im_end|>"]])
    assert (out.reasoning, b.finish_reason, b.completion_tokens) == ("deepthink", "stop", len(ids) + 1)


def test_k3_stop_string_inside_reasoning(k3):
    tok, think = k3
    b = ReplyBuilder(tok, stop=["lan"], think=think)
    out = _run(b, _k3_ids(tok, "<|open|>think<|sep|>plan<|close|>think<|sep|>answer"))
    assert (out.reasoning, out.content, b.finish_reason) == ("p", "", "stop")
    # a stop string that the released tokens of a false start complete
    b = ReplyBuilder(tok, stop=["xthink"], think=think, starts_in_reasoning=True)
    out = _run(b, _k3_ids(tok, "x<|close|>thinking"))
    assert (out.reasoning, b.finish_reason) == ("", "stop")


@pytest.fixture(scope="module")
def k3_answer(k3):
    tok, think = k3
    return tok, think, find_think_tags(tok, ANSWER_TAGS)


@pytest.mark.parametrize("text, starts_in_reasoning, reasoning, content", [
    ("<|open|>think<|sep|>plan<|close|>think<|sep|><|open|>response<|sep|>the answer<|close|>response<|sep|>",
     False, "plan", "the answer"),
    ("plan<|close|>think<|sep|><|open|>response<|sep|>the answer<|close|>response<|sep|>after", True, "plan",
     "the answer"),
    ("the answer<|close|>response<|sep|><|open|>tools<|sep|>x", False, "", "the answer"),  # the prompt opened it
])
def test_k3_answer_wrapper_is_stripped_streamed_and_whole(k3_answer, text, starts_in_reasoning, reasoning, content):
    """Token by token (what a stream sends) and summed (the non-streamed reply): never a tag's
    text, nothing after the answer's close — the same as chat.split_reasoning on the whole text."""
    tok, think, answer = k3_answer
    b = ReplyBuilder(tok, think=think, starts_in_reasoning=starts_in_reasoning, answer=answer)
    deltas = [b.push(t) for t in _k3_ids(tok, text)] + [b.finish()]
    assert "".join(d.reasoning for d in deltas) == reasoning
    assert "".join(d.content for d in deltas) == content
    assert not any(word in d.content + d.reasoning for d in deltas for word in ("response", "tools"))
    whole = split_reasoning(tok.decode(_k3_ids(tok, text), special=True), in_reasoning=starts_in_reasoning)
    assert (whole.reasoning_content or "", whole.content) == (reasoning, content)


def test_k3_answer_tags_found_and_plain_without_them(k3_answer):
    tok, think, answer = k3_answer
    assert (answer.open_text, answer.close_text) == ANSWER_TAGS[0]
    assert answer.open_ids[0] == tok.ids["<|open|>"] and answer.close_ids[0] == tok.ids["<|close|>"]
    # an answer opener inside an unclosed think block ends the reasoning: a stream cannot wait for a
    # close that may never come (the whole-text split keeps such a block all reasoning)
    out = _run(ReplyBuilder(tok, think=think, starts_in_reasoning=True, answer=answer),
               _k3_ids(tok, "plan<|open|>response<|sep|>the answer"))
    assert (out.reasoning, out.content) == ("plan", "the answer")
    # without the answer tags (other families) the same tokens stay text, as before
    out = _run(ReplyBuilder(tok, think=think), _k3_ids(tok, "a<|open|>response<|sep|>b"))
    assert out.content == "aresponseb"
