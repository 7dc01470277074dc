"""Data changed on the way in is said once on stderr, with the count: rows longer than max_length
cut by sft, rm and dpo (and how to avoid it), and rows holding text the tokenizer reads as its
unknown token, in sft, rm, dpo and rl data. Clean data says nothing."""

import pytest

from rlhfkit.config import RLConfig
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
from rlhfkit.trainers import (
    DPOConfig,
    DPOTrainer,
    RewardModelConfig,
    RewardModelTrainer,
    RLTrainer,
    SFTConfig,
    SFTTrainer,
)

LONG = "abcdefghij" * 3  # 30 characters: longer than max_length=16 with any completion
ROWS = [
    {"prompt": LONG, "completion": "ab"},
    {"prompt": "ab=", "completion": "XYZ"},
    {"prompt": "cd=", "completion": "dc"},
]
PAIRS = [
    {"prompt": LONG, "chosen": "ab", "rejected": "ba"},
    {"prompt": "ab", "chosen": "ÄÖ", "rejected": "ba"},
    {"prompt": "cd", "chosen": "cd", "rejected": "dc"},
]
CLEAN_ROWS = [{"prompt": "ab=", "completion": "ba"}]
CLEAN_PAIRS = [{"prompt": "ab", "chosen": "ab", "rejected": "ba"}]


def warnings_of(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("warning:")]


@pytest.mark.parametrize("kind", ["sft", "rm", "dpo"])
def test_cut_rows_and_unknown_text_are_each_said_once_with_their_count(kind, capsys):
    tok = char_tokenizer()
    model = tiny_causal_lm(tok, hidden_size=32, seed=0)
    common = dict(max_length=16, max_steps=0, log_every=0)
    if kind == "sft":
        SFTTrainer(model, SFTConfig(**common), ROWS, eval_dataset=CLEAN_ROWS, processing_class=tok)
        what, cut = "rows", "the prompt's start first, then the completion's end and its EOS"
    else:
        trainer, config = (RewardModelTrainer, RewardModelConfig) if kind == "rm" else (DPOTrainer, DPOConfig)
        trainer(model, config(**common), PAIRS, eval_dataset=CLEAN_PAIRS, processing_class=tok)
        what, cut = "pairs", "the prompt's start"
    lines = warnings_of(capsys.readouterr().err)
    assert lines == [
        f"warning: train_dataset: 1 of 3 {what} are longer than max_length=16 tokens and were cut ({cut}); raise "
        "max_length to keep them whole",
        f"warning: train_dataset: 1 of 3 {what} hold text the tokenizer does not know, read as its unknown token "
        "'<unk>'; check the data's characters, or use a tokenizer that covers them",
    ]  # and nothing about the clean eval_dataset


def test_rl_prompts_with_unknown_text_are_said_once(capsys):
    tok = char_tokenizer()
    prompts = [{"prompt": "ab"}, {"prompt": "Hello"}, {"prompt": "WORLD"}, {"prompt": "cd"}]
    RLTrainer(
        tiny_causal_lm(tok, hidden_size=32, seed=0),
        [lambda prompts, completions, **kw: [0.0] * len(prompts)],
        RLConfig(max_steps=0, max_new_tokens=4, prompts_per_step=2, log_every=0),
        train_dataset=prompts,
        eval_dataset=[{"prompt": "ef"}],
        processing_class=tok,
    )
    assert warnings_of(capsys.readouterr().err) == [
        "warning: train_dataset: 2 of 4 prompts hold text the tokenizer does not know, read as its unknown token "
        "'<unk>'; check the data's characters, or use a tokenizer that covers them"
    ]
