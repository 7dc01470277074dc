"""Golden values from /work/shared/reference/reinforce-and-rloo-for-llms.md.

The reference's REINFORCE and RLOO pseudocode (plain torch) is written out below with its exact
tensors; our pipeline kl_penalty(k1) → token_level_rewards → ADVANTAGE_ESTIMATORS → pg_loss must
give the same advantages, loss and gradient, and a few numbers are typed in from a hand calculation.

One difference is deliberate and pinned by a test: the reference computes the KL inside the reward
from the live ``per_token_logprobs`` and never detaches it, so its ``.backward()`` also
differentiates through the reward (an extra ``-kl_beta`` per token inside the advantage). In the
RL loop the reward is computed from the sampled (old) log-probs without gradient and ``pg_loss``
treats advantages as constants (the score-function estimator), so the gradient we match is the
reference's with the reward detached; the literal one differs by exactly ``kl_beta·Σ_t logp / B``.
"""

import pytest
import torch

from rlhfkit.algorithms import (
    ADVANTAGE_ESTIMATORS,
    broadcast_sequence_advantages,
    kl_penalty,
    pg_loss,
    reinforce_advantages,
    rloo_advantages,
    sequence_rewards,
    token_level_rewards,
)

KL_BETA = 0.1

# ----- REINFORCE (reference, "Pseudocode", batch of two completions with three tokens each) -----
RF_LOGPROBS = [[-12.3, -8.3, -2.3], [-10.0, -7.0, -3.0]]
RF_REF = [[-11.3, -8.4, -2.0], [-9.5, -7.2, -2.8]]
RF_SCORES = [1.0, 0.5]

# ----- RLOO (reference, K = 3 completions for each of 3 prompts) -----
K = 3
RLOO_LOGPROBS = [
    [[-12.3, -8.3, -2.3], [-10.0, -7.0, -3.0], [-10.5, -12.2, -9.1]],
    [[-11.0, -10.3, -1.3], [-11.1, -11.1, -0.8], [-8.2, -11.9, -0.1]],
    [[-1.8, -2.1, -0.2], [-0.7, -3.5, -0.1], [-1.0, -2.2, -1.1]],
]
RLOO_REF = [
    [[-11.8, -8.4, -2.3], [-10.1, -7.2, -3.1], [-10.3, -12.9, -9.1]],
    [[-11.8, -9.7, -1.3], [-12.3, -11.9, -0.2], [-8.1, -12.0, -0.5]],
    [[-2.7, -2.0, -1.2], [-0.7, -3.6, -0.2], [-0.7, -1.2, -0.9]],
]
RLOO_SCORES = [[1, 2, 3], [2, 3, 4], [3, 4, 5]]


def reference_reinforce(detach_reward: bool):
    """The reference's REINFORCE code, verbatim except for the optional detach of the reward path."""
    kl_beta = KL_BETA
    per_token_logprobs = torch.tensor(RF_LOGPROBS, requires_grad=True)
    reference_per_token_logprobs = torch.tensor(RF_REF)
    lp_for_reward = per_token_logprobs.detach() if detach_reward else per_token_logprobs
    kl_div = lp_for_reward - reference_per_token_logprobs
    kl_div = -kl_beta * kl_div
    score_from_rm = torch.tensor(RF_SCORES)
    per_token_reward = kl_div.clone()
    per_token_reward[range(per_token_reward.size(0)), -1] += score_from_rm
    entire_completion_reward = per_token_reward.sum(dim=1)
    baseline = entire_completion_reward.mean().detach()
    advantage = entire_completion_reward - baseline
    reinforce_loss = -per_token_logprobs.sum(dim=1) * advantage
    reinforce_loss.mean().backward()
    return advantage.detach(), reinforce_loss.mean().detach(), per_token_logprobs.grad


def reference_rloo(detach_reward: bool):
    """The reference's RLOO code, verbatim except for the optional detach of the reward path."""
    kl_beta = KL_BETA
    per_token_logprobs = torch.tensor(RLOO_LOGPROBS, requires_grad=True)
    reference_per_token_logprobs = torch.tensor(RLOO_REF)
    lp_for_reward = per_token_logprobs.detach() if detach_reward else per_token_logprobs
    kl_div = lp_for_reward - reference_per_token_logprobs
    kl_div = -kl_beta * kl_div
    score_from_rm = torch.tensor(RLOO_SCORES).float()
    per_token_reward = kl_div.clone()
    per_token_reward[:, :, -1] += score_from_rm
    entire_completion_reward = per_token_reward.sum(dim=-1)
    baseline = (entire_completion_reward.sum(dim=-1)[:, None] - entire_completion_reward) / (K - 1)
    baseline = baseline.detach()
    advantage = entire_completion_reward - baseline
    rloo_loss = -per_token_logprobs.sum(dim=-1) * advantage
    rloo_loss.mean().backward()
    return advantage.detach(), rloo_loss.mean().detach(), per_token_logprobs.grad


def ours(logprobs, ref, scores, estimator, group_size, use_registry=True, detach_kl=True):
    """Our pipeline on (B, T) tensors. The KL in the reward comes from the sampled log-probs (no
    gradient), as in the RL loop where old_logprobs == logprobs on the first minibatch."""
    logprobs = logprobs.clone().requires_grad_()
    mask = torch.ones(logprobs.shape, dtype=torch.bool)
    kl = kl_penalty(logprobs.detach() if detach_kl else logprobs, ref, "k1")
    rewards = token_level_rewards(scores, kl, mask, kl_coef=KL_BETA)
    if use_registry:
        adv, ret = ADVANTAGE_ESTIMATORS.get(estimator)(
            rewards, mask, values=None, group_size=group_size, gamma=1.0, lam=1.0
        )
        assert ret is None
        seq_adv = adv[:, 0]
    else:
        seq = sequence_rewards(rewards, mask)
        seq_adv = reinforce_advantages(seq) if estimator == "reinforce" else rloo_advantages(seq, group_size)
        adv = broadcast_sequence_advantages(seq_adv, mask)
    loss, metrics = pg_loss(logprobs, logprobs.detach(), adv, mask, agg="seq-mean-token-sum")
    loss.backward()
    return seq_adv, loss.detach(), logprobs.grad, metrics


# --------------------------------------------------------------------------------------------
# REINFORCE
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("use_registry", [True, False])
def test_reinforce_matches_reference(use_registry):
    ref_adv, ref_loss, ref_grad = reference_reinforce(detach_reward=True)
    adv, loss, grad, metrics = ours(
        torch.tensor(RF_LOGPROBS), torch.tensor(RF_REF), torch.tensor(RF_SCORES), "reinforce", 2, use_registry
    )
    torch.testing.assert_close(adv, ref_adv, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-5, atol=1e-6)
    assert metrics["policy/approx_kl"].value.item() == 0.0


def test_reinforce_hand_values():
    # k1 = logp - ref: row 0 [-1.0, 0.1, -0.3] (Σ -1.2), row 1 [-0.5, 0.2, -0.2] (Σ -0.5)
    # sequence reward = -0.1·Σk1 + score: row 0 0.12 + 1.0 = 1.12, row 1 0.05 + 0.5 = 0.55
    # baseline = batch mean 0.835 → A = [0.285, -0.285]
    # Σ_t logp = [-22.9, -20.0]; loss = mean(-Σlogp·A) = (6.5265 - 5.7) / 2 = 0.41325
    # gradient on logp_{i,t} = -A_i / B = [-0.1425, 0.1425]
    adv, loss, grad, _ = ours(torch.tensor(RF_LOGPROBS), torch.tensor(RF_REF), torch.tensor(RF_SCORES), "reinforce", 2)
    torch.testing.assert_close(adv, torch.tensor([0.285, -0.285]), rtol=0, atol=1e-5)
    assert loss.item() == pytest.approx(0.41325, abs=1e-5)
    torch.testing.assert_close(grad, torch.tensor([[-0.1425] * 3, [0.1425] * 3]), rtol=0, atol=1e-6)
    # and the reference's literal code gives the same advantages and loss value
    lit_adv, lit_loss, _ = reference_reinforce(detach_reward=False)
    torch.testing.assert_close(lit_adv, torch.tensor([0.285, -0.285]), rtol=0, atol=1e-5)
    assert lit_loss.item() == pytest.approx(0.41325, abs=1e-5)


def test_reinforce_reference_literal_gradient_adds_the_reward_path():
    # d/dlogp_{i,t} of mean_i(-S_i·A_i) with A_i depending on logp through -β·Σ_t logp:
    #   -(A_i - β·S_i)/B → row 0: -(0.285 + 2.29)/2 = -1.2875; row 1: -(-0.285 + 2.0)/2 = -0.8575
    _, _, lit_grad = reference_reinforce(detach_reward=False)
    torch.testing.assert_close(lit_grad, torch.tensor([[-1.2875] * 3, [-0.8575] * 3]), rtol=0, atol=1e-5)
    _, _, grad, _ = ours(torch.tensor(RF_LOGPROBS), torch.tensor(RF_REF), torch.tensor(RF_SCORES), "reinforce", 2)
    seq_logp = torch.tensor(RF_LOGPROBS).sum(-1, keepdim=True)
    torch.testing.assert_close(lit_grad - grad, (KL_BETA * seq_logp / 2).expand(2, 3), rtol=0, atol=1e-5)
    # feeding the live log-probs into the KL does not change our gradient: pg_loss detaches A
    _, _, grad_live, _ = ours(
        torch.tensor(RF_LOGPROBS), torch.tensor(RF_REF), torch.tensor(RF_SCORES), "reinforce", 2, detach_kl=False
    )
    torch.testing.assert_close(grad_live, grad)


# --------------------------------------------------------------------------------------------
# RLOO
# --------------------------------------------------------------------------------------------


def _flat(x):
    return torch.tensor(x).float().reshape(K * K, -1).squeeze(-1)


@pytest.mark.parametrize("use_registry", [True, False])
def test_rloo_matches_reference(use_registry):
    ref_adv, ref_loss, ref_grad = reference_rloo(detach_reward=True)
    adv, loss, grad, _ = ours(_flat(RLOO_LOGPROBS), _flat(RLOO_REF), _flat(RLOO_SCORES), "rloo", K, use_registry)
    torch.testing.assert_close(adv, ref_adv.reshape(-1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad, ref_grad.reshape(K * K, 3), rtol=1e-5, atol=1e-6)


def test_rloo_hand_values():
    # sequence rewards R = score - 0.1·Σ_t(logp - ref):
    #   prompt 1: Σk1 = -0.4, 0.4, 0.5   → R = 1.04, 1.96, 2.95
    #   prompt 2: Σk1 =  0.2, 1.4, 0.4   → R = 1.98, 2.86, 3.96
    #   prompt 3: Σk1 =  1.8, 0.2, -1.5  → R = 2.82, 3.98, 5.15
    # leave-one-out: A_i = R_i - (ΣR - R_i)/2
    #   prompt 1: 1.04 - 2.455, 1.96 - 1.995, 2.95 - 1.5   = -1.415, -0.035, 1.45
    #   prompt 2: 1.98 - 3.41,  2.86 - 2.97,  3.96 - 2.42  = -1.43,  -0.11,  1.54
    #   prompt 3: 2.82 - 4.565, 3.98 - 3.985, 5.15 - 3.4   = -1.745, -0.005, 1.75
    expected_adv = [-1.415, -0.035, 1.45, -1.43, -0.11, 1.54, -1.745, -0.005, 1.75]
    # Σ_t logp = -22.9, -20.0, -31.8 | -22.6, -23.0, -20.2 | -4.1, -4.3, -4.3
    # -Σlogp·A: -32.4035, -0.7, 46.11 | -32.318, -2.53, 31.108 | -7.1545, -0.0215, 7.525
    # total 9.6155 → mean over 9 = 1.068388...
    adv, loss, grad, _ = ours(_flat(RLOO_LOGPROBS), _flat(RLOO_REF), _flat(RLOO_SCORES), "rloo", K)
    torch.testing.assert_close(adv, torch.tensor(expected_adv), rtol=0, atol=1e-5)
    assert loss.item() == pytest.approx(9.6155 / 9, abs=1e-5)
    expected_grad = torch.tensor([-a / 9 for a in expected_adv])[:, None].expand(9, 3)
    torch.testing.assert_close(grad, expected_grad, rtol=0, atol=1e-6)
    # the reference's literal code: same advantages and loss value
    lit_adv, lit_loss, lit_grad = reference_rloo(detach_reward=False)
    torch.testing.assert_close(lit_adv.reshape(-1), torch.tensor(expected_adv), rtol=0, atol=1e-5)
    assert lit_loss.item() == pytest.approx(9.6155 / 9, abs=1e-5)
    # ... and its gradient carries the extra reward-path term β·Σ_t logp / 9
    seq_logp = _flat(RLOO_LOGPROBS).sum(-1, keepdim=True)
    torch.testing.assert_close(lit_grad.reshape(9, 3) - grad, (KL_BETA * seq_logp / 9).expand(9, 3), rtol=0, atol=1e-5)


def test_rloo_reference_advantages_identity():
    # RLOO advantage = K/(K-1)·(R - group mean) on the reference's numbers
    ref_adv, _, _ = reference_rloo(detach_reward=True)
    adv, *_ = ours(_flat(RLOO_LOGPROBS), _flat(RLOO_REF), _flat(RLOO_SCORES), "rloo", K)
    seq = _flat(RLOO_SCORES) - KL_BETA * (_flat(RLOO_LOGPROBS) - _flat(RLOO_REF)).sum(-1)
    mean = seq.reshape(K, K).mean(-1).repeat_interleave(K)
    torch.testing.assert_close(adv, K / (K - 1) * (seq - mean), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ref_adv.reshape(-1), K / (K - 1) * (seq - mean), rtol=1e-5, atol=1e-5)
