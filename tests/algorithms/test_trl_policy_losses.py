"""SAPO's soft gate, VESPO's Gamma-weighted sequence ratio and the group-mean / batch-std advantages
(TRL 1.16's loss_type "sapo" and "vespo", scale_rewards="batch"), by hand."""

import math

import pytest
import torch

from rlhfkit.algorithms import (
    ADVANTAGE_ESTIMATORS,
    POLICY_LOSSES,
    AdaptiveEntropyController,
    LossInputs,
    group_batch_std_advantages,
    group_normalized_sum,
    high_entropy_mask,
    importance_ratio,
    off_policy_sequence_mask,
    rloo_advantages,
    sapo_policy_loss,
    vespo_policy_loss,
)
from rlhfkit.algorithms.advantages import standardize

F64 = torch.float64


def sigmoid(x):
    return 1 / (1 + math.exp(-x))


def test_sapo_by_hand():
    """One row, ratios 1.5 and 0.8, advantages +1 and -1: loss_t = -(4/τ) σ(τ(ρ-1)) A_t, averaged
    over the row (seq-mean-token-mean); τ = 1 for A > 0, 1.05 otherwise."""
    old = torch.tensor([[-1.0, -2.0]], dtype=F64)
    logprobs = (old + torch.log(torch.tensor([[1.5, 0.8]], dtype=F64))).requires_grad_()
    adv = torch.tensor([[1.0, -1.0]], dtype=F64)
    loss, metrics = sapo_policy_loss(logprobs, old, adv, torch.ones(1, 2))
    gate = [4 / 1.0 * sigmoid(1.0 * 0.5), 4 / 1.05 * sigmoid(1.05 * -0.2)]
    assert loss.item() == pytest.approx((-gate[0] * 1 + gate[1] * 1) / 2, abs=1e-12)
    assert metrics["policy/sapo_gate_mean"].value.item() == pytest.approx(sum(gate) / 2, abs=1e-12)
    loss.backward()  # d/dlogp of -(4/τ)σ(τ(ρ-1))A = -4σ(1-σ)ρA, halved by the row's mean
    s0, s1 = sigmoid(0.5), sigmoid(-0.21)
    expected = [-4 * s0 * (1 - s0) * 1.5 * 1 / 2, -4 * s1 * (1 - s1) * 0.8 * -1 / 2]
    torch.testing.assert_close(logprobs.grad, torch.tensor([expected], dtype=F64))


def test_sapo_on_policy_is_the_policy_gradient():
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(3, 4, generator=g, dtype=F64)
    logprobs, adv, mask = old.clone().requires_grad_(), torch.randn(3, 4, generator=g, dtype=F64), torch.ones(3, 4)
    sapo_policy_loss(logprobs, old, adv, mask, agg="token-mean")[0].backward()
    torch.testing.assert_close(logprobs.grad, -adv / 12)  # the gate's slope at ρ = 1 is 1 for any τ


def test_vespo_by_hand():
    """Row 0 (A = +1): log-ratios 0.1 + 0.2, w = e^0.3, φ = e^3 w^2 e^{-3w}; row 1 (A = -0.5): log-ratio
    -0.4 on its one token, φ = e^2 w^3 e^{-2w}. loss = -Σ φ A log π / tokens, φ a constant."""
    old = torch.tensor([[-1.0, -1.5], [-0.7, -9.0]], dtype=F64)
    logprobs = (old + torch.tensor([[0.1, 0.2], [-0.4, 5.0]], dtype=F64)).requires_grad_()
    adv = torch.tensor([1.0, -0.5], dtype=F64)
    mask = torch.tensor([[1, 1], [1, 0]])
    loss, metrics = vespo_policy_loss(logprobs, old, adv, mask)
    w0, w1 = math.exp(0.3), math.exp(-0.4)
    phi0, phi1 = math.exp(3) * w0**2 * math.exp(-3 * w0), math.exp(2) * w1**3 * math.exp(-2 * w1)
    lp = logprobs.detach()
    expected = -(phi0 * 1.0 * (lp[0, 0] + lp[0, 1]) + phi1 * -0.5 * lp[1, 0]) / 3
    assert loss.item() == pytest.approx(expected.item(), abs=1e-12)
    assert metrics["policy/vespo_phi_mean"].value.item() == pytest.approx((phi0 + phi1) / 2, abs=1e-12)
    loss.backward()
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-phi0 / 3, -phi0 / 3], [0.5 * phi1 / 3, 0.0]], dtype=F64))


def test_vespo_folds_the_rollout_weights_into_the_sequence_ratio():
    """A token weight π_old / π_sampler of e^0.5 moves w by e^0.5: the same loss as that log-ratio."""
    old = torch.tensor([[-1.0, -1.0]], dtype=F64)
    logprobs, adv, mask = old + torch.tensor([[0.1, 0.0]], dtype=F64), torch.tensor([1.0], dtype=F64), torch.ones(1, 2)
    weights = torch.tensor([[1.0, math.exp(0.5)]], dtype=F64)
    folded = vespo_policy_loss(logprobs, old, adv, mask, weights=weights)[1]["policy/vespo_phi_mean"]
    shifted = vespo_policy_loss(logprobs + torch.tensor([[0.0, 0.5]], dtype=F64), old, adv, mask)
    assert folded.value.item() == pytest.approx(shifted[1]["policy/vespo_phi_mean"].value.item(), abs=1e-12)


def test_vespo_on_policy_is_the_policy_gradient_and_refuses_a_sequence_level():
    old = -torch.rand(2, 3, generator=torch.Generator().manual_seed(1), dtype=F64)
    logprobs, adv = old.clone().requires_grad_(), torch.tensor([0.7, -1.2], dtype=F64)
    vespo_policy_loss(logprobs, old, adv, torch.ones(2, 3))[0].backward()  # φ(1) = e^λ e^{-λ} = 1
    torch.testing.assert_close(logprobs.grad, -adv[:, None].expand(2, 3) / 6)
    with pytest.raises(ValueError, match="importance_sampling_level must be 'token'"):
        POLICY_LOSSES.get("vespo")(
            LossInputs(logprobs, old, adv, torch.ones(2, 3), importance_sampling_level="sequence")
        )


def test_group_mean_batch_std_by_hand():
    """Groups (1, 2) and (3, 6): centred by their means 1.5 and 4.5, divided by the batch's unbiased
    std of (1, 2, 3, 6) = sqrt(14 / 3)."""
    scores = torch.tensor([1.0, 2.0, 3.0, 6.0], dtype=F64)
    std = math.sqrt(14 / 3)
    got = group_batch_std_advantages(scores, 2, eps=1e-4)
    torch.testing.assert_close(got, torch.tensor([-0.5, 0.5, -1.5, 1.5], dtype=F64) / (std + 1e-4))
    # a reduce over processes: two halves of the batch give the whole batch's std
    halves = [torch.tensor([1.0, 2.0], dtype=F64), torch.tensor([3.0, 6.0], dtype=F64)]

    def reduce_with(other):
        return lambda t: t + other(t)

    parts = []
    for mine, theirs in (halves, halves[::-1]):

        def other(t, theirs=theirs):  # the other process's statistics of the same quantity
            if t.dim() == 1:  # [sum, count]
                return torch.stack([theirs.sum(), torch.tensor(2.0, dtype=F64)])
            return ((theirs - 3.0) ** 2).sum()  # squares about the global mean 3

        parts.append(group_batch_std_advantages(mine, 2, eps=1e-4, reduce=reduce_with(other)))
    torch.testing.assert_close(torch.cat(parts), got)


def test_the_batch_std_estimator_is_registered_with_groups():
    assert ADVANTAGE_ESTIMATORS.traits("group_batch_std")["needs_groups"]
    rewards = torch.zeros(4, 3, dtype=F64)
    rewards[:, -1] = torch.tensor([1.0, 2.0, 3.0, 6.0], dtype=F64)
    adv, _ = ADVANTAGE_ESTIMATORS.get("group_batch_std")(rewards, torch.ones(4, 3), group_size=2, eps=1e-4)
    torch.testing.assert_close(adv[:, 0], group_batch_std_advantages(rewards[:, -1], 2, eps=1e-4))


def test_the_sequence_sum_ratio_by_hand():
    """TRL's RLOO ratio: exp of the row's summed log-ratios, the same on each token; each token's
    log-prob moves its log by 1."""
    old = torch.tensor([[-1.0, -2.0, -3.0]], dtype=F64)
    logprobs = (old + torch.tensor([[0.1, -0.3, 9.0]], dtype=F64)).requires_grad_()
    mask = torch.tensor([[1, 1, 0]])
    ratio = importance_ratio(logprobs, old, mask, "sequence_sum")
    torch.testing.assert_close(ratio.detach(), torch.full((1, 3), math.exp(-0.2), dtype=F64))
    (grad,) = torch.autograd.grad(ratio[0, 0], logprobs)
    torch.testing.assert_close(grad, torch.tensor([[math.exp(-0.2), math.exp(-0.2), 0.0]], dtype=F64))


def test_trls_rloo_loss_on_policy_is_reinforces():
    """PPO's clip on the sequence ratio, one loss per completion (seq-mean-token-mean): at π = π_old
    the gradient of the rloo preset's REINFORCE loss (vanilla, seq-mean-token-sum)."""
    g = torch.Generator().manual_seed(2)
    old = -torch.rand(3, 4, generator=g, dtype=F64)
    adv, mask = torch.randn(3, generator=g, dtype=F64), torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    grads = []
    for name, level, agg in [
        ("ppo_clip", "sequence_sum", "seq-mean-token-mean"),
        ("vanilla", "token", "seq-mean-token-sum"),
    ]:
        logprobs = old.clone().requires_grad_()
        inputs = LossInputs(logprobs, old, adv, mask, agg, importance_sampling_level=level)
        POLICY_LOSSES.get(name)(inputs).loss.backward()
        grads.append(logprobs.grad)
    torch.testing.assert_close(grads[0], grads[1])
    # off policy a ratio outside [0.8, 1.2] with a positive advantage is clipped: no gradient
    logprobs = (old + 0.2 * mask).requires_grad_()  # row 0's ratio e^0.6
    POLICY_LOSSES.get("ppo_clip")(
        LossInputs(logprobs, old, adv.abs(), mask, "seq-mean-token-mean", importance_sampling_level="sequence_sum")
    ).loss.backward()
    assert (logprobs.grad == 0).all()


def test_standardized_rloo_advantages_by_hand():
    """TRL's normalize_advantages: the leave-one-out advantages (A - mean) / (std + 1e-4) over the batch."""
    scores = torch.tensor([1.0, 3.0, 0.0, 4.0], dtype=F64)
    loo = torch.tensor([1.0 - 3.0, 3.0 - 1.0, 0.0 - 4.0, 4.0 - 0.0], dtype=F64)  # G = 2: the other's score
    want = (loo - loo.mean()) / (loo.std() + 1e-4)
    torch.testing.assert_close(standardize(rloo_advantages(scores, 2)), want)
    rewards = torch.zeros(4, 2, dtype=F64)
    rewards[:, -1] = scores
    adv, _ = ADVANTAGE_ESTIMATORS.get("rloo_standardized")(rewards, torch.ones(4, 2), group_size=2, eps=1e-4)
    torch.testing.assert_close(adv[:, 0], want)


def test_high_entropy_mask_by_hand():
    """The tokens at or above the quantile of the masked entropies (torch.quantile's linear rule):
    entropies 0.1 .. 0.6 under the mask, quantile 0.8 -> 0.5 (0.1 + 0.8 x 0.5); padding never kept."""
    entropy = torch.tensor([[0.1, 0.2, 0.3, 9.0], [0.4, 0.5, 0.6, 9.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0]])
    kept = high_entropy_mask(entropy, mask, 0.8)
    assert kept.tolist() == [[False, False, False, False], [False, True, True, False]]
    assert high_entropy_mask(entropy, mask, 0.0).tolist() == mask.bool().tolist()  # keep all
    assert not high_entropy_mask(entropy, torch.zeros(2, 4), 0.5).any()  # nothing to rank


def test_off_policy_sequence_mask_by_hand():
    """TRL's own case: keep a positive advantage whatever its KL, a negative one with KL 0.5 <= 1,
    drop a negative one with KL 2 > 1 (KL: the mean of sampler - current log-probs over the mask)."""
    behaviour = torch.zeros(3, 4, dtype=F64)
    logprobs = torch.tensor([[-2.0] * 4, [-0.5] * 4, [-2.0] * 4], dtype=F64)
    got = off_policy_sequence_mask(
        torch.tensor([1.0, -1.0, -1.0], dtype=F64), logprobs, behaviour, torch.ones(3, 4), 1.0
    )
    assert got.tolist() == [[1.0], [1.0], [0.0]]
    padded = torch.tensor([[1, 1, 0, 0]] * 3)  # padding's log-probs count for nothing
    logprobs[:, 2:] = -100.0
    assert off_policy_sequence_mask(torch.tensor([-1.0] * 3, dtype=F64), logprobs, behaviour, padded, 1.0).tolist() == [
        [0.0], [1.0], [0.0],
    ]  # fmt: skip


def test_the_adaptive_entropy_coefficient_by_hand():
    """Skywork-OR1's controller: up by delta at or below the target, down above it, within [min, max];
    the bonus gated on the last measured entropy (none before the first)."""
    ctl = AdaptiveEntropyController(0.01, target=0.5, delta=0.005, low=0.0, high=0.02)
    assert ctl.applied == 0.0  # nothing measured yet
    assert ctl.update(0.4) == pytest.approx(0.015) and ctl.applied == pytest.approx(0.015)
    assert ctl.update(0.3) == pytest.approx(0.02) and ctl.update(0.1) == pytest.approx(0.02)  # capped
    assert ctl.update(0.9) == pytest.approx(0.015) and ctl.applied == 0.0  # above the target: no bonus
    for _ in range(5):
        ctl.update(0.9)
    assert ctl.coef == 0.0  # floored
    restored = AdaptiveEntropyController(0.3, 0.5, 0.005)
    restored.load_state_dict(ctl.state_dict())
    assert (restored.coef, restored.last_entropy) == (0.0, 0.9)


def test_gdpo_normalises_each_reward_in_its_group_then_sums_by_hand():
    """Two functions of different scales, groups of 2: each (r - mean_g) / (std_g + eps) on its own, then
    0.7 x the first + 0.3 x the second; a function that scored one sample of a group adds 0 there; a
    sample no function scored is NaN."""
    nan = float("nan")
    per = torch.tensor([[1.0, 10.0], [3.0, 30.0], [2.0, nan], [5.0, 7.0], [nan, nan], [nan, nan]], dtype=F64)
    got = group_normalized_sum(per, torch.tensor([0.7, 0.3], dtype=F64), 2, eps=1e-4)
    s1, s2 = math.sqrt(2), math.sqrt(200)  # unbiased stds of (1, 3) and (10, 30)
    first = [0.7 * -1 / (s1 + 1e-4) + 0.3 * -10 / (s2 + 1e-4), 0.7 * 1 / (s1 + 1e-4) + 0.3 * 10 / (s2 + 1e-4)]
    s3 = math.sqrt(4.5)  # (2, 5); the second function scored one sample of this group: 0
    second = [0.7 * -1.5 / (s3 + 1e-4), 0.7 * 1.5 / (s3 + 1e-4)]
    torch.testing.assert_close(got[:4], torch.tensor(first + second, dtype=F64))
    assert torch.isnan(got[4:]).all()


def test_the_batch_standardized_estimator():
    rewards = torch.zeros(4, 2, dtype=F64)
    rewards[:, -1] = torch.tensor([1.0, 2.0, 4.0, 9.0], dtype=F64)
    adv, _ = ADVANTAGE_ESTIMATORS.get("batch_standardized")(rewards, torch.ones(4, 2), group_size=2, eps=1e-4)
    x = rewards[:, -1]
    torch.testing.assert_close(adv[:, 0], (x - x.mean()) / (x.std() + 1e-4))
