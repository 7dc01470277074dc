"""RL trainer options checked by their effect, through the trainer's own phases.

Micro-batching with gradient accumulation must give the update of one batch; the loss of a
hand-set experience must equal numbers worked out by hand; every option (adaptive KL, entropy
bonus, reward clipping and normalisation, REINFORCE++, dual clip, learning-rate schedules, the
EOS trick) must change what it promises to change, and nothing else.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from rlhfkit.config import RLConfig, part
from rlhfkit.rl.experience import Experience
from rlhfkit.rl.update import UpdateLoss, minibatch_generator
from rlhfkit.rl.update import loss as update_loss
from rlhfkit.rollout.base import build_rollout
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
from rlhfkit.tasks.toy import PROMPTS, fraction_of_a, toy_trainer
from rlhfkit.trainers import RLTrainer

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def varied_reward(prompts, completions, **kwargs):
    """Deterministic scores that differ between completions (the toy reward is ~0 for a random
    model, which leaves GRPO with zero advantages and nothing to compare)."""
    return [(sum(map(ord, c)) % 7) / 7 for c in completions]


def make_trainer(algorithm="grpo", reward=varied_reward, **overrides):
    tok = char_tokenizer()
    args = dict(
        algorithm=algorithm, learning_rate=3e-3, max_new_tokens=6, max_steps=4, log_every=0, seed=0, prompts_per_step=2
    )
    args.update(overrides)
    return RLTrainer(
        tiny_causal_lm(tok, seed=0), [reward], RLConfig(**args), train_dataset=PROMPTS, processing_class=tok
    )


def generate(trainer):
    rows = trainer.sampler.sample_prompts()
    rollout = trainer.sampler.engine.generate(
        [trainer.sampler.prompt_ids[i] for i in rows], trainer.args.group_size, trainer.sampler.sampling
    )
    return rows, rollout


def experience(trainer):
    rows, rollout = generate(trainer)
    scores, valid, metrics = trainer.sampler.score(rows, rollout)
    return trainer.make_experience(rollout, scores, valid, metrics)


def varied_experience(trainer):
    """An experience of hand-written responses of lengths 1 .. max_new_tokens (ending in EOS, or cut
    at the limit without it), so token and sequence weights of micro-batches differ."""
    rows = trainer.sampler.sample_prompts()
    tok, G, T = trainer.tokenizer, trainer.args.group_size, trainer.args.max_new_tokens
    gen = torch.Generator().manual_seed(7)
    responses = []
    for i in range(len(rows) * G):
        length = (T, 2, 4, 1, T, 3, 5, T - 1)[i % 8]
        ids = torch.randint(3, len(tok), (length,), generator=gen).tolist()  # no special token
        if i % 8 != 0:
            ids[-1] = tok.eos_token_id
        responses.append(ids)
    rollout = build_rollout(
        [trainer.sampler.prompt_ids[i] for i in rows], responses, G, tok.pad_token_id, tok.eos_token_id
    )
    scores, valid, metrics = trainer.sampler.score(rows, rollout)
    return trainer.make_experience(rollout, scores, valid, metrics)


def trained_params(trainer):
    modules = [trainer.models.policy] + (
        [trainer.models.critic_module] if trainer.models.critic_module is not None else []
    )
    return [(f"{i}.{n}", p) for i, m in enumerate(modules) for n, p in m.named_parameters() if p.requires_grad]


def record_grads(trainer) -> list[list[torch.Tensor]]:
    """The accumulated gradients seen by each optimizer step (before clipping)."""
    seen, step = [], trainer.optimizer_step

    def recording_step():
        seen.append(
            [torch.zeros_like(p) if p.grad is None else p.grad.detach().clone() for _, p in trained_params(trainer)]
        )
        return step()

    trainer.optimizer_step = recording_step
    return seen


def comparable_adam(trainer):
    """AdamW's step g/(|g| + eps) turns the float rounding (~1e-10) of near-zero gradient components
    into ~lr·1e-10/1e-8 weight differences at the default eps=1e-8; eps=1e-5 keeps a comparison of
    weights about the gradients (every component with |g| >> 1e-5 still moves by ~lr)."""
    for group in trainer.run.optimizer.param_groups:
        group["eps"] = 1e-5


def handmade_rollout(trainer, responses, n):
    tok = trainer.tokenizer
    ids = [[tok.convert_tokens_to_ids(ch) if isinstance(ch, str) else ch for ch in r] for r in responses]
    prompts = [trainer.sampler.prompt_ids[i] for i in range(len(responses) // n)]
    return build_rollout(prompts, ids, n, tok.pad_token_id, tok.eos_token_id)


def micro_batch_loss(trainer, exp, rows):
    """``(loss, metrics)`` of ``rows`` of ``exp`` as the trainer's update computes them (``rl.update.loss``)."""
    return update_loss(trainer.models, part(UpdateLoss, trainer.args), exp, rows, trainer.kl_ctl.value)


def current_logprobs(trainer, rollout):
    with torch.no_grad():
        logprobs, _, entropy, _ = trainer.models.train_outputs(rollout, with_values=False, entropy_grad=False)
    return logprobs, entropy


# ---------------------------------------------------------------- 1. micro-batches == one batch

ACCUMULATION_CASES = {
    "grpo-token-mean-kl-entropy": dict(algorithm="grpo", loss_agg="token-mean", kl_coef=0.05, entropy_coef=0.01),
    "grpo-seq-mean-token-mean-kl": dict(algorithm="grpo", loss_agg="seq-mean-token-mean", kl_coef=0.05),
    "grpo-seq-mean-token-sum-norm-kl": dict(algorithm="grpo", loss_agg="seq-mean-token-sum-norm", kl_coef=0.05),
    "ppo-shared-token-mean": dict(algorithm="ppo", critic="shared", prompts_per_step=8, loss_agg="token-mean"),
    "ppo-separate-seq-mean-token-mean": dict(
        algorithm="ppo", critic="separate", prompts_per_step=8, loss_agg="seq-mean-token-mean"
    ),
    # Minibatches (2 optimizer steps of 4 rows; the second one off-policy) with micro-batches inside.
    "grpo-minibatches": dict(algorithm="grpo", loss_agg="seq-mean-token-mean", kl_coef=0.05, mini_batch_size=4),
    "ppo-shared-minibatches": dict(
        algorithm="ppo", critic="shared", prompts_per_step=8, loss_agg="token-mean", mini_batch_size=4
    ),
    # The presets of issue 21, off-policy in their second minibatch: GSPO's sequence ratio (and
    # GSPO-token's), CISPO's capped detached ratio, DAPO with its overlong punishment and
    # truncated completions out of the loss.
    "gspo-minibatches": dict(algorithm="gspo", mini_batch_size=4),
    "gspo-token-minibatches": dict(algorithm="gspo", importance_sampling_level="sequence_token", mini_batch_size=4),
    "cispo-minibatches": dict(algorithm="cispo", mini_batch_size=4),
    "dapo-minibatches": dict(
        algorithm="dapo", mini_batch_size=4, overlong_buffer_len=2, mask_truncated_completions=True
    ),
}


@pytest.mark.parametrize("case", list(ACCUMULATION_CASES))
def test_micro_batches_with_gradient_accumulation_give_the_update_of_one_batch(case):
    """From one fixed experience, identical trainers that differ only in micro_batch_size (None,
    2, and 3, which splits the 8 rows / the minibatch of 4 unevenly) compute the same gradients and
    end with the same weights."""
    config = dict(ACCUMULATION_CASES[case], num_iterations=1)
    trainers = {micro: make_trainer(**config, micro_batch_size=micro) for micro in (None, 2, 3)}
    reference = trainers[None]
    exp = varied_experience(reference)
    B = exp.mask.shape[0]
    assert B == 8 and exp.advantages[exp.mask].abs().max() > 1e-3  # something to learn from
    assert len(set(exp.mask.sum(1).tolist())) >= 5 and not exp.rollout.has_eos.all()
    if exp.ref_logprobs is not None and not reference.args.kl_in_reward:
        # At step 0 the reference equals the policy and the k3 term has zero gradient: move it.
        noise = torch.randn(exp.ref_logprobs.shape, generator=torch.Generator().manual_seed(1))
        exp.ref_logprobs = exp.ref_logprobs + 0.5 * noise
    if config.get("mini_batch_size"):
        assert exp.old_logprobs is not None  # two optimizer steps: the second is off-policy

    initial = [p.detach().clone() for _, p in trained_params(reference)]
    # The gradient of the first minibatch's loss in one forward/backward, for the first step of each run.
    first_rows = torch.randperm(B, generator=minibatch_generator(reference.args.seed, reference.step)).split(
        config.get("mini_batch_size") or B
    )[0]
    micro_batch_loss(reference, exp, first_rows)[0].backward()
    direct = [p.grad.detach().clone() for _, p in trained_params(reference)]
    reference.run.optimizer.zero_grad(set_to_none=True)
    grads, params = {}, {}
    for micro, trainer in trainers.items():
        comparable_adam(trainer)
        grads[micro] = record_grads(trainer)
        torch.manual_seed(123)  # the same minibatch order for every run
        trainer.update(exp)
        params[micro] = [p.detach().clone() for _, p in trained_params(trainer)]

    steps = B // (config.get("mini_batch_size") or B)
    names = [n for n, _ in trained_params(reference)]
    moved = max((a - b).abs().max().item() for a, b in zip(params[None], initial))
    assert moved > 1e-4  # the update did something the comparison can see
    for name, g, g_ref in zip(names, grads[None][0], direct):
        torch.testing.assert_close(g, g_ref, atol=1e-6, rtol=1e-5, msg=f"grad {name} of one minibatch")
    for micro in (2, 3):
        assert len(grads[micro]) == len(grads[None]) == steps
        for step in range(steps):
            for name, g, g_ref in zip(names, grads[micro][step], grads[None][step]):
                torch.testing.assert_close(g, g_ref, atol=1e-6, rtol=1e-5, msg=f"grad {name} micro={micro}")
        # the gradients agree to 1e-6 (above); AdamW's division by sqrt(v) + eps amplifies their
        # rounding in near-zero entries, so the weights are compared at 1e-5
        for name, p, p_ref in zip(names, params[micro], params[None]):
            torch.testing.assert_close(p, p_ref, atol=1e-5, rtol=1e-5, msg=f"{name} micro={micro}")


def test_explicit_mini_batch_of_the_whole_batch_is_the_default():
    """mini_batch_size=B is the same single optimizer step as mini_batch_size=None."""
    trainers = [make_trainer(kl_coef=0.0, mini_batch_size=mini) for mini in (None, 8)]
    exp = varied_experience(trainers[0])
    for trainer in trainers:
        comparable_adam(trainer)
        torch.manual_seed(0)
        trainer.update(exp)
    for (name, a), (_, b) in zip(trained_params(trainers[0]), trained_params(trainers[1])):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=name)


def test_micro_batches_with_unscored_rows_give_the_update_of_one_batch():
    """Rows without a score (mask all 0) must not change the accumulation weights: a micro-batch
    made only of them contributes nothing, and the result is still that of one batch."""
    config = dict(algorithm="grpo", loss_agg="seq-mean-token-mean", kl_coef=0.0, num_iterations=1)
    trainers = {micro: make_trainer(**config, micro_batch_size=micro) for micro in (None, 2)}
    exp = varied_experience(trainers[None])
    exp.mask = exp.mask.clone()
    # 3 of prompt 0's 4 rows (micro-batches hold whole groups in order, so one of its two
    # micro-batches has no token at all) and one row of prompt 1.
    exp.mask[[0, 1, 2, 6]] = False
    for trainer in trainers.values():
        comparable_adam(trainer)
        torch.manual_seed(0)
        trainer.update(exp)
    for (name, a), (_, b) in zip(trained_params(trainers[None]), trained_params(trainers[2])):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=name)


# ---------------------------------------------------------------- 2. the loss, by hand


def test_grpo_loss_of_a_handmade_experience_equals_the_hand_computation():
    """Two rows (3 and 2 response tokens, one padded column); ratios and reference log-ratios set
    on top of the policy's own log-probs, so every number is known:

    row 0, A = +1, ratios (1.5, 1, 0.5): token losses -min(ρA, clip(ρ)A) = -1.2 (clipped), -1, -0.5
    row 1, A = -1, ratios (2, 0.7):      token losses  max(ρ, clip(ρ))   =  2 (unclipped), 0.8 (clipped)
    seq-mean-token-mean: ((-2.7/3) + (2.8/2)) / 2 = 0.25
    k3 with log r = log q - log p = (ln2, 0, -ln2) and (0, ln2): r - log r - 1
    """
    trainer = make_trainer(kl_coef=0.05, group_size=2, prompts_per_step=1, max_new_tokens=3)
    assert trainer.args.loss_agg == "seq-mean-token-mean" and trainer.args.kl_estimator == "k3"
    eos = trainer.tokenizer.eos_token_id
    rollout = handmade_rollout(trainer, [["a", "b", eos], ["c", eos]], 2)
    mask = rollout.response_mask.bool()
    assert mask.tolist() == [[True, True, True], [True, True, False]]
    logprobs, _ = current_logprobs(trainer, rollout)

    ln2 = math.log(2.0)
    ratio = torch.tensor([[1.5, 1.0, 0.5], [2.0, 0.7, 1.0]])
    log_r = torch.tensor([[ln2, 0.0, -ln2], [0.0, ln2, 0.0]])
    advantages = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0]])
    exp = Experience(rollout, mask, logprobs - ratio.log(), logprobs + log_r, None, advantages, None)

    loss, metrics = micro_batch_loss(trainer, exp, torch.arange(2))

    surrogate = ((-1.2 - 1.0 - 0.5) / 3 + (2.0 + 0.8) / 2) / 2
    k3 = lambda lr: math.exp(lr) - lr - 1  # noqa: E731
    kl = ((k3(ln2) + k3(0.0) + k3(-ln2)) / 3 + (k3(0.0) + k3(ln2)) / 2) / 2
    assert surrogate == pytest.approx(0.25)
    assert kl == pytest.approx(((1.5 - 1.0) / 3 + (1.0 - ln2) / 2) / 2)
    assert loss.item() == pytest.approx(surrogate + 0.05 * kl, abs=1e-5)
    assert metrics["policy/loss"].item() == pytest.approx(surrogate, abs=1e-5)
    assert metrics["policy/clip_frac"].item() == pytest.approx(2 / 5)  # row 0 token 0 and row 1 token 1


def test_grpo_loss_of_a_real_two_row_experience_equals_plain_torch():
    """A generated 2-row group, after one update (so the ratio is no longer 1): the loss equals the
    clipped surrogate + β·k3, seq-mean-token-mean, written out with plain torch ops."""
    trainer = make_trainer(kl_coef=0.05, group_size=2, prompts_per_step=1, num_iterations=2, learning_rate=1e-2)
    exp = experience(trainer)
    assert exp.old_logprobs is not None and exp.ref_logprobs is not None
    trainer.args = trainer.args.replace(num_iterations=1)
    torch.manual_seed(0)
    trainer.update(exp)

    rows = torch.arange(2)
    logprobs, _ = current_logprobs(trainer, exp.rollout)
    m = exp.mask.float()
    assert exp.advantages[exp.mask].abs().min() > 0.1  # the two scores differ: A = ±1/√2
    ratio = torch.exp(logprobs - exp.old_logprobs)
    assert ((ratio - 1).abs() * m).max() > 1e-3
    a = exp.advantages
    token_loss = torch.maximum(-a * ratio, -a * ratio.clamp(0.8, 1.2))
    log_r = exp.ref_logprobs - logprobs
    k3 = torch.exp(log_r) - log_r - 1
    per_row = lambda x: (x * m).sum(1) / m.sum(1)  # noqa: E731
    expected = per_row(token_loss).mean() + 0.05 * per_row(k3).mean()
    loss, _ = micro_batch_loss(trainer, exp, rows)
    assert loss.item() == pytest.approx(expected.item(), abs=1e-5, rel=1e-4)


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
