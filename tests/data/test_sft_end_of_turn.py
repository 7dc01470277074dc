"""Multi-turn SFT for models whose turns end with a token other than the tokenizer's EOS (Gemma 2's
``<end_of_turn>`` beside ``<eos>``): each assistant turn is trained up to and including the first
of the model's end ids (``models.loading.eos_token_ids``: the tokenizer's EOS plus the model's
``generation_config.eos_token_id``), never past it, and no ``<eos>`` is appended after a turn that
such a token already ended. The SFT trainer passes the model's end ids, for a model object and
for a model directory alike."""

import pytest

from rlhfkit.data.chat_templates import assistant_spans
from rlhfkit.data.sft import IGNORE_INDEX, encode_sft_rows, example_labels
from rlhfkit.data.sft_turns import encode_conversation, encode_turn_by_turn
from rlhfkit.models.loading import eos_token_ids
from rlhfkit.tasks.tiny import chatml_tokenizer, save_tiny_model, tiny_causal_lm, tiny_turn_end_lm
from rlhfkit.trainers.sft import SFTConfig, SFTTrainer

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

END = "<|im_end|>"
CONVERSATION = [
    {"role": "user", "content": "Hi!"},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "Bye?"},
    {"role": "assistant", "content": "Bye."},
]
TURNS = ["Hello.<|im_end|>", "Bye.<|im_end|>"]
FAST = dict(learning_rate=1e-2, batch_size=4, log_every=0, lr_scheduler="constant")


@pytest.fixture
def tok():
    """ChatML whose turns end with <|im_end|> while the tokenizer's EOS is a separate <eos>."""
    return chatml_tokenizer(eos_token="<eos>")


def trained_runs(tok, e) -> list[str]:
    """The labelled tokens of an example, decoded (special tokens kept), one string per run."""
    runs, current = [], []
    for token, label in zip(e.input_ids, example_labels(e)):
        if label != IGNORE_INDEX:
            current.append(token)
        elif current:
            runs, current = runs + [tok.decode(current)], []
    return runs + ([tok.decode(current)] if current else [])


def check_turns(tok, e) -> None:
    """Each assistant reply plus its <|im_end|> trained, nothing else; no <eos>, nothing after."""
    assert trained_runs(tok, e) == TURNS
    assert tok.eos_token_id not in e.input_ids
    assert e.input_ids[-1] == tok.convert_tokens_to_ids(END)


def test_two_turn_conversation_trains_each_reply_and_its_end_of_turn(tok):
    ends = eos_token_ids(tok, tiny_turn_end_lm(tok))
    assert len(ends) == 2
    [e] = encode_sft_rows([{"messages": CONVERSATION}], tok, None, end_ids=ends)
    check_turns(tok, e)
    text, spans = assistant_spans(tok, CONVERSATION, end_ids=ends)
    assert [text[a:b] for a, b in spans] == TURNS


def test_a_rewriting_template_trains_each_turn_to_its_end_of_turn(tok, forgetful_template):
    tok.chat_template = forgetful_template
    ends = eos_token_ids(tok, tiny_causal_lm(tok, end_of_turn=END))
    examples = encode_turn_by_turn(CONVERSATION, tok, None, end_ids=ends)
    assert [run for e in examples for run in trained_runs(tok, e)] == TURNS
    assert all(tok.eos_token_id not in e.input_ids for e in examples)


def test_the_tokenizers_eos_alone_is_unchanged(tok):
    """Without the model's end ids the turn-end tokenizer behaves as before (the turn runs to the
    end of its rendering, <eos> appended); a single-EOS model's ids change nothing at all."""
    [old] = encode_sft_rows([{"messages": CONVERSATION}], tok, None)
    assert trained_runs(tok, old)[-1] == "Bye.<|im_end|>\n<eos>"
    assert old == encode_conversation(CONVERSATION, tok, end_ids=eos_token_ids(tok))
    plain = chatml_tokenizer()
    ends = eos_token_ids(plain, tiny_causal_lm(plain))
    assert ends == (plain.eos_token_id,)
    assert encode_sft_rows([{"messages": CONVERSATION}], plain, None, end_ids=ends) == encode_sft_rows(
        [{"messages": CONVERSATION}], plain, None
    )


def test_a_template_without_end_text_still_gets_the_tokenizers_eos(tok):
    tok.chat_template = (
        "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}"
    )
    ends = eos_token_ids(tok, tiny_causal_lm(tok, end_of_turn=END))
    e = encode_conversation(CONVERSATION, tok, end_ids=ends)
    assert trained_runs(tok, e)[-1] == "Bye.<eos>"
    [last] = encode_turn_by_turn(CONVERSATION, tok, end_ids=ends)
    assert trained_runs(tok, last)[-1] == "Bye.<eos>"


@pytest.mark.parametrize("source", ["object", "directory"])
def test_the_sft_trainer_ends_turns_at_the_models_end_ids(tok, tmp_path, source):
    rows = [{"messages": CONVERSATION}] * 4
    if source == "object":
        trainer = SFTTrainer(tiny_turn_end_lm(tok, hidden_size=32), SFTConfig(**FAST), rows, processing_class=tok)
    else:
        path = save_tiny_model(tmp_path / "model", tok, hidden_size=32, end_of_turn=END)
        trainer = SFTTrainer(path, SFTConfig(**FAST), rows)
    for [e] in trainer.units:
        check_turns(trainer.tokenizer, e)


def test_a_model_directory_without_a_generation_config_reads_its_config(tok, tmp_path):
    """No generation_config.json: the end ids transformers builds from config.json (here the
    tokenizer's EOS alone), so the turn runs to the end of its rendering, <eos> appended."""
    path = save_tiny_model(tmp_path / "model", tok, hidden_size=32, end_of_turn=END)
    (tmp_path / "model" / "generation_config.json").unlink()
    trainer = SFTTrainer(path, SFTConfig(**FAST), [{"messages": CONVERSATION}] * 4)
    assert trainer.end_ids == (tok.eos_token_id,)
    assert trained_runs(tok, trainer.units[0][0])[-1] == "Bye.<|im_end|>\n<eos>"
