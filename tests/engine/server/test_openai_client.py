"""The official openai client against a real `sparkd-engine serve` on a tiny generated qwen3moe:
chat and completions, streaming and not, usage, stop sequences, errors, reasoning_content.

Replies are greedy (temperature 0), so the same request gives the same tokens; stop-sequence
tests cut a reference reply at a string taken from its middle and check the cut exactly.
"""

from __future__ import annotations

import httpx
import openai
import pytest

from engine_server import API_KEY, THINK_TEMPLATE, EngineProcess, make_tiny_model, metric_value

CTX = 96
HELLO = [{"role": "user", "content": "Hello, how are you today?"}]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("model") / "tiny.gguf")


@pytest.fixture(scope="module")
def server(model, tmp_path_factory):
    log = tmp_path_factory.mktemp("log") / "engine.log"
    proc = EngineProcess(model, "--ctx", str(CTX), "--api-key", API_KEY, "--alias", "tiny", log=log).start()
    yield proc
    assert proc.stop() == 0, log.read_text()


@pytest.fixture(scope="module")
def client(server):
    return server.client()


def _chat(client, **kw):
    kw.setdefault("temperature", 0)
    return client.chat.completions.create(model="tiny", messages=kw.pop("messages", HELLO), **kw)


def test_models_lists_the_alias(client):
    assert [m.id for m in client.models.list().data] == ["tiny"]


def test_chat_non_streaming_usage_and_length(client):
    r = _chat(client, max_tokens=7)
    choice = r.choices[0]
    assert choice.finish_reason == "length" and choice.message.role == "assistant"
    assert r.usage.completion_tokens == 7
    assert r.usage.total_tokens == r.usage.prompt_tokens + 7 and r.usage.prompt_tokens > 5
    assert choice.message.content  # the random model says something
    assert _chat(client, max_tokens=7).choices[0].message.content == choice.message.content  # greedy repeats


def test_max_completion_tokens_counts(client):
    assert _chat(client, max_completion_tokens=3).usage.completion_tokens == 3


def test_chat_streaming_equals_non_streaming(client):
    ref = _chat(client, max_tokens=9)
    chunks = list(_chat(client, max_tokens=9, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ref.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 9
    assert chunks[-1].usage.prompt_tokens == ref.usage.prompt_tokens


def test_stream_without_usage_option_has_no_usage_chunk(client):
    chunks = list(_chat(client, max_tokens=2, stream=True))
    assert all(c.choices for c in chunks) and all(c.usage is None for c in chunks)


def test_stream_ends_with_done(server):
    body = {"messages": HELLO, "max_tokens": 2, "stream": True, "temperature": 0}
    with httpx.stream("POST", server.base + "/v1/chat/completions", json=body,
                      headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60) as r:
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and r.headers["content-type"].startswith("text/event-stream")


def _stop_in_middle(text: str) -> tuple[str, int]:
    """A 2-character stop string whose first occurrence is after the reply's first 2 characters."""
    for i in range(2, len(text) - 2):
        s = text[i:i + 2]
        if text.find(s) == i and s.strip():
            return s, i
    pytest.skip(f"no usable stop string in the reference reply {text!r}")


@pytest.mark.parametrize("stream", [False, True])
def test_chat_stop_sequence_cuts_exactly(client, stream):
    ref = _chat(client, max_tokens=20).choices[0].message.content
    stop, at = _stop_in_middle(ref)
    if stream:
        chunks = list(_chat(client, max_tokens=20, stop=[stop, "zzzz-never"], stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks)
        finish = [c.choices[0].finish_reason for c in chunks][-1]
    else:
        r = _chat(client, max_tokens=20, stop=stop)
        text, finish = r.choices[0].message.content, r.choices[0].finish_reason
    assert (text, finish) == (ref[:at], "stop")


def test_completions_streaming_and_not(client):
    r = client.completions.create(model="tiny", prompt="The quick brown fox", max_tokens=6, temperature=0)
    assert r.object == "text_completion" and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 6
    chunks = list(client.completions.create(model="tiny", prompt="The quick brown fox", max_tokens=6,
                                            temperature=0, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == r.choices[0].text
    assert chunks[-1].usage.total_tokens == r.usage.total_tokens


def test_completion_stop_sequence(client):
    ref = client.completions.create(model="tiny", prompt="Numbers:", max_tokens=20, temperature=0).choices[0].text
    stop, at = _stop_in_middle(ref)
    r = client.completions.create(model="tiny", prompt="Numbers:", max_tokens=20, temperature=0, stop=[stop])
    assert (r.choices[0].text, r.choices[0].finish_reason) == (ref[:at], "stop")


@pytest.fixture(scope="module")
def client_off(model, tmp_path_factory):
    """The same model served with --prompt-cache off: every prompt from an empty cache."""
    log = tmp_path_factory.mktemp("log_off") / "engine.log"
    proc = EngineProcess(model, "--ctx", str(CTX), "--api-key", API_KEY, "--alias", "tiny", "--prompt-cache", "off",
                         log=log).start()
    yield proc.client()
    assert proc.stop() == 0, log.read_text()


def _cached(r) -> int:
    return r.usage.prompt_tokens_details.cached_tokens


def test_prompt_cache_two_turns_diverging_shorter_cancelled_and_off(server, client, client_off):
    before = server.metrics()
    turn1 = _chat(client, max_tokens=6)
    chat = HELLO + [{"role": "assistant", "content": turn1.choices[0].message.content},
                    {"role": "user", "content": "And tomorrow?"}]
    turn2, turn2_off = _chat(client, messages=chat, max_tokens=6), _chat(client_off, messages=chat, max_tokens=6)
    assert 0 < _cached(turn2) < turn2.usage.prompt_tokens and _cached(turn2_off) == 0
    assert turn2.choices[0].message.content == turn2_off.choices[0].message.content
    reused = metric_value(server.metrics(), "sparkd_engine_prompt_cached_tokens_total")
    assert reused >= metric_value(before, "sparkd_engine_prompt_cached_tokens_total") + _cached(turn2)

    def both(prompt, **kw):
        on, off = (c.completions.create(model="tiny", prompt=prompt, max_tokens=5, temperature=0, **kw)
                   for c in (client, client_off))
        assert on.choices[0].text == off.choices[0].text and _cached(off) == 0
        return _cached(on)
    both("The quick brown fox jumps over the lazy dog")
    assert 0 < both("The quick brown cat sleeps") < both("The quick brown cat sleeps on")  # diverges mid-way
    assert both("The quick") > 0  # shorter: a prefix of what the cache holds
    # a client that hangs up mid-stream: the rows its generation wrote stay usable
    stream = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=40, temperature=0,
                                       stream=True)
    next(iter(stream))
    stream.close()
    assert both("Once upon a time there was") > 0


def test_seed_makes_sampling_reproducible(client):
    a = client.completions.create(model="tiny", prompt="Hello", max_tokens=8, temperature=1.0, seed=7)
    b = client.completions.create(model="tiny", prompt="Hello", max_tokens=8, temperature=1.0, seed=7)
    assert a.choices[0].text == b.choices[0].text


# --- errors -------------------------------------------------------------------------------------

def test_missing_and_wrong_api_key_are_401(server):
    with pytest.raises(openai.AuthenticationError, match="wrong API key"):
        server.client(api_key="nope").models.list()
    r = httpx.post(server.base + "/v1/chat/completions", json={"messages": HELLO}, timeout=10)
    assert r.status_code == 401 and "missing API key" in r.json()["error"]["message"]
    assert httpx.post(server.base + "/admin/cache", json={"budget": "1G"}, timeout=10).status_code == 401


def test_health_and_metrics_need_no_key(server):
    assert server.health()["status"] == "ready"
    assert "sparkd_engine_prompt_tokens_total" in server.metrics()


@pytest.mark.parametrize("kw, field, words", [
    ({"max_tokens": 0}, "max_tokens", "max_tokens=0: it must be at least 1"),
    ({"max_tokens": -3}, "max_tokens", "at least 1"),
    ({"max_completion_tokens": 0}, "max_completion_tokens", "at least 1"),
    ({"n": 2}, "n", "one choice per request"),
    ({"temperature": 3}, "temperature", "less than or equal to 2"),
    ({"extra_body": {"top_k": -1}}, "top_k", "greater than or equal to 0"),
    ({"logit_bias": {"999999": 5}}, "logit_bias", "expected a token id"),
])
def test_bad_values_are_400(client, kw, field, words):
    with pytest.raises(openai.BadRequestError) as err:
        _chat(client, **kw)
    assert err.value.body["param"] == field and words in err.value.body["message"]


def test_wrong_types_and_invalid_json_are_400(server):
    headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
    url = server.base + "/v1/chat/completions"
    r = httpx.post(url, json={"messages": HELLO, "max_tokens": "5"}, headers=headers, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    r = httpx.post(url, json={"messages": "hi"}, headers=headers, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    r = httpx.post(url, content=b'{"messages": [', headers=headers, timeout=10)
    assert r.status_code == 400 and "could not parse the request body as JSON" in r.json()["error"]["message"]
    r = httpx.post(url, content=b"[1, 2]", headers=headers, timeout=10)
    assert r.status_code == 400 and "expected a JSON object" in r.json()["error"]["message"]


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError, match="could not find model 'gpt-9'.*serves 'tiny'"):
        client.chat.completions.create(model="gpt-9", messages=HELLO)


def test_prompt_longer_than_context_names_both_numbers(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="tiny", prompt=list(range(1, CTX + 10)), max_tokens=1)
    assert err.value.body["message"].startswith(f"could not fit the prompt: it has {CTX + 9} tokens and the "
                                                f"context is {CTX} tokens")
    assert err.value.body["code"] == "context_length_exceeded"


def test_max_tokens_beyond_context_is_clipped_to_length(server, client):
    prompt = list(range(1, CTX - 3))  # room for 4 tokens
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=50, temperature=0,
                                  logit_bias=_never_close(server))
    assert (r.choices[0].finish_reason, r.usage.completion_tokens) == ("length", 4)


def test_admin_cache_bad_budget_is_400(server):
    r = httpx.post(server.base + "/admin/cache", json={"budget": "lots"},
                   headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "budget"


# --- reasoning ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def think_server(model, tmp_path_factory):
    d = tmp_path_factory.mktemp("think")
    (d / "template.jinja").write_text(THINK_TEMPLATE)
    proc = EngineProcess(model, "--ctx", str(CTX), "--chat-template-file", str(d / "template.jinja"),
                         "--reasoning-budget", "6", log=d / "engine.log").start()
    yield proc
    assert proc.stop() == 0


def _never_close(server) -> dict[str, int]:
    """logit_bias that keeps the random model from ending or closing the block on its own:
    only the reasoning budget can close it then."""
    from sparkd.engine.tokenizer import Tokenizer, read_gguf_metadata

    tok = Tokenizer(read_gguf_metadata(server.argv[4]))
    return {str(tok.ids[t]): -100 for t in ("</think>", "<|im_end|>", "<|endoftext|>", "<think>")}


def test_reasoning_cut_by_max_tokens_is_reasoning_content_with_length(think_server):
    bias = _never_close(think_server)
    r = _chat(think_server.client(), max_tokens=4, logit_bias=bias)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "length"
    assert msg.content == "" and msg.reasoning_content  # thinking was cut, not an empty failure


def test_reasoning_budget_closes_thinking_so_content_follows(think_server):
    bias = _never_close(think_server)
    r = _chat(think_server.client(), max_tokens=20, logit_bias=bias)
    msg = r.choices[0].message
    assert msg.reasoning_content and msg.content, msg
    assert r.usage.completion_tokens == 20  # 6 reasoning + forced </think> + 13 content
    chunks = list(_chat(think_server.client(), max_tokens=20, logit_bias=bias, stream=True))
    deltas = [c.choices[0].delta for c in chunks]
    reasoning = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
    content = "".join(d.content or "" for d in deltas)
    assert (reasoning, content) == (msg.reasoning_content, msg.content)
    first_content = next(i for i, d in enumerate(deltas) if d.content)
    assert all(not getattr(d, "reasoning_content", None) for d in deltas[first_content:])

