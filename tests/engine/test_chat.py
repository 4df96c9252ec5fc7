"""Chat templates in the sandbox, reasoning split, stop tokens: literal inputs."""

from types import SimpleNamespace

import pytest

from sparkd.engine.chat import ChatTemplate, ChatTemplateError, split_reasoning, stop_token_ids

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
