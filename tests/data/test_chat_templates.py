"""Chat templates: the forms of the chat_template option, the shipped chatml_tools template
(renders tools and tool calls through apply_chat_template, prefix-preserving), the refusal of
templates multi-turn training cannot use, and the assistant spans every turn is trained on."""

import pytest

from rlhfkit.config.supervised import SFTConfig
from rlhfkit.data.chat_templates import (
    PROBE,
    PROBE_TOOLS,
    assistant_spans,
    check_prefix_preserving,
    render,
    resolve_chat_template,
    use_chat_template,
)
from rlhfkit.tasks.tiny import char_tokenizer, chatml_tokenizer


def _one_line_error(call) -> str:
    with pytest.raises(ValueError) as err:
        call()
    assert "\n" not in str(err.value)
    return str(err.value)


# ---------------------------------------------------------------- the option


def test_resolve_chat_template_forms(tmp_path):
    shipped = resolve_chat_template("chatml_tools")
    assert "<tool_call>" in shipped and "<|im_start|>" in shipped
    assert resolve_chat_template(None) is None
    path = tmp_path / "t.jinja"
    path.write_text("{{ messages[0]['content'] }}", encoding="utf-8")
    assert resolve_chat_template(str(path)) == "{{ messages[0]['content'] }}"
    inline = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert resolve_chat_template(inline) == inline


@pytest.mark.parametrize("value", ["chatml", "no/such/file.jinja", "", 3])
def test_resolve_chat_template_refuses_anything_else(value):
    message = _one_line_error(lambda: resolve_chat_template(value, field="my_template"))
    assert message.startswith("my_template: ")
    if isinstance(value, str):
        assert "chatml_tools" in message and "file" in message and "inline" in message


def test_use_chat_template_sets_it_or_keeps_the_tokenizers_own():
    tok = char_tokenizer()
    own = tok.chat_template
    assert use_chat_template(tok, None).chat_template == own
    assert use_chat_template(tok, "chatml_tools").chat_template == resolve_chat_template("chatml_tools")
    bare = char_tokenizer()
    bare.chat_template = None
    assert use_chat_template(bare, None).chat_template is None


def test_sft_config_field_defaults_to_the_tokenizers_template():
    assert SFTConfig().chat_template is None
    assert SFTConfig(chat_template="chatml_tools").chat_template == "chatml_tools"


# ---------------------------------------------------------------- the shipped template


def test_shipped_template_renders_tools_and_tool_calls():
    tok = chatml_tokenizer()
    text = tok.apply_chat_template(PROBE, tools=PROBE_TOOLS, add_generation_prompt=False, tokenize=False)
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant.\n\n")
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in text
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        "</tool_call><|im_end|>\n<|im_start|>tool\n<tool_response>\n22 degrees and sunny\n</tool_response>"
        "<|im_end|>\n"
    ) in text
    assert text.endswith("<|im_start|>assistant\nIt is 22 degrees and sunny in Paris.<|im_end|>\n")
    assert "<tools>" not in render(tok, PROBE)  # no tools: no tool list


def test_shipped_template_takes_callables_content_with_calls_and_string_arguments():
    from transformers.utils import get_json_schema

    def get_weather(city: str) -> str:
        """The weather in a city.

        Args:
            city: The city's name.
        """
        return "sunny"

    tok = chatml_tokenizer()
    messages = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                {"type": "function", "function": {"name": "f", "arguments": {"b": 1, "a": 2}}},
                {"type": "function", "function": {"name": "g", "arguments": '{"x": 2}'}},
            ],
        },
    ]
    text = tok.apply_chat_template(messages, tools=[get_weather], tokenize=False)
    assert text == render(tok, messages, [get_json_schema(get_weather)])
    assert (
        'Let me look.\n<tool_call>\n{"name": "f", "arguments": {"b": 1, "a": 2}}\n</tool_call>\n'
        '<tool_call>\n{"name": "g", "arguments": {"x": 2}}\n</tool_call><|im_end|>'
    ) in text
    assert '"description": "The city\'s name."' in text


@pytest.mark.parametrize("tools", [None, PROBE_TOOLS])
def test_shipped_template_is_prefix_preserving(tools):
    check_prefix_preserving(chatml_tokenizer(), "chatml", tools)


# ---------------------------------------------------------------- refusals


def test_a_template_that_rewrites_earlier_turns_is_refused_naming_the_model(forgetful_template):
    tok = chatml_tokenizer()
    tok.chat_template = forgetful_template
    message = _one_line_error(lambda: check_prefix_preserving(tok, "org/thinking-model"))
    assert message.startswith("org/thinking-model: the chat template is not prefix-preserving (adding message 3 (tool)")
    assert "set chat_template (e.g. 'chatml_tools'" in message


def test_templates_that_drop_or_cannot_render_tool_calls_are_refused():
    message = _one_line_error(lambda: check_prefix_preserving(char_tokenizer(), "tiny"))
    assert message.startswith("tiny: the chat template cannot render tool calls (it drops the tool call)")
    tok = chatml_tokenizer()
    tok.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tools') }}"
        "{% endif %}{{ m['content'] }}{% endfor %}"
    )
    message = _one_line_error(lambda: check_prefix_preserving(tok, "strict"))
    assert message.startswith("strict: the chat template cannot render a tool-call conversation (")
    assert "no tools" in message


# ---------------------------------------------------------------- assistant spans


def test_assistant_spans_cover_content_calls_and_eos_not_headers_or_glue():
    tok = chatml_tokenizer()
    text, spans = assistant_spans(tok, PROBE, PROBE_TOOLS)
    assert text == render(tok, PROBE, PROBE_TOOLS)
    assert [text[s:e] for s, e in spans] == [
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>',
        "It is 22 degrees and sunny in Paris.<|im_end|>",
    ]
    for start, end in spans:
        assert text[:start].endswith("<|im_start|>assistant\n") and text[end : end + 1] in ("\n", "")


def test_assistant_spans_without_eos_text_end_with_the_turn():
    tok = char_tokenizer()  # its template ends a turn with "\n", no EOS text
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"},
        {"role": "user", "content": "ok"},
        {"role": "assistant", "content": "ya"},
    ]
    text, spans = assistant_spans(tok, messages)
    assert text == "u:hi\na:yo\nu:ok\na:ya\n"
    assert [text[s:e] for s, e in spans] == ["yo\n", "ya\n"]


def test_assistant_spans_refuse_a_rewriting_template(forgetful_template):
    tok = chatml_tokenizer()
    tok.chat_template = forgetful_template
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"},
        {"role": "user", "content": "ok"},
        {"role": "assistant", "content": "ya"},
    ]
    message = _one_line_error(lambda: assistant_spans(tok, messages, name="org/m"))
    assert message.startswith("org/m: the chat template is not prefix-preserving")
    message = _one_line_error(lambda: assistant_spans(tok, messages[1:], name="org/m"))
    assert "starts with a system or user message" in message
