"""Chat templates in the sandbox, reasoning split, stop tokens: literal inputs."""

from types import SimpleNamespace

import pytest

from sparkd.engine.chat import ChatTemplate, ChatTemplateError, Reply, split_reasoning, stop_token_ids

CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_chatml_renders_messages_and_generation_prompt():
    t = ChatTemplate(CHATML)
    out = t.render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert out == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                   "<|im_start|>assistant\n")
    assert not t.render([{"role": "user", "content": "Hi"}], add_generation_prompt=False).endswith("assistant\n")


def test_bos_token_and_trim_blocks_like_transformers():
    t = ChatTemplate("{{ bos_token }}{% for m in messages %}\n  {% if m.role == 'user' %}\n"
                     "<u>{{ m.content }}</u>\n  {% endif %}\n{% endfor %}", bos_token="<s>")
    assert t.render([{"role": "user", "content": "x"}]) == "<s><u>x</u>\n"


def test_tojson_keeps_unicode_and_extra_kwargs_reach_the_template():
    t = ChatTemplate("{{ tools | tojson }}|{{ enable_thinking }}")
    assert t.render([], tools=[{"name": "天気"}], enable_thinking=False) == '[{"name": "天気"}]|False'


def test_strftime_now_and_loopcontrols():
    t = ChatTemplate("{{ strftime_now('%Y') | length }}{% for i in [1,2,3] %}{% if i == 2 %}{% break %}"
                     "{% endif %}{{ i }}{% endfor %}")
    assert t.render([]) == "41"


def test_raise_exception_becomes_a_clear_error():
    t = ChatTemplate("{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}")
    with pytest.raises(ChatTemplateError, match="could not render the chat template.*first must be user"):
        t.render([{"role": "assistant", "content": "x"}])


def test_sandbox_blocks_attribute_escape():
    t = ChatTemplate("{{ messages.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(ChatTemplateError):
        t.render([])


def test_sandbox_is_immutable():
    t = ChatTemplate("{% set _ = messages.append({'role': 'x'}) %}{{ messages | length }}")
    with pytest.raises(ChatTemplateError):
        t.render([{"role": "user", "content": "a"}])


def test_syntax_error_names_line():
    with pytest.raises(ChatTemplateError, match="could not parse the chat template.*line 2"):
        ChatTemplate("ok\n{% for %}")


def test_message_without_role_is_refused():
    with pytest.raises(ChatTemplateError, match="message 1 has no 'role'"):
        ChatTemplate(CHATML).render([{"role": "user", "content": "a"}, {"content": "b"}])


def test_from_metadata_uses_tokenizer_bos_eos_and_requires_a_template():
    tok = SimpleNamespace(tokens=["<pad>", "<s>", "</s>"], bos_id=1, eos_id=2)
    t = ChatTemplate.from_metadata({"tokenizer.chat_template": "{{ bos_token }}|{{ eos_token }}"}, tok)
    assert t.render([]) == "<s>|</s>"
    with pytest.raises(ChatTemplateError, match="tokenizer.chat_template' is missing"):
        ChatTemplate.from_metadata({}, tok, origin="m.gguf")


@pytest.mark.parametrize("text,content,reasoning", [
    ("<think>\nplan it\n</think>\n\nThe answer.", "The answer.", "plan it"),
    ("no markup here", "no markup here", None),
    ("<think>still thinking", "", "still thinking"),
    ("<seed:think>a</seed:think>b", "b", "a"),
    ("◁think▷a◁/think▷b", "b", "a"),
])
def test_split_reasoning(text, content, reasoning):
    r = split_reasoning(text)
    assert (r.content, r.reasoning_content) == (content, reasoning)


def test_split_reasoning_when_prompt_opened_the_block():
    r = split_reasoning("weighing options</think>Go left.", in_reasoning=True)
    assert (r.content, r.reasoning_content) == ("Go left.", "weighing options")
    r = split_reasoning("cut off mid-thought", in_reasoning=True)
    assert (r.content, r.reasoning_content) == ("", "cut off mid-thought")


def test_stop_token_ids_are_the_tokenizer_eog_set():
    assert stop_token_ids(SimpleNamespace(eog_ids=frozenset({1, 106}))) == {1, 106}


# Kimi K3's template as llama.cpp ships it (models/templates/Kimi-K3.jinja in the vendored source)
def _k3_template() -> ChatTemplate:
    from tests.oracle.llama_oracle import llama_source_dir

    path = llama_source_dir() / "models" / "templates" / "Kimi-K3.jinja"
    if not path.exists():
        pytest.skip(f"the vendored llama.cpp source has no {path}")
    return ChatTemplate(path.read_text())


K3_MSGS = [{"role": "user", "content": "Hi"},
           {"role": "assistant", "content": "Hello!", "reasoning_content": "greet back"},
           {"role": "user", "content": "2+2?"}]


def test_kimi_k3_template_opens_the_think_section_and_replays_reasoning():
    out = _k3_template().render(K3_MSGS)
    assert ('<|open|>message role="assistant"<|sep|><|open|>think<|sep|>greet back<|close|>think<|sep|>'
            '<|open|>response<|sep|>Hello!<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>') in out
    assert out.endswith('<|open|>message role="assistant"<|sep|><|open|>think<|sep|>')
    assert _k3_template().render(K3_MSGS, thinking=False).endswith("<|open|>response<|sep|>")


def test_kimi_k3_reply_goes_to_reasoning_content_and_content():
    reply = ("The sum is 4.<|close|>think<|sep|><|open|>response<|sep|>4<|close|>response<|sep|>"
             "<|close|>message<|sep|>")
    assert split_reasoning(reply, in_reasoning=True) == Reply("4", "The sum is 4.")
    # the think opener generated rather than prompted; and thinking off (the prompt opened the answer)
    assert split_reasoning("<|open|>think<|sep|>" + reply) == Reply("4", "The sum is 4.")
    assert split_reasoning("4<|close|>response<|sep|><|close|>message<|sep|>") == Reply("4", None)
    # cut off while thinking: all reasoning
    assert split_reasoning("The sum", in_reasoning=True) == Reply("", "The sum")
