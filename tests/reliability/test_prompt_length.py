"""Prompt length: by default a prompt may take what the model can (its positions minus
max_new_tokens); a longer one is refused in one line naming its row — in training and in
evaluation, before any generation — or cut from the left when the user asks."""

import time

import pytest

from rlhfkit.config import RLConfig
from rlhfkit.rl.evaluate import evaluate_policy
from rlhfkit.rollout import SamplingParams
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
from rlhfkit.trainers import RLTrainer


def reward(prompts, completions, **kwargs):
    return [float(len(c)) for c in completions]


def trainer(prompts, **overrides):
    tok = char_tokenizer()
    args = dict(algorithm="grpo", max_steps=1, max_new_tokens=4, prompts_per_step=2, log_every=0)
    args.update(overrides)
    return RLTrainer(
        tiny_causal_lm(tok, hidden_size=32, seed=0),
        [reward],
        RLConfig(**args),
        train_dataset=[{"prompt": p} for p in prompts],
        processing_class=tok,
    )


def test_by_default_a_prompt_may_take_the_model_positions_minus_max_new_tokens():
    # the tiny model has 256 positions: 252 prompt tokens fit with 4 new ones, 253 do not
    assert len(trainer(["a" * 252, "b"]).sampler.prompt_ids[0]) == 252
    with pytest.raises(ValueError) as err:
        trainer(["ab", "a" * 253])
    assert str(err.value) == (
        "train_dataset: row index 1 (0-based): the prompt is 253 tokens, longer than 252 "
        "(max_prompt_length, by default the model's positions minus max_new_tokens); set "
        "truncate_prompts=left to keep its last tokens, or shorten it"
    )


def test_an_explicit_limit_refuses_or_cuts_from_the_left():
    with pytest.raises(ValueError, match="row index 0 .*the prompt is 6 tokens, longer than 3"):
        trainer(["abcdef", "ab"], max_prompt_length=3)
    cut = trainer(["abcdef", "ab"], max_prompt_length=3, truncate_prompts="left")
    tok = cut.tokenizer
    assert tok.decode(cut.sampler.prompt_ids[0]) == "def" and len(cut.sampler.prompt_ids[1]) == 2
    cut.train()  # and it trains
    with pytest.raises(ValueError, match="'truncate_prompts' must be None or 'left'"):
        RLConfig(truncate_prompts="right")


def test_eval_prompts_follow_the_same_rule():
    with pytest.raises(ValueError, match="eval_dataset: row index 0 .*longer than 252"):
        tok = char_tokenizer()
        RLTrainer(
            tiny_causal_lm(tok, hidden_size=32),
            [reward],
            RLConfig(max_steps=1, max_new_tokens=4, prompts_per_step=2, log_every=0),
            train_dataset=[{"prompt": "ab"}],
            eval_dataset=[{"prompt": "x" * 300}],
            processing_class=tok,
        )


def test_evaluating_a_megabyte_prompt_is_refused_at_once(tmp_path):
    tok = char_tokenizer()
    model = tiny_causal_lm(tok, hidden_size=32)
    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"eval dataset: row index 0 \(0-based\): the prompt is 1000000 tokens"):
        evaluate_policy(
            model, [reward], [{"prompt": "a" * 1_000_000}], tokenizer=tok, sampling=SamplingParams(max_new_tokens=4)
        )
    assert time.perf_counter() - start < 60
