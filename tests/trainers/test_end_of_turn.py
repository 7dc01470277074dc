"""A completion the model ends with its own end-of-turn token — not the tokenizer's EOS (Gemma 2's
``<end_of_turn>`` beside ``<eos>``) — has ended: through the RL trainer's own engine, scoring and
experience it gets no missing-EOS penalty, stays in the loss under ``mask_truncated_completions``
and is not counted truncated; completions cut at the limit still are."""

import pytest
import torch

from rlhfkit import RLConfig, RLTrainer
from rlhfkit.rewards.sources import build_rewards
from rlhfkit.rl.evaluate import run_evaluation
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.tasks.tiny import chatml_tokenizer, tiny_turn_end_lm
from rlhfkit.tasks.toy import PROMPTS

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

END = "<|im_end|>"


def one(prompts, completions, **columns):
    return [1.0] * len(completions)


def ended_by_turn_end(rollout, tok) -> torch.Tensor:
    """(B,) rows whose first end token (EOS or end of turn) is the end of turn."""
    eot, out = tok.convert_tokens_to_ids(END), []
    for row in rollout.response_ids.tolist():
        first = next((t for t in row if t in (eot, tok.eos_token_id)), None)
        out.append(first == eot)
    return torch.tensor(out)


def test_turn_end_is_no_truncation_for_the_penalty_the_mask_and_the_metrics():
    tok = chatml_tokenizer(eos_token="<eos>")
    args = RLConfig(
        algorithm="grpo",
        max_new_tokens=8,
        max_steps=1,
        log_every=0,
        seed=0,
        prompts_per_step=4,
        group_size=4,
        save_steps=0,
        missing_eos_penalty=-5.0,
        mask_truncated_completions=True,
        normalize_rewards=False,
        kl_coef=0.0,
    )
    t = RLTrainer(tiny_turn_end_lm(tok, seed=0), [one], args, train_dataset=PROMPTS, processing_class=tok)
    rows = t.sampler.sample_prompts()
    rollout, episodes = t.sampler.generate(rows)
    ended = ended_by_turn_end(rollout, tok)
    cut = rollout.response_mask.sum(-1) == args.max_new_tokens
    cut &= ~ended & ~(rollout.response_ids == tok.eos_token_id).any(-1)
    assert int(ended.sum()) >= 2 and bool(cut.any()), rollout.response_ids.tolist()  # both kinds, by the seed
    assert rollout.has_eos[ended].all() and not rollout.has_eos[cut].any()

    scores, valid, metrics = t.sampler.score(rows, rollout, episodes)
    assert scores[ended].tolist() == [1.0] * int(ended.sum())  # no missing-EOS penalty
    assert scores[cut].tolist() == [-5.0] * int(cut.sum())
    exp = t.make_experience(rollout, scores, valid, metrics)
    assert exp.mask[ended].any(-1).all() and not exp.mask[cut].any()  # mask_truncated_completions
    # the masked tokens end on the end of turn, nothing after it is trained
    eot = tok.convert_tokens_to_ids(END)
    for i in torch.nonzero(ended).flatten().tolist():
        kept = rollout.response_ids[i][exp.mask[i].bool()].tolist()
        assert kept[-1] == eot and eot not in kept[:-1]


def test_evaluation_counts_turn_ends_as_ended():
    """``eval/truncated_frac`` reads ``has_eos``: with the engine ``run_evaluation`` builds from the
    policy and the tokenizer alone, a turn ended by the model's end-of-turn is no truncation."""
    tok = chatml_tokenizer(eos_token="<eos>")
    model = tiny_turn_end_lm(tok, seed=0, end_bias=8.0).eval()  # every completion ends at once
    prompt_ids = [tok(r["prompt"], add_special_tokens=False)["input_ids"] for r in PROMPTS[:2]]
    out = run_evaluation(
        model,
        None,
        tok,
        build_rewards([one], None, tok),
        PROMPTS[:2],
        prompt_ids,
        2,
        SamplingParams(max_new_tokens=6, greedy=True),
        4,
    )
    assert out["metrics"]["eval/truncated_frac"] == 0.0, out["metrics"]
