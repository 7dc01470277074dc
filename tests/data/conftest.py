import pytest

# ChatML that keeps only the latest assistant turn's content, as Qwen3's thinking template drops
# the reasoning of earlier turns: rendering one more message rewrites what came before.
FORGETFUL_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] != 'assistant' or loop.last %}{{ m['content'] }}"
    "{% for c in (m['tool_calls'] or []) %}<tool_call>{{ c['function'] | tojson }}</tool_call>{% endfor %}"
    "{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture()
def forgetful_template() -> str:
    """A chat template that is not prefix-preserving (multi-turn training renders each turn)."""
    return FORGETFUL_TEMPLATE
