"""Advantage estimators: GAE by hand, GAE identities, group / RLOO / REINFORCE baselines, whitening."""

import math
import statistics

import pytest
import torch

from rlhfkit.algorithms import (
    broadcast_sequence_advantages,
    gae,
    group_advantages,
    reinforce_advantages,
    rloo_advantages,
    whiten,
)

F64 = torch.float64


def t(x, dtype=F64):
    return torch.tensor(x, dtype=dtype)


# --------------------------------------------------------------------------------------------
# GAE on a 4-token example by hand
# --------------------------------------------------------------------------------------------

GAMMA, LAM = 0.9, 0.8  # γλ = 0.72
REWARDS = [0.1, -0.2, 0.0, 1.0]
VALUES = [0.5, 0.6, 0.7, 0.8]


def test_gae_four_tokens_by_hand():
    # t=3: δ3 = r3 + γ·0 - V3        = 1.0 - 0.8              =  0.2      A3 = 0.2
    # t=2: δ2 = r2 + γ·V3 - V2       = 0 + 0.72 - 0.7         =  0.02     A2 = 0.02 + 0.72·0.2      = 0.164
    # t=1: δ1 = r1 + γ·V2 - V1       = -0.2 + 0.63 - 0.6      = -0.17     A1 = -0.17 + 0.72·0.164   = -0.05192
    # t=0: δ0 = r0 + γ·V1 - V0       = 0.1 + 0.54 - 0.5       =  0.14     A0 = 0.14 + 0.72·(-0.05192) = 0.1026176
    expected_adv = [0.1026176, -0.05192, 0.164, 0.2]
    # returns = A + V
    expected_ret = [0.6026176, 0.54808, 0.864, 1.0]
    adv, ret = gae(t([REWARDS]), t([VALUES]), torch.ones(1, 4), GAMMA, LAM)
    torch.testing.assert_close(adv, t([expected_adv]), rtol=0, atol=1e-12)
    torch.testing.assert_close(ret, t([expected_ret]), rtol=0, atol=1e-12)


def test_gae_hole_in_the_middle_is_skipped():
    # Position 1 is masked (and holds NaN): the row behaves like the 3-token row
    # r = [0.1, 0.0, 1.0], V = [0.5, 0.7, 0.8].
    # t=3: A3 = 1.0 - 0.8 = 0.2
    # t=2: A2 = 0 + 0.9·0.8 - 0.7 + 0.72·0.2 = 0.02 + 0.144 = 0.164
    # t=0: δ0 = 0.1 + 0.9·V2 - V0 = 0.1 + 0.63 - 0.5 = 0.23;  A0 = 0.23 + 0.72·0.164 = 0.34808
    rewards = t([[0.1, math.nan, 0.0, 1.0]])
    values = t([[0.5, math.nan, 0.7, 0.8]])
    mask = torch.tensor([[True, False, True, True]])
    adv, ret = gae(rewards, values, mask, GAMMA, LAM)
    torch.testing.assert_close(adv, t([[0.34808, 0.0, 0.164, 0.2]]), rtol=0, atol=1e-12)
    torch.testing.assert_close(ret, t([[0.84808, 0.0, 0.864, 1.0]]), rtol=0, atol=1e-12)


def test_gae_masked_nan_does_not_leak():
    B, T = 3, 6
    g = torch.Generator().manual_seed(0)
    r = torch.randn(B, T, generator=g, dtype=F64)
    v = torch.randn(B, T, generator=g, dtype=F64)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 0, 1, 0, 1, 0], [0, 0, 1, 1, 1, 1]], dtype=torch.bool)
    r_nan = torch.where(mask, r, torch.full_like(r, math.nan))
    v_nan = torch.where(mask, v, torch.full_like(v, math.inf))
    adv, ret = gae(r_nan, v_nan, mask, 0.99, 0.95)
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    adv_ref, ret_ref = gae(r, v, mask, 0.99, 0.95)
    torch.testing.assert_close(adv, adv_ref)
    torch.testing.assert_close(ret, ret_ref)
    assert (adv[~mask] == 0).all() and (ret[~mask] == 0).all()


def _discounted_return(rewards, gamma):
    out, running = [0.0] * len(rewards), 0.0
    for i in reversed(range(len(rewards))):
        running = rewards[i] + gamma * running
        out[i] = running
    return out


def test_gae_lambda_one_is_monte_carlo_return_minus_value():
    adv, ret = gae(t([REWARDS]), t([VALUES]), torch.ones(1, 4), GAMMA, 1.0)
    mc = _discounted_return(REWARDS, GAMMA)
    # by hand: G3 = 1.0, G2 = 0.9, G1 = -0.2 + 0.81 = 0.61, G0 = 0.1 + 0.549 = 0.649
    assert mc == pytest.approx([0.649, 0.61, 0.9, 1.0])
    torch.testing.assert_close(adv, t([[g - v for g, v in zip(mc, VALUES)]]), rtol=0, atol=1e-12)
    torch.testing.assert_close(ret, t([mc]), rtol=0, atol=1e-12)


def test_gae_lambda_zero_is_td_residual():
    adv, _ = gae(t([REWARDS]), t([VALUES]), torch.ones(1, 4), GAMMA, 0.0)
    nxt = VALUES[1:] + [0.0]
    delta = [r + GAMMA * vn - v for r, v, vn in zip(REWARDS, VALUES, nxt)]
    assert delta == pytest.approx([0.14, -0.17, 0.02, 0.2])
    torch.testing.assert_close(adv, t([delta]), rtol=0, atol=1e-12)


def test_gae_returns_equal_advantages_plus_values_on_response_tokens():
    g = torch.Generator().manual_seed(1)
    r, v = torch.randn(4, 7, generator=g), torch.randn(4, 7, generator=g)
    mask = torch.rand(4, 7, generator=g) > 0.3
    adv, ret = gae(r, v, mask, 0.97, 0.9)
    torch.testing.assert_close(ret[mask], (adv + v)[mask])
    assert (ret[~mask] == 0).all() and (adv[~mask] == 0).all()


def test_gae_value_after_last_token_is_zero_even_with_trailing_padding():
    # A one-token response followed by padding: A = r - V (no bootstrap from the padding's value).
    adv, _ = gae(t([[2.0, 5.0, 5.0]]), t([[0.5, 100.0, 100.0]]), torch.tensor([[1, 0, 0]]), 0.9, 0.9)
    torch.testing.assert_close(adv, t([[1.5, 0.0, 0.0]]))


def test_gae_accepts_float_and_int_masks():
    r, v = t([REWARDS]), t([VALUES])
    a_bool, _ = gae(r, v, torch.tensor([[True, True, False, True]]), GAMMA, LAM)
    a_float, _ = gae(r, v, torch.tensor([[1.0, 1.0, 0.0, 1.0]]), GAMMA, LAM)
    a_int, _ = gae(r, v, torch.tensor([[1, 1, 0, 1]], dtype=torch.int32), GAMMA, LAM)
    torch.testing.assert_close(a_bool, a_float)
    torch.testing.assert_close(a_bool, a_int)


# --------------------------------------------------------------------------------------------
# Group-relative (GRPO / Dr.GRPO), RLOO, REINFORCE
# --------------------------------------------------------------------------------------------


def test_group_advantages_by_hand():
    # group 1: [1, 2, 3]: mean 2, unbiased std = sqrt((1 + 0 + 1) / 2) = 1
    # group 2: [0, 0, 6]: mean 2, unbiased std = sqrt((4 + 4 + 16) / 2) = sqrt(12)
    scores = t([1.0, 2.0, 3.0, 0.0, 0.0, 6.0])
    a = group_advantages(scores, 3, scale="std", eps=0.0)
    s12 = math.sqrt(12.0)
    torch.testing.assert_close(a, t([-1.0, 0.0, 1.0, -2 / s12, -2 / s12, 4 / s12]))
    torch.testing.assert_close(group_advantages(scores, 3, scale="none"), t([-1.0, 0.0, 1.0, -2.0, -2.0, 4.0]))


def test_group_advantages_std_matches_statistics_module():
    g = torch.Generator().manual_seed(2)
    scores = torch.randn(12, generator=g, dtype=F64)
    eps = 1e-6
    a = group_advantages(scores, 4, scale="std", eps=eps)
    expected = []
    for k in range(3):
        grp = scores[4 * k : 4 * k + 4].tolist()
        mu, sd = statistics.fmean(grp), statistics.stdev(grp)  # stdev is the unbiased (n-1) one
        expected += [(x - mu) / (sd + eps) for x in grp]
    torch.testing.assert_close(a, t(expected))


def test_group_advantages_identical_rewards_give_zero_not_nan():
    a = group_advantages(torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0]), 3)
    assert torch.equal(a, torch.zeros(6))


def test_group_advantages_default_eps():
    # scores [0, 1]: mean 0.5, unbiased std sqrt(0.5); default eps = 1e-6
    a = group_advantages(t([0.0, 1.0]), 2)
    sd = math.sqrt(0.5)
    torch.testing.assert_close(a, t([-0.5 / (sd + 1e-6), 0.5 / (sd + 1e-6)]))


def test_group_advantages_unknown_scale():
    with pytest.raises(ValueError, match=r"scale must be 'std' or 'none', got 'mad'"):
        group_advantages(torch.zeros(4), 2, scale="mad")


def test_rloo_by_hand():
    # group [1, 2, 6]: baselines (2+6)/2 = 4, (1+6)/2 = 3.5, (1+2)/2 = 1.5
    # group [5, 5]: baselines 5, 5
    a = rloo_advantages(t([1.0, 2.0, 6.0]), 3)
    torch.testing.assert_close(a, t([-3.0, -1.5, 4.5]))
    torch.testing.assert_close(rloo_advantages(t([5.0, 5.0, 1.0, 3.0]), 2), t([0.0, 0.0, -2.0, 2.0]))


def test_rloo_equals_scaled_group_centred():
    g = torch.Generator().manual_seed(3)
    for G in (2, 3, 5):
        scores = torch.randn(4 * G, generator=g, dtype=F64)
        mean = scores.reshape(4, G).mean(dim=1).repeat_interleave(G)
        torch.testing.assert_close(rloo_advantages(scores, G), G / (G - 1) * (scores - mean))
        torch.testing.assert_close(rloo_advantages(scores, G), G / (G - 1) * group_advantages(scores, G, scale="none"))


def test_reinforce_baselines():
    s = t([1.0, 2.0, 6.0])
    torch.testing.assert_close(reinforce_advantages(s), t([-2.0, -1.0, 3.0]))  # batch mean 3
    torch.testing.assert_close(reinforce_advantages(s, "none"), s)
    torch.testing.assert_close(reinforce_advantages(s, 0.5), t([0.5, 1.5, 5.5]))
    torch.testing.assert_close(reinforce_advantages(s, t(1.0)), t([0.0, 1.0, 5.0]))
    torch.testing.assert_close(reinforce_advantages(s, t([2.0])), t([-1.0, 0.0, 4.0]))
    out = reinforce_advantages(s, "none")
    out[0] = 99.0
    assert s[0] == 1.0  # "none" returns a copy, never an alias of the caller's scores


def test_reinforce_bad_baselines():
    with pytest.raises(ValueError, match=r"baseline must be 'batch_mean', 'none' or a number, got 'ema'"):
        reinforce_advantages(torch.zeros(3), "ema")
    with pytest.raises(ValueError, match=r"baseline tensor must hold one number, got shape \(2,\)"):
        reinforce_advantages(torch.zeros(3), torch.zeros(2))
    with pytest.raises(ValueError, match=r"scores must have 1 dimension\(s\), got shape \(3, 1\)"):
        reinforce_advantages(torch.zeros(3, 1))


# --------------------------------------------------------------------------------------------
# whiten, broadcast
# --------------------------------------------------------------------------------------------


def test_whiten_by_hand():
    # x = [1, 2, 3, 4]: mean 2.5, unbiased var = (2.25 + 0.25 + 0.25 + 2.25) / 3 = 5/3
    x = t([1.0, 2.0, 3.0, 4.0])
    sd = math.sqrt(5 / 3)
    torch.testing.assert_close(whiten(x, eps=0.0), t([-1.5 / sd, -0.5 / sd, 0.5 / sd, 1.5 / sd]))
    torch.testing.assert_close(
        whiten(x, shift_mean=False, eps=0.0), t([-1.5 / sd + 2.5, -0.5 / sd + 2.5, 0.5 / sd + 2.5, 1.5 / sd + 2.5])
    )


def test_whiten_masked_ignores_masked_values():
    x = t([[1.0, math.nan, 3.0], [100.0, 2.0, 4.0]])
    mask = torch.tensor([[1, 0, 1], [0, 1, 1]])
    # unmasked values [1, 3, 2, 4]: mean 2.5, unbiased var 5/3
    sd = math.sqrt(5 / 3 + 1e-8)
    expected = t([[-1.5 / sd, 0.0, 0.5 / sd], [0.0, -0.5 / sd, 1.5 / sd]])
    torch.testing.assert_close(whiten(x, mask), expected)


def test_whiten_output_statistics():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(5, 9, generator=g, dtype=F64) * 3 + 7
    mask = torch.rand(5, 9, generator=g) > 0.4
    w = whiten(x, mask)
    vals = w[mask]
    assert abs(vals.mean().item()) < 1e-9
    assert vals.std(unbiased=True).item() == pytest.approx(1.0, abs=1e-6)
    w2 = whiten(x, mask, shift_mean=False)
    assert w2[mask].mean().item() == pytest.approx(x[mask].mean().item(), abs=1e-9)


def test_whiten_needs_two_values():
    with pytest.raises(ValueError, match=r"at least 2 unmasked values, got 1 in shape \(2, 2\)"):
        whiten(torch.ones(2, 2), torch.tensor([[1, 0], [0, 0]]))
    with pytest.raises(ValueError, match=r"mask must have shape \(2, 2\), got \(2, 3\)"):
        whiten(torch.ones(2, 2), torch.ones(2, 3))


def test_broadcast_sequence_advantages():
    a = t([1.5, -2.0])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    torch.testing.assert_close(broadcast_sequence_advantages(a, mask), t([[1.5, 1.5, 0.0], [-2.0, 0.0, 0.0]]))
    with pytest.raises(ValueError, match=r"response_mask must have shape \(2, 3\), got \(3, 3\)"):
        broadcast_sequence_advantages(a, torch.ones(3, 3))
    with pytest.raises(ValueError, match=r"advantages must have 1 dimension\(s\), got shape \(2, 1\)"):
        broadcast_sequence_advantages(a[:, None], mask)
