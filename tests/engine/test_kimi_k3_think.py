"""Kimi K3's multi-token think tags end to end: a generated tiny K3 model whose vocabulary has
K3's section markers (<|open|>, <|close|>, <|sep|>), served with llama.cpp's Kimi-K3.jinja; the
reply splits into reasoning and content, and the reasoning budget forces the whole close tag."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import gguf
import pytest

from sparkd.engine.make_model import plan, write_model
from sparkd.engine.modelgen.specs import TINY
from sparkd.engine.runtime import Engine, GenerationRequest, _ReasoningBudget
from sparkd.engine.sampler import SamplingParams
from sparkd.engine.server.generation import Done, Job, run_job
from sparkd.engine.server.metrics import EngineMetrics
from sparkd.engine.server.reply import Delta, ReplyBuilder
from sparkd.engine.think import CLOSE, TagMatcher
from sparkd.engine.tokenizer import NORMAL
from tests.engine.server.test_reply import k3_tokenizer_metadata

TOKEN_KEYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type")


def _with_k3_tokens(src, dst):
    """A copy of the GGUF at src whose token list has K3's markers (same ids, same tensors)."""
    reader = gguf.GGUFReader(src)
    n_vocab = len(reader.get_field("tokenizer.ggml.tokens").contents())
    k3 = k3_tokenizer_metadata(n_vocab)
    writer = gguf.GGUFWriter(dst, reader.get_field("general.architecture").contents())
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        value = k3[field.name] if field.name in TOKEN_KEYS else field.contents()
        writer.add_key_value(field.name, value, kind, sub_type=sub)
    for t in reader.tensors:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in reader.tensors:
        writer.write_tensor_data(t.data)
    writer.close()
    return dst


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from tests.oracle.llama_oracle import llama_source_dir

    template = llama_source_dir() / "models" / "templates" / "Kimi-K3.jinja"
    if not template.exists():
        pytest.skip(f"the vendored llama.cpp source has no {template}")
    d = tmp_path_factory.mktemp("k3think")
    src = write_model(d / "k3.gguf", plan(TINY["kimi-k3"], "F32"), seed=3)[0]
    e = Engine(_with_k3_tokens(src, d / "k3-tokens.gguf"), ctx=256, chat_template=template.read_text())
    e.load()
    yield e
    e.close()


def test_k3_reasoning_budget_forces_the_whole_close_tag_then_content(engine):
    tok, think = engine.tokenizer, engine.think
    assert think is not None and len(think.close_ids) > 1  # found as a token sequence
    prompt, inside = engine.chat_prompt([{"role": "user", "content": "2+2?"}])
    assert inside  # Kimi-K3.jinja's generation prompt opens <|open|>think<|sep|>
    # only plain text tokens: the random model can neither end, nor open or close a tag itself
    bias = {i: -100.0 for i, kind in enumerate(tok.types) if kind != NORMAL}
    # the template's system text outgrows the tiny model's 256 positions: keep the prompt's tail,
    # which ends inside the opened think section
    req = GenerationRequest(prompt[-48:], max_tokens=14, sampling=SamplingParams(temperature=0), logit_bias=bias,
                            think=think, starts_in_reasoning=True, reasoning_budget=3)
    ids = list(engine.generate(req, threading.Event()))
    n_close = len(think.close_ids)
    assert len(ids) == 14 and tuple(ids[3:3 + n_close]) == think.close_ids
    builder = ReplyBuilder(tok, think=think, starts_in_reasoning=True)
    out = builder.push(ids[0])
    for t in ids[1:]:
        out += builder.push(t)
    out += builder.finish()
    assert (out.reasoning, out.content) == (tok.decode(ids[:3]), tok.decode(ids[3 + n_close:]))
    assert out.reasoning and out.content and builder.finish_reason == "length"


def test_budget_completes_a_close_tag_the_model_already_began(engine):
    think = engine.think
    req = GenerationRequest([], max_tokens=9, sampling=SamplingParams(), think=think,
                            starts_in_reasoning=True, reasoning_budget=1)
    budget = _ReasoningBudget(req)
    budget.push(engine.tokenizer.ids["a"])  # one reasoning token: the budget is spent
    for t in think.close_ids[:2]:  # the model began the close tag itself
        budget.push(t)
    forced = []
    while (t := budget.forced()) is not None:
        forced.append(t)
        budget.push(t)
    assert tuple(forced) == think.close_ids[2:] and not budget.inside and budget.thought == 1


def test_matcher_rest_of_a_tag(engine):
    think = engine.think
    m = TagMatcher(think)
    assert m.push(think.close_ids[0]) == [] and m.held == think.close_ids[:1]
    assert m.rest_of(CLOSE) == list(think.close_ids[1:])
    assert m.push(think.open_ids[0]) == [think.close_ids[0]]  # released: a new opener begins
    assert m.rest_of(CLOSE) == list(think.close_ids) and m.flush() == [think.open_ids[0]]


def test_server_generation_strips_the_answer_wrapper_for_chat_only(engine):
    """run_job (the server's decode-thread work, streamed and summed for a whole reply) with the
    real K3 tokenizer and think tags. The tokens are scripted: the tiny random model cannot be
    steered into a tag sequence; everything after the token source is the server's own code."""
    tok = engine.tokenizer
    text = "plan<|close|>think<|sep|><|open|>response<|sep|>the answer<|close|>response<|sep|>"
    ids = tok.encode(text, add_special=False, parse_special=True)
    scripted = SimpleNamespace(tokenizer=tok, generate=lambda req, cancel: (t for t in ids))
    replies = {}
    for kind in ("chat", "completion"):
        req = GenerationRequest([1], max_tokens=len(ids), sampling=SamplingParams(), think=engine.think,
                                starts_in_reasoning=True)
        events = []
        run_job(scripted, EngineMetrics(lambda: None, dict), Job(kind, "k3", req, [], False), events.append)
        deltas = [e for e in events if isinstance(e, Delta)]
        replies[kind] = ("".join(d.reasoning for d in deltas), "".join(d.content for d in deltas))
        assert isinstance(events[-1], Done) and events[-1].completion_tokens == len(ids)
    assert replies["chat"] == ("plan", "the answer")
    assert replies["completion"] == ("", tok.decode(ids))  # raw text: no reasoning split, no stripping
    assert "response" in replies["completion"][1]
