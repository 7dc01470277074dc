"""The policy loss's token filters in the update (TRL's top_entropy_quantile and
off_policy_mask_threshold): the loss of a micro-batch is the policy loss with the filtered tokens'
weights 0, their place in the normaliser kept; the entropy bonus acts on the kept high-entropy tokens.
The filters themselves: tests/algorithms/test_trl_policy_losses.py."""

from __future__ import annotations

import pytest
import torch

from rlhfkit.algorithms import high_entropy_mask, masked_mean, off_policy_sequence_mask, ppo_policy_loss
from rlhfkit.config import RLConfig, part
from rlhfkit.rl.update import UpdateLoss, loss
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
from rlhfkit.tasks.toy import PROMPTS
from rlhfkit.trainers import RLTrainer

pytestmark = pytest.mark.usefixtures("one_thread")


def varied(prompts, completions, **kwargs):
    return [(sum(map(ord, c)) % 7) / 7 for c in completions]


def experience(**overrides):
    tok = char_tokenizer()
    config = RLConfig(
        algorithm="grpo", max_new_tokens=6, max_steps=1, log_every=0, seed=0, prompts_per_step=2, kl_coef=0.0,
        **overrides,
    )  # fmt: skip
    trainer = RLTrainer(tiny_causal_lm(tok, seed=0), [varied], config, train_dataset=PROMPTS, processing_class=tok)
    rows = trainer.sampler.sample_prompts()
    rollout, _ = trainer.sampler.generate(rows)
    exp = trainer.make_experience(rollout, *trainer.sampler.score(rows, rollout))
    exp.advantages = torch.randn(exp.mask.shape[0], generator=torch.Generator().manual_seed(1))[:, None] * exp.mask
    with torch.no_grad():
        logprobs, _, entropy, *_ = trainer.models.train_outputs(exp.rollout, with_values=False, entropy_grad=False)
    return trainer, exp, logprobs, entropy


def test_the_high_entropy_filter_weighs_only_the_top_tokens():
    trainer, exp, logprobs, entropy = experience(
        top_entropy_quantile=0.25, entropy_coef=0.1, entropy_agg="micro-batch-token-mean"
    )
    rows = torch.arange(exp.mask.shape[0])
    with torch.no_grad():
        got, metrics = loss(trainer.models, part(UpdateLoss, trainer.args), exp, rows, 0.0)
    kept = high_entropy_mask(entropy, exp.mask, 0.75)
    policy, _ = ppo_policy_loss(
        logprobs, logprobs, exp.advantages, exp.mask, agg="seq-mean-token-mean", weights=kept.float()
    )
    want = policy - 0.1 * masked_mean(entropy, kept)  # TRL's bonus: the micro-batch's kept tokens
    assert got.item() == pytest.approx(want.item(), abs=1e-6)
    assert metrics["policy/kept_token_frac"].item() == pytest.approx(kept.sum().item() / exp.mask.sum().item())


def test_the_off_policy_mask_drops_far_negative_sequences():
    trainer, exp, logprobs, _ = experience(off_policy_mask_threshold=0.05)
    exp.old_logprobs = logprobs + 0.2 * torch.randn(logprobs.shape, generator=torch.Generator().manual_seed(2))
    rows = torch.arange(exp.mask.shape[0])
    with torch.no_grad():
        got, _ = loss(trainer.models, part(UpdateLoss, trainer.args), exp, rows, 0.0)
    keep = off_policy_sequence_mask(exp.advantages, logprobs, exp.old_logprobs, exp.mask, 0.05)
    assert 0 < keep.sum() < keep.numel()  # some sequences dropped, some kept
    want, _ = ppo_policy_loss(
        logprobs,
        exp.old_logprobs,
        exp.advantages,
        exp.mask,
        agg="seq-mean-token-mean",
        weights=keep.expand_as(logprobs),
    )
    assert got.item() == pytest.approx(want.item(), abs=1e-6)


def test_the_adaptive_entropy_coefficient_moves_once_per_optimizer_step(tmp_path):
    """Two optimizer steps (num_iterations=2), the entropy always below the target: the coefficient
    rises by delta after each; the first step applies no bonus (nothing measured yet), the second the
    raised one; checkpoints hold the controller."""
    tok = char_tokenizer()
    config = RLConfig(
        algorithm="grpo", max_new_tokens=6, max_steps=1, log_every=0, seed=0, prompts_per_step=2, num_iterations=2,
        entropy_coef=0.01, use_adaptive_entropy=True, entropy_target=15.0, entropy_coef_delta=0.005,
        output_dir=str(tmp_path), save_steps=1,
    )  # fmt: skip
    trainer = RLTrainer(tiny_causal_lm(tok, seed=0), [varied], config, train_dataset=PROMPTS, processing_class=tok)
    applied = []
    real_loss = trainer.models.train_outputs

    def watch(*args, **kwargs):
        applied.append(trainer.entropy_ctl.applied)
        return real_loss(*args, **kwargs)

    trainer.models.train_outputs = watch
    history = trainer.train()
    assert trainer.entropy_ctl.coef == pytest.approx(0.02)
    assert sorted({round(a, 6) for a in applied}) == [0.0, 0.015]
    assert history[-1]["policy/entropy_coef"] == pytest.approx((0.015 + 0.02) / 2)
    import json

    counters = json.loads((tmp_path / "checkpoint-1" / "trainer_state.json").read_text())
    assert counters["entropy_coef"] == pytest.approx(0.02)
