"""Multi-turn SFT with a chat template that rewrites history (Qwen3-style <think> handling): every
assistant turn is trained exactly once, as the model would see it — after the template's
rendering of the conversation before it, with its own reasoning — in as many examples as the
rewrites need; a prefix-preserving template keeps its one example."""

import pytest

from rlhfkit.data.chat_templates import render
from rlhfkit.data.sft import IGNORE_INDEX, encode_sft_rows, example_labels
from rlhfkit.data.sft_turns import encode_conversation, encode_turn_by_turn
from rlhfkit.tasks.tiny import chatml_tokenizer, thinking_template, tiny_causal_lm

pytestmark = pytest.mark.usefixtures("one_thread")

CALL = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
CONVERSATION = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "<think>I should look.</think>", "tool_calls": [CALL]},
    {"role": "tool", "content": "22 C"},
    {"role": "assistant", "content": "<think>\nIt says 22.\n</think>\n\nIt is 22 C."},
    {"role": "user", "content": "Thanks!"},
    {"role": "assistant", "content": "<think>Be polite.</think>You are welcome."},
]
TURNS = [1, 3, 5]


def runs(tok, e):
    """(context before each trained run, the run) of an example, decoded."""
    out, current, start = [], [], None
    for j, (token, label) in enumerate(zip(e.input_ids, example_labels(e))):
        if label != IGNORE_INDEX:
            start = j if not current else start
            current.append(token)
        elif current:
            out, current = out + [(tok.decode(e.input_ids[:start]), tok.decode(current))], []
    return out + ([(tok.decode(e.input_ids[:start]), tok.decode(current))] if current else [])


@pytest.mark.parametrize("keep,examples", [(True, 2), (False, 3)])
def test_each_assistant_turn_is_trained_once_as_the_model_would_see_it(keep, examples):
    tok = chatml_tokenizer()
    tok.chat_template = thinking_template(keep)
    encoded = encode_sft_rows([{"messages": CONVERSATION}], tok, None)
    assert len(encoded) == examples  # a new example wherever the template rewrote the history
    trained = [run for e in encoded for run in runs(tok, e)]
    assert len(trained) == len(TURNS)  # every assistant turn exactly once
    for k, (context, turn) in zip(TURNS, trained):
        prompt = render(tok, CONVERSATION[:k], None, generation=True)
        assert context.endswith(prompt)  # after the template's rendering of the conversation before it
        assert turn + "\n" == render(tok, CONVERSATION[: k + 1])[len(prompt) :]  # the turn as rendered last
        assert turn.startswith("<think>\n") and turn.endswith("<|im_end|>")  # its own reasoning, to the EOS
    for e in encoded:  # each example is one sequence the model saw: its first context is a whole rendering
        assert tok.decode(e.input_ids).startswith("<|im_start|>user\nWeather in Paris?")


def test_a_prefix_preserving_template_keeps_its_one_example():
    tok = chatml_tokenizer()
    whole = encode_conversation(CONVERSATION, tok)
    [turn_by_turn] = encode_turn_by_turn(CONVERSATION, tok)
    assert (turn_by_turn.input_ids, turn_by_turn.mask) == (whole.input_ids, whole.mask)
    assert encode_sft_rows([{"messages": CONVERSATION}], tok, None) == [whole]


def test_sft_trains_on_conversations_with_a_thinking_template():
    from rlhfkit.trainers.sft import SFTConfig, SFTTrainer

    tok = chatml_tokenizer()
    tok.chat_template = thinking_template(False)
    config = SFTConfig(max_steps=1, batch_size=3, log_every=0, max_length=256)
    trainer = SFTTrainer(
        tiny_causal_lm(tok, hidden_size=32), config, [{"messages": CONVERSATION}], processing_class=tok
    )
    assert len(trainer.units) == 3 and trainer.train()[-1]["sft/loss"] > 0
