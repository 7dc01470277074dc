"""A prompt-completion row whose chat completion holds several messages (``sft_turns.encode_completion_turns``):
which tokens train under ``completion_only`` / ``assistant_only``, read back as text."""

import pytest

from rlhfkit.data.sft import encode_sft_rows, load_sft_dataset
from rlhfkit.tasks.tiny import chatml_tokenizer

TOK = chatml_tokenizer()
U = lambda c: {"role": "user", "content": c}  # noqa: E731
A = lambda c: {"role": "assistant", "content": c}  # noqa: E731
ROW = {"prompt": [U("hi"), A("yo"), U("go")], "completion": [A("one"), U("more"), A("two")]}


def trained(row, **flags) -> list[str]:
    """The trained stretches of the row's one example, as text."""
    (e,) = encode_sft_rows(load_sft_dataset([row]), TOK, None, **flags)
    stretches, run = [], []
    for t, m in [*zip(e.input_ids, e.mask), (None, 0)]:
        if m:
            run.append(t)
        elif run:
            stretches, run = [*stretches, TOK.decode(run)], []
    return stretches


def test_the_completions_assistant_turns_train_with_both_flags():
    assert trained(ROW, completion_only=True, assistant_only=True) == ["one<|im_end|>", "two<|im_end|>"]


def test_every_assistant_turn_trains_without_completion_only():
    expected = ["yo<|im_end|>", "one<|im_end|>", "two<|im_end|>"]
    assert trained(ROW, completion_only=False, assistant_only=True) == expected


def test_every_token_after_the_prompt_trains_without_assistant_only():
    (text,) = trained(ROW, completion_only=True, assistant_only=False)
    assert text.startswith("one<|im_end|>") and "more" in text and "two" in text
    assert "yo" not in text and "go" not in text


@pytest.mark.parametrize(
    "completion, says",
    [
        ([U("x"), A("y")], "must start and end with the assistant's, got roles ['user', 'assistant']"),
        ([A("y"), U("x")], "must start and end with the assistant's"),
        ([A("y"), {"role": "user"}], "message 1 (0-based)"),
    ],
)
def test_a_bad_completion_of_several_messages_is_one_line(completion, says):
    with pytest.raises(ValueError) as err:
        load_sft_dataset([{"prompt": [U("hi")], "completion": completion}])
    assert says in str(err.value) and "field 'completion'" in str(err.value)
