"""The importance-sampling correction of the engine/trainer mismatch, through the RL loop.

The HF engine samples from the trained weights themselves, so its mismatch is measured as 0 and
the correction changes nothing; an engine that reports other log-probs (vLLM; here hand-set
ones) gets per-token weights and masks worked out by hand. The formulas themselves are tested in
tests/algorithms/test_rollout_is.py; the real vLLM engine in tests/trainers/test_rl_vllm.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from rlhfkit.tasks.toy import toy_trainer


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_the_hf_engine_logs_no_mismatch_and_weights_of_one(algorithm):
    history = toy_trainer(algorithm, max_steps=2, rollout_is="token_mask", prompts_per_step=4).train()
    for row in history:
        assert row["rollout/logprob_diff_mean"] == 0 and row["rollout/logprob_diff_max"] == 0
        assert row["rollout/is_weight_mean"] == 1 and row["rollout/is_masked_frac"] == 0


def _experience_with_engine_logprobs(mode, threshold=2.0, num_iterations=2):
    """A GRPO batch whose engine log-probs differ from the trainer's on two tokens: token (0, 0)
    had engine probability half the trainer's (ratio π_trainer/π_engine = 2), token (1, 0) three
    times it (ratio 1/3); every other token agrees. Two passes over the batch: the weights are
    computed with the old log-probs, before the update."""
    trainer = toy_trainer("grpo", prompts_per_step=2, rollout_is=mode, rollout_is_threshold=threshold, kl_coef=0.0,
                          num_iterations=num_iterations)
    rows = trainer._sample_prompts()
    rollout = trainer.engine.generate([trainer.prompt_ids[i] for i in rows], 4, trainer.sampling)
    old = trainer.m.policy_outputs(rollout, with_values=False)[0]
    behaviour = old.clone()
    behaviour[0, 0] += math.log(0.5)
    behaviour[1, 0] += math.log(3.0)
    rollout.logprobs = behaviour
    scores, valid, metrics = trainer._score(rows, rollout)
    return trainer, trainer._make_experience(rollout, scores, valid, metrics), metrics


def test_token_truncate_weights_each_token_by_its_capped_ratio():
    _, exp, metrics = _experience_with_engine_logprobs("token_truncate")
    mask = exp.rollout.response_mask.bool()
    expected = torch.where(mask, 1.0, 0.0)
    expected[0, 0], expected[1, 0] = 2.0, 1 / 3  # min(2, C=2), min(1/3, 2)
    torch.testing.assert_close(exp.is_weights, expected, atol=1e-5, rtol=0)
    assert torch.equal(exp.mask, mask)
    assert metrics["rollout/logprob_diff_max"].item() == pytest.approx(math.log(3), abs=1e-5)
    n = mask.sum().item()
    assert metrics["rollout/logprob_diff_mean"].item() == pytest.approx((math.log(2) + math.log(3)) / n, abs=1e-5)
    assert metrics["rollout/is_weight_mean"].item() == pytest.approx((n - 2 + 2 + 1 / 3) / n, abs=1e-5)


def test_token_mask_drops_the_tokens_outside_the_bounds():
    _, exp, metrics = _experience_with_engine_logprobs("token_mask")
    mask = exp.rollout.response_mask.bool()
    kept = mask.clone()
    kept[1, 0] = False  # 1/3 < 1/C = 1/2; the ratio 2 is within [1/2, 2]
    assert torch.equal(exp.mask, kept)
    assert exp.is_weights[0, 0].item() == pytest.approx(2.0, abs=1e-5)
    assert metrics["rollout/is_masked_frac"].item() == pytest.approx(1 / mask.sum().item())


def test_sequence_mask_drops_whole_sequences_and_none_changes_nothing():
    _, exp, _ = _experience_with_engine_logprobs("sequence_mask", threshold=2.5)
    mask = exp.rollout.response_mask.bool()
    kept = mask.clone()
    kept[1] = False  # sequence ratio 1/3 < 1/2.5; row 0's ratio 2 <= 2.5 stays
    assert torch.equal(exp.mask, kept)
    _, plain, metrics = _experience_with_engine_logprobs("none")
    assert plain.is_weights is None and torch.equal(plain.mask, mask)
    assert metrics["rollout/logprob_diff_max"].item() == pytest.approx(math.log(3), abs=1e-5)  # measured anyway


def test_the_weights_reach_the_policy_loss():
    trainer, exp, _ = _experience_with_engine_logprobs("token_truncate")
    rows = torch.arange(exp.mask.shape[0])
    exp.advantages = torch.randn(exp.advantages.shape, generator=torch.Generator().manual_seed(0))  # not all 0
    weighted, _ = trainer._loss(exp, rows)
    exp.is_weights = None
    plain, _ = trainer._loss(exp, rows)
    assert not torch.isclose(weighted, plain)


def test_one_on_policy_pass_corrects_in_the_loss_with_the_same_result():
    """A single pass needs no separate old-log-prob pass: the loss's own (detached) log-probs are
    the old ones, so the weights computed there equal the precomputed ones."""
    trainer, exp, _ = _experience_with_engine_logprobs("token_truncate")
    rows = torch.arange(exp.mask.shape[0])
    exp.advantages = torch.randn(exp.advantages.shape, generator=torch.Generator().manual_seed(0))
    precomputed, _ = trainer._loss(exp, rows)
    exp.old_logprobs, exp.is_weights = None, None
    in_loss, metrics = trainer._loss(exp, rows)
    torch.testing.assert_close(in_loss, precomputed, rtol=1e-6, atol=1e-7)
    assert metrics["rollout/logprob_diff_max"].item() == pytest.approx(math.log(3), abs=1e-5)
    single, single_exp, step_metrics = _experience_with_engine_logprobs("token_truncate", num_iterations=1)
    assert single_exp.old_logprobs is None and single_exp.is_weights is None  # no extra pass
    assert "rollout/logprob_diff_max" not in step_metrics
    update = single._update(single_exp)
    assert update["rollout/logprob_diff_max"].item() == pytest.approx(math.log(3), abs=1e-5)
    n = single_exp.mask.sum().item()
    assert update["rollout/logprob_diff_mean"].item() == pytest.approx((math.log(2) + math.log(3)) / n, abs=1e-5)
