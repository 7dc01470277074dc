"""RL trainer options checked by their effect (tests/trainers/test_rl_options.py has micro-batching and the
loss by hand): adaptive KL, the entropy bonus, reward clipping and normalisation, REINFORCE++, dual clip, the
learning-rate schedule and the missing-EOS penalty."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from rlhfkit.config import RLConfig
from rlhfkit.rl.experience import Experience
from rlhfkit.tasks.toy import fraction_of_a, toy_trainer

from .test_rl_options import (
    current_logprobs,
    experience,
    generate,
    handmade_rollout,
    make_trainer,
    micro_batch_loss,
    trained_params,
    varied_experience,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

# ---------------------------------------------------------------- 3. options, by their effect


@pytest.mark.parametrize("target,direction", [(1e-6, +1), (1e6, -1)])
def test_adaptive_kl_moves_beta_towards_the_target(target, direction):
    """β·(1 + clip(KL/target - 1, ±0.2)·B/horizon) after every step: a tiny target (KL above it)
    raises β, a huge one lowers it; the fixed controller would keep it at kl_coef."""
    horizon = 20.0
    trainer = make_trainer(
        kl_coef=0.05, adaptive_kl=True, kl_target=target, kl_horizon=horizon, group_size=4, prompts_per_step=2
    )
    with torch.no_grad():  # a reference away from the policy: KL is clearly > 0 from the first step
        gen = torch.Generator().manual_seed(0)
        for p in trainer.models.reference.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen))
    history = trainer.train()
    coefs = [r["kl/coef"] for r in history] + [trainer.kl_ctl.value]
    assert coefs[0] == pytest.approx(0.05)
    B = trainer.args.batch_size
    for row, before, after in zip(history, coefs, coefs[1:]):
        assert row["kl/k1"] > 0
        error = min(max(row["kl/k1"] * row["rollout/response_length_mean"] / target - 1, -0.2), 0.2)
        assert after == pytest.approx(before * (1 + error * B / horizon), rel=1e-6)
        assert after == pytest.approx(before * (1 + direction * 0.2 * B / horizon), rel=1e-6)
        assert (after - before) * direction > 0


def test_the_kl_that_drives_the_adaptive_controller_does_not_depend_on_micro_batch_size():
    """GRPO puts the KL in the loss, so the kl/k1 logged (and read by the adaptive controller) comes
    from the update. With responses of different lengths it must still be the batch's token-mean of
    log π - log π_ref, whatever the micro-batch size."""
    config = dict(algorithm="grpo", kl_coef=0.05, adaptive_kl=True, kl_target=0.5, kl_horizon=20.0)
    trainers = {micro: make_trainer(**config, micro_batch_size=micro) for micro in (None, 2)}
    for trainer in trainers.values():
        with torch.no_grad():
            gen = torch.Generator().manual_seed(0)
            for p in trainer.models.reference.parameters():
                p.add_(0.3 * torch.randn(p.shape, generator=gen))
    exp = varied_experience(trainers[None])
    logprobs, _ = current_logprobs(trainers[None], exp.rollout)
    batch_k1 = (logprobs - exp.ref_logprobs)[exp.mask].mean().item()
    logged = {}
    for micro, trainer in trainers.items():
        torch.manual_seed(0)
        logged[micro] = trainer.update(exp)["kl/k1"].item()
    assert logged[None] == pytest.approx(batch_k1, rel=1e-5)
    assert logged[2] == pytest.approx(batch_k1, rel=1e-5)


def test_entropy_bonus_is_subtracted_from_the_loss_and_changes_the_gradient():
    trainer = make_trainer(kl_coef=0.0, loss_agg="seq-mean-token-mean")
    exp = experience(trainer)
    rows = torch.arange(exp.mask.shape[0])
    results = {}
    for coef in (0.0, 0.3):
        trainer.args = trainer.args.replace(entropy_coef=coef)
        loss, metrics = micro_batch_loss(trainer, exp, rows)
        loss.backward()
        results[coef] = loss.detach(), [p.grad.clone() for _, p in trained_params(trainer)]
        trainer.run.optimizer.zero_grad(set_to_none=True)
    _, entropy = current_logprobs(trainer, exp.rollout)
    m = exp.mask.float()
    seq_mean_entropy = ((entropy * m).sum(1) / m.sum(1)).mean()
    assert seq_mean_entropy > 0.1
    assert results[0.3][0].item() == pytest.approx(results[0.0][0].item() - 0.3 * seq_mean_entropy.item(), abs=1e-5)
    diff = max((a - b).abs().max().item() for a, b in zip(results[0.3][1], results[0.0][1]))
    assert diff > 1e-4


def test_entropy_bonus_alone_raises_the_policy_entropy():
    """Zero advantages and no KL: without the bonus an update changes nothing (zero gradient);
    with a large bonus it raises the entropy of the policy on the same completions."""
    moved = {}
    for coef in (0.0, 1.0):
        trainer = make_trainer(kl_coef=0.0, entropy_coef=coef, loss_agg="token-mean", learning_rate=1e-2)
        exp = experience(trainer)
        exp.advantages = torch.zeros_like(exp.advantages)
        mask = exp.mask
        before = [p.detach().clone() for _, p in trained_params(trainer)]
        entropy_before = current_logprobs(trainer, exp.rollout)[1][mask].mean()
        torch.manual_seed(0)
        trainer.update(exp)
        entropy_after = current_logprobs(trainer, exp.rollout)[1][mask].mean()
        moved[coef] = max((p - b).abs().max().item() for (_, p), b in zip(trained_params(trainer), before))
        if coef > 0:
            assert entropy_after > entropy_before + 1e-3, (entropy_before, entropy_after)
    assert moved[0.0] == 0.0 and moved[1.0] > 1e-4


def large_rewards(prompts, completions, **kwargs):
    return [(5.0, -5.0, 0.25, -0.5)[i % 4] for i in range(len(completions))]


def test_reward_clip_bounds_scores_before_the_advantages():
    trainer = make_trainer(reward=large_rewards, reward_clip=1.0, kl_coef=0.0, group_size=4, prompts_per_step=2)
    rows, rollout = generate(trainer)
    scores, valid, metrics = trainer.sampler.score(rows, rollout)
    trainer.sampler.shaping = dataclasses.replace(trainer.sampler.shaping, reward_clip=None)
    raw, _, _ = trainer.sampler.score(rows, rollout)
    trainer.sampler.shaping = dataclasses.replace(trainer.sampler.shaping, reward_clip=1.0)
    assert raw.abs().max() == 5.0  # the raw rewards do exceed the clip
    assert scores.tolist() == pytest.approx([1.0, -1.0, 0.25, -0.5] * 2)
    assert metrics["reward/mean"].item() == pytest.approx(sum([1.0, -1.0, 0.25, -0.5]) / 4)
    exp = trainer.make_experience(rollout, scores, valid, metrics)
    grouped = torch.tensor([1.0, -1.0, 0.25, -0.5])
    expected = (grouped - grouped.mean()) / (grouped.std() + 1e-6)
    torch.testing.assert_close(exp.advantages[:, 0], expected.repeat(2))


def test_normalize_rewards_whitens_scores_over_the_batch():
    trainer = make_trainer(reward=large_rewards, normalize_rewards=True, kl_coef=0.0, group_size=4, prompts_per_step=2)
    rows, rollout = generate(trainer)
    scores, _, metrics = trainer.sampler.score(rows, rollout)
    raw = torch.tensor([5.0, -5.0, 0.25, -0.5] * 2)
    assert scores.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert scores.std().item() == pytest.approx(1.0, abs=1e-6)
    torch.testing.assert_close(scores, (raw - raw.mean()) / raw.std())
    assert metrics["reward/mean"].item() == pytest.approx(raw.mean().item())  # logged before whitening


def test_reinforce_plus_plus_preset_learns_the_toy_task():
    history = toy_trainer("reinforce_plus_plus").train()
    start = sum(r["reward/mean"] for r in history[:5]) / 5
    end = sum(r["reward/mean"] for r in history[-5:]) / 5
    assert end - start > 0.2, (start, end)


def test_reinforce_plus_plus_advantages_are_whitened_discounted_token_returns():
    """r_t = -β·k1_t (+ score on the last token), G_t = Σ_{s≥t} γ^{s-t} r_s, whitened over all the
    batch's response tokens (unbiased variance)."""
    args = RLConfig(algorithm="reinforce_plus_plus")
    assert (args.advantage_estimator, args.use_critic, args.kl_in_reward, args.group_size) == (
        "reinforce_plus_plus",
        False,
        True,
        1,
    )
    trainer = make_trainer("reinforce_plus_plus", gamma=0.9, prompts_per_step=6, kl_coef=0.1)
    with torch.no_grad():  # a reference away from the policy, so the KL part of the reward is not 0
        gen = torch.Generator().manual_seed(0)
        for p in trainer.models.reference.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen))
    rows, rollout = generate(trainer)
    scores, valid, metrics = trainer.sampler.score(rows, rollout)
    exp = trainer.make_experience(rollout, scores, valid, metrics)
    mask = exp.mask
    B, T = mask.shape
    rewards = torch.where(mask, -0.1 * (exp.old_logprobs - exp.ref_logprobs), torch.zeros(()))
    assert rewards.abs().max() > 1e-3
    last = mask.long().cumsum(1).argmax(1)
    rewards[torch.arange(B), last] += scores
    returns = torch.zeros(B, T)
    running = torch.zeros(B)
    for t in reversed(range(T)):
        running = torch.where(mask[:, t], rewards[:, t] + 0.9 * running, running)
        returns[:, t] = torch.where(mask[:, t], running, torch.zeros(()))
    values = returns[mask]
    expected = (values - values.mean()) / torch.sqrt(values.var() + 1e-8)
    torch.testing.assert_close(exp.advantages[mask], expected, atol=1e-5, rtol=1e-4)
    assert (exp.advantages[~mask] == 0).all()


def test_dual_clip_changes_the_loss_only_for_negative_advantages_with_a_large_ratio():
    """Ratios (4, 1, 0.5) with A = +1 and (4, 0.5) with A = -1, token-mean over 5 tokens: dual clip
    c = 3 caps the one token with A < 0 and ρ = 4 at c·|A| = 3 (plain clip leaves 4 there)."""
    trainer = make_trainer(kl_coef=0.0, group_size=2, prompts_per_step=1, max_new_tokens=3, loss_agg="token-mean")
    eos = trainer.tokenizer.eos_token_id
    rollout = handmade_rollout(trainer, [["a", "b", eos], ["c", eos]], 2)
    mask = rollout.response_mask.bool()
    logprobs, _ = current_logprobs(trainer, rollout)
    ratio = torch.tensor([[4.0, 1.0, 0.5], [4.0, 0.5, 1.0]])
    rows = torch.arange(2)

    def loss(advantages, dual_clip):
        trainer.args = trainer.args.replace(dual_clip=dual_clip)
        exp = Experience(rollout, mask, logprobs - ratio.log(), None, None, advantages, None)
        value, metrics = micro_batch_loss(trainer, exp, rows)
        return value.item(), metrics

    mixed = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0]])
    plain, _ = loss(mixed, None)
    dual, metrics = loss(mixed, 3.0)
    # plain: (-1.2 - 1 - 0.5 + 4 + 0.8) / 5; dual: the 4 becomes 3
    assert plain == pytest.approx((-1.2 - 1.0 - 0.5 + 4.0 + 0.8) / 5, abs=1e-5)
    assert dual == pytest.approx((-1.2 - 1.0 - 0.5 + 3.0 + 0.8) / 5, abs=1e-5)
    assert metrics["policy/clip_frac_dual"].item() == pytest.approx(1 / 5)
    positive = mixed.abs()
    assert loss(positive, 3.0)[0] == pytest.approx(loss(positive, None)[0], abs=1e-7)
    small_ratio_negative = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -1.0, 0.0]])
    ratio[:, 0] = 1.0  # no ratio above c any more: dual clip is inactive
    assert loss(small_ratio_negative, 3.0)[0] == pytest.approx(loss(small_ratio_negative, None)[0], abs=1e-7)


def schedule_factor(kind, step, warmup, total):
    """The documented schedule (``make_scheduler``), written out again."""
    if step < warmup:
        return (step + 1) / (warmup + 1)
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return {"constant": 1.0, "linear": 1.0 - progress, "cosine": 0.5 * (1 + math.cos(math.pi * progress))}[kind]


@pytest.mark.parametrize(
    "kind,mini,used",
    [
        ("constant", None, [1 / 3, 2 / 3, 1, 1, 1]),
        ("linear", None, [1 / 3, 2 / 3, 1, 2 / 3, 1 / 3]),
        ("cosine", None, [1 / 3, 2 / 3, 1, 0.75, 0.25]),
        ("cosine", 4, [1 / 3, 2 / 3, 1, 0.5 * (1 + math.cos(math.pi / 8))]),  # of 10 optimizer steps
    ],
)
def test_learning_rate_schedule_follows_the_formula(kind, mini, used):
    """warmup_steps=2, max_steps=5: the lr each optimizer step uses is lr·factor(s) for s = 0, 1, …,
    and perf/lr logged after RL step k is the scheduler's next lr, lr·factor(steps taken). With
    mini_batch_size=4 (2 optimizer steps per RL step) the horizon is 10 optimizer steps."""
    lr = 1e-3
    trainer = make_trainer(
        kl_coef=0.0, lr_scheduler=kind, warmup_steps=2, max_steps=5, learning_rate=lr, mini_batch_size=mini
    )
    seen = []
    trainer.run.optimizer.register_step_pre_hook(lambda opt, args, kwargs: seen.append(opt.param_groups[0]["lr"]))
    history = trainer.train()
    per_step = 8 // (mini or 8)
    total = 5 * per_step
    assert len(seen) == total
    assert seen == pytest.approx([lr * schedule_factor(kind, s, 2, total) for s in range(total)], rel=1e-9)
    assert seen[: len(used)] == pytest.approx([lr * u for u in used])  # the formula's numbers, by hand
    logged = [r["perf/lr"] for r in history]
    assert logged == pytest.approx(
        [lr * schedule_factor(kind, (k + 1) * per_step, 2, total) for k in range(5)], rel=1e-9, abs=1e-15
    )


# ---------------------------------------------------------------- 4. the EOS trick


def test_missing_eos_penalty_replaces_truncated_scores_and_leaves_the_others_alone():
    trainer = make_trainer(
        reward=fraction_of_a, missing_eos_penalty=-0.75, kl_coef=0.0, group_size=2, prompts_per_step=2, max_new_tokens=3
    )
    eos = trainer.tokenizer.eos_token_id
    responses = [["a", "a", eos], ["a", "b", "a"], ["b", eos], ["a", "a", "a"]]
    rows = [0, 1]  # handmade_rollout continues prompts 0 and 1
    rollout = handmade_rollout(trainer, responses, 2)
    assert rollout.has_eos.tolist() == [True, False, True, False]  # both kinds are present
    scores, _, _ = trainer.sampler.score(rows, rollout)
    trainer.sampler.shaping = dataclasses.replace(trainer.sampler.shaping, missing_eos_penalty=None)
    raw, _, _ = trainer.sampler.score(rows, rollout)
    assert raw.tolist() == pytest.approx([1.0, 2 / 3, 0.0, 1.0])
    truncated = ~rollout.has_eos
    assert (scores[truncated] == -0.75).all() and (raw[truncated] != -0.75).all()
    assert torch.equal(scores[~truncated], raw[~truncated])
