"""Policy losses (PPO clip: four cases, asymmetric, dual clip; plain PG), value loss, aggregate()."""

import math
import statistics

import pytest
import torch

from rlhfkit.algorithms import AGGREGATIONS, aggregate, pg_loss, ppo_policy_loss, value_loss
from rlhfkit.algorithms import losses as losses_module

F64 = torch.float64


def t(x, dtype=F64):
    return torch.tensor(x, dtype=dtype)


def _policy_inputs(ratios, advantages, dtype=F64):
    """old_logprobs = log(0.5) everywhere, logprobs = old + log(ratio): ρ = ratio exactly (up to rounding)."""
    old = torch.full((1, len(ratios)), math.log(0.5), dtype=dtype)
    logprobs = (old + t([[math.log(r) for r in ratios]], dtype)).requires_grad_()
    return logprobs, old, t([advantages], dtype), torch.ones(1, len(ratios))


# --------------------------------------------------------------------------------------------
# PPO: the four clipping cases (reference "PPO for LLMs", §clipping)
# --------------------------------------------------------------------------------------------

EPS = 0.2
# case 1: A > 0, ρ ≤ 1+ε  → normal gradient
# case 2: A > 0, ρ > 1+ε  → clipped, gradient exactly 0
# case 3: A < 0, ρ ≥ 1-ε  → normal gradient
# case 4: A < 0, ρ < 1-ε  → clipped, gradient exactly 0
CASES = [
    # (ratio, A, loss_t, dloss_t/dlogp)   loss_t = -min(ρA, clip(ρ)A); d/dlogp(-ρA) = -Aρ
    (1.1, 1.0, -1.1, -1.1),
    (1.5, 2.0, -2.4, 0.0),  # -2·1.2
    (0.9, -1.0, 0.9, 0.9),
    (0.5, -3.0, 2.4, 0.0),  # 3·0.8
]


@pytest.mark.parametrize("case", range(4))
def test_ppo_single_case(case):
    ratio, a, loss_t, grad_t = CASES[case]
    logprobs, old, adv, mask = _policy_inputs([ratio], [a])
    loss, metrics = ppo_policy_loss(logprobs, old, adv, mask, clip_low=EPS, clip_high=EPS)
    loss.backward()
    assert loss.item() == pytest.approx(loss_t, abs=1e-12)
    if grad_t == 0.0:
        assert logprobs.grad.item() == 0.0  # exactly zero, not merely small
        assert metrics["policy/clip_frac"].value.item() == 1.0
    else:
        assert logprobs.grad.item() == pytest.approx(grad_t, abs=1e-12)
        assert metrics["policy/clip_frac"].value.item() == 0.0


def test_ppo_four_cases_in_one_batch():
    ratios = [c[0] for c in CASES]
    logprobs, old, adv, mask = _policy_inputs(ratios, [c[1] for c in CASES])
    loss, m = ppo_policy_loss(logprobs, old, adv, mask, clip_low=EPS, clip_high=EPS)
    loss.backward()
    # token-mean: (-1.1 - 2.4 + 0.9 + 2.4) / 4 = -0.05
    assert loss.item() == pytest.approx(-0.05, abs=1e-12)
    # gradient = -A·ρ / N on unclipped tokens, exactly 0 on clipped ones
    expected_grad = t([[-1.1 / 4, 0.0, 0.9 / 4, 0.0]])
    torch.testing.assert_close(logprobs.grad, expected_grad, rtol=0, atol=1e-12)
    assert logprobs.grad[0, 1].item() == 0.0 and logprobs.grad[0, 3].item() == 0.0
    assert m["policy/clip_frac"].value.item() == pytest.approx(0.5)
    assert m["policy/clip_frac_dual"].value.item() == 0.0
    # approx_kl = mean(old - new) = -mean(log ρ)
    assert m["policy/approx_kl"].value.item() == pytest.approx(-sum(math.log(r) for r in ratios) / 4, abs=1e-12)
    # k3 of (new, old): log r = old - new = -log ρ → 1/ρ + log ρ - 1
    k3 = sum(1 / r + math.log(r) - 1 for r in ratios) / 4
    assert m["policy/approx_kl_k3"].value.item() == pytest.approx(k3, abs=1e-12)
    assert m["policy/ratio_mean"].value.item() == pytest.approx(sum(ratios) / 4, abs=1e-12)
    for v in m.values():
        assert v.value.dim() == 0 and not v.stats.requires_grad


def test_ppo_other_directions_are_not_clipped():
    # A > 0 with ρ < 1-ε and A < 0 with ρ > 1+ε: the unclipped term is the minimum, gradient flows.
    logprobs, old, adv, mask = _policy_inputs([0.5, 1.5], [1.0, -1.0])
    loss, m = ppo_policy_loss(logprobs, old, adv, mask)
    loss.backward()
    assert loss.item() == pytest.approx((-0.5 + 1.5) / 2, abs=1e-12)
    torch.testing.assert_close(logprobs.grad, t([[-0.5 / 2, 1.5 / 2]]), rtol=0, atol=1e-12)
    assert m["policy/clip_frac"].value.item() == 0.0


def test_ppo_on_policy_gradient_equals_minus_advantage():
    # ρ = 1 (first minibatch): loss = -mean(A), d/dlogp = -A/N
    old = t([[-1.0, -2.0, -0.5]])
    logprobs = old.clone().requires_grad_()
    adv = t([[0.3, -1.2, 2.0]])
    loss, m = ppo_policy_loss(logprobs, old, adv, torch.ones(1, 3))
    loss.backward()
    assert loss.item() == pytest.approx(-(0.3 - 1.2 + 2.0) / 3)
    torch.testing.assert_close(logprobs.grad, -adv / 3)
    assert m["policy/approx_kl"].value.item() == 0.0 and m["policy/approx_kl_k3"].value.item() == 0.0


def test_ppo_asymmetric_clip_higher():
    lo, hi = 0.2, 0.28
    # (ρ, A): 1.25 with A=1 is inside 1+0.28 → unclipped; 1.3 with A=1 → clipped at 1.28;
    #         0.75 with A=-1 is below 1-0.2 → clipped at 0.8; 0.85 with A=-1 → unclipped
    logprobs, old, adv, mask = _policy_inputs([1.25, 1.3, 0.75, 0.85], [1.0, 1.0, -1.0, -1.0])
    loss, m = ppo_policy_loss(logprobs, old, adv, mask, clip_low=lo, clip_high=hi)
    loss.backward()
    # loss_t = [-1.25, -1.28, 0.8, 0.85] → mean = 0.12 / 4 = 0.03
    assert loss.item() == pytest.approx((-1.25 - 1.28 + 0.8 + 0.85) / 4, abs=1e-12)
    torch.testing.assert_close(logprobs.grad, t([[-1.25 / 4, 0.0, 0.0, 0.85 / 4]]), rtol=0, atol=1e-12)
    assert m["policy/clip_frac"].value.item() == pytest.approx(0.5)
    # the same inputs with a symmetric 0.2 clip the first token too
    logprobs2, *_ = _policy_inputs([1.25, 1.3, 0.75, 0.85], [1.0, 1.0, -1.0, -1.0])
    loss2, m2 = ppo_policy_loss(logprobs2, old, adv, mask, clip_low=0.2, clip_high=0.2)
    assert loss2.item() == pytest.approx((-1.2 - 1.2 + 0.8 + 0.85) / 4, abs=1e-12)
    assert m2["policy/clip_frac"].value.item() == pytest.approx(0.75)


def test_ppo_dual_clip():
    c = 3.0
    # (ρ, A): (5, -1): plain clip gives max(5, 1.2) = 5 > c·|A| = 3 → bounded to 3, gradient 0
    #         (2, -1): plain 2 < 3 → 2, gradient -Aρ/N = 2/4
    #         (5,  1): A > 0 → plain clip: -1.2, gradient 0 (dual clip does not apply)
    #         (0.5, -2): plain clip: 2·0.8 = 1.6 < 6 → 1.6, gradient 0
    logprobs, old, adv, mask = _policy_inputs([5.0, 2.0, 5.0, 0.5], [-1.0, -1.0, 1.0, -2.0])
    loss, m = ppo_policy_loss(logprobs, old, adv, mask, dual_clip=c)
    loss.backward()
    assert loss.item() == pytest.approx((3.0 + 2.0 - 1.2 + 1.6) / 4, abs=1e-12)
    torch.testing.assert_close(logprobs.grad, t([[0.0, 2.0 / 4, 0.0, 0.0]]), rtol=0, atol=1e-12)
    assert logprobs.grad[0, 0].item() == 0.0
    assert m["policy/clip_frac_dual"].value.item() == pytest.approx(0.25)
    # without dual clip the first token costs 5 and keeps its gradient
    logprobs2, *_ = _policy_inputs([5.0, 2.0, 5.0, 0.5], [-1.0, -1.0, 1.0, -2.0])
    loss2, _ = ppo_policy_loss(logprobs2, old, adv, mask)
    loss2.backward()
    assert loss2.item() == pytest.approx((5.0 + 2.0 - 1.2 + 1.6) / 4, abs=1e-12)
    assert logprobs2.grad[0, 0].item() == pytest.approx(5.0 / 4)


def test_ppo_dual_clip_bounds_loss_for_huge_ratio():
    # log ρ = 50 is clamped to 20 internally; with dual clip the loss is exactly -c·A.
    old = t([[0.0]])
    logprobs = t([[50.0]]).requires_grad_()
    loss, _ = ppo_policy_loss(logprobs, old, t([[-0.5]]), torch.ones(1, 1), dual_clip=3.0)
    loss.backward()
    assert loss.item() == pytest.approx(1.5)
    assert logprobs.grad.item() == 0.0
    assert torch.isfinite(loss)


def test_ppo_sequence_level_advantages_broadcast():
    old = t([[-1.0, -1.0], [-1.0, -1.0]])
    lp = old.clone()
    loss_b, _ = ppo_policy_loss(lp, old, t([1.0, -3.0]), torch.ones(2, 2))
    loss_f, _ = ppo_policy_loss(lp, old, t([[1.0, 1.0], [-3.0, -3.0]]), torch.ones(2, 2))
    assert loss_b.item() == loss_f.item() == pytest.approx(1.0)


def test_ppo_advantages_receive_no_gradient():
    old = t([[-1.0, -0.5]])
    lp = old.clone().requires_grad_()
    adv = t([[1.0, 2.0]]).requires_grad_()
    loss, _ = ppo_policy_loss(lp, old, adv * 1.0, torch.ones(1, 2))
    loss.backward()
    assert adv.grad is None


def test_ppo_aggregation_modes_and_float32():
    old = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]])
    adv = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    # ρ = 1: loss_t = -A; token-mean = -(1+2+4)/3; seq-mean-token-mean = -(1.5 + 4)/2
    for agg, expected in [
        ("token-mean", -7 / 3),
        ("seq-mean-token-mean", -2.75),
        ("seq-mean-token-sum", -3.5),
        ("seq-mean-token-sum-norm", -7 / 6),
    ]:
        loss, _ = ppo_policy_loss(old.clone(), old, adv, mask, agg=agg)
        assert loss.dtype == torch.float32
        assert loss.item() == pytest.approx(expected, rel=1e-6)
    loss, _ = ppo_policy_loss(old.clone(), old, adv, mask, agg="seq-mean-token-sum-norm", horizon=7)
    assert loss.item() == pytest.approx(-7 / 14, rel=1e-6)


def test_ppo_validation():
    lp = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r"clip_low and clip_high must be >= 0, got -0.1, 0.2"):
        ppo_policy_loss(lp, lp, lp, torch.ones(2, 3), clip_low=-0.1)
    with pytest.raises(ValueError, match=r"dual_clip must be > 1, got 1.0"):
        ppo_policy_loss(lp, lp, lp, torch.ones(2, 3), dual_clip=1.0)
    with pytest.raises(ValueError, match=r"advantages must have shape \(2, 3\) or \(2,\), got \(3,\)"):
        ppo_policy_loss(lp, lp, torch.zeros(3), torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"logprobs=\(2, 3\), old_logprobs=\(2, 4\)"):
        ppo_policy_loss(lp, torch.zeros(2, 4), lp, torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"logprobs must have 2 dimension\(s\), got shape \(3,\)"):
        ppo_policy_loss(torch.zeros(3), torch.zeros(3), torch.zeros(3), torch.ones(3))
    with pytest.raises(ValueError, match=r"advantages must be a torch.Tensor, got float"):
        ppo_policy_loss(lp, lp, 1.0, torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"response_mask must have shape \(2, 3\), got \(3, 2\)"):
        ppo_policy_loss(lp, lp, lp, torch.ones(3, 2))


# --------------------------------------------------------------------------------------------
# Plain policy gradient
# --------------------------------------------------------------------------------------------


def test_pg_loss_by_hand():
    lp = t([[-1.0, -2.0, 9.0], [-0.5, -0.5, -0.5]]).requires_grad_()
    old = t([[-1.0, -1.5, 0.0], [-0.5, -1.0, -0.5]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    adv = t([2.0, -1.0])
    loss, m = pg_loss(lp, old, adv, mask)  # default agg: seq-mean-token-sum
    # row 0: -2·(-1 - 2) = 6; row 1: 1·(-1.5) = -1.5 → mean 2.25
    assert loss.item() == pytest.approx(2.25)
    loss.backward()
    # d/dlp = -A_i / B on response tokens
    torch.testing.assert_close(lp.grad, t([[-1.0, -1.0, 0.0], [0.5, 0.5, 0.5]]))
    # approx_kl over the 5 response tokens: (0 + 0.5 + 0 - 0.5 + 0) / 5 = 0
    assert m["policy/approx_kl"].value.item() == pytest.approx(0.0)
    k3 = (math.exp(0.5) - 0.5 - 1) + (math.exp(-0.5) + 0.5 - 1)  # tokens (0,1) and (1,1)
    assert m["policy/approx_kl_k3"].value.item() == pytest.approx(k3 / 5)
    loss_tm, _ = pg_loss(lp, old, adv, mask, agg="token-mean")
    assert loss_tm.item() == pytest.approx((6.0 - 1.5) / 5)


# --------------------------------------------------------------------------------------------
# Value loss
# --------------------------------------------------------------------------------------------

V = [[1.0, 2.0, 2.0]]
OLD_V = [[0.9, 1.0, 1.0]]
R = [[1.5, 1.0, 3.0]]


def test_value_loss_unclipped():
    v = t(V).requires_grad_()
    loss, m = value_loss(v, t(OLD_V), t(R), torch.ones(1, 3))
    # 0.5 (v - R)^2 = [0.125, 0.5, 0.5] → mean 1.125 / 3
    assert loss.item() == pytest.approx(1.125 / 3)
    loss.backward()
    torch.testing.assert_close(v.grad, t([[-0.5 / 3, 1.0 / 3, -1.0 / 3]]))
    assert m["critic/value_clip_frac"].value.item() == 0.0
    assert m["critic/values_mean"].value.item() == pytest.approx(5 / 3)


def test_value_loss_clipped_by_hand():
    v = t(V).requires_grad_()
    loss, m = value_loss(v, t(OLD_V), t(R), torch.ones(1, 3), clip=0.2)
    # v_clipped = old + clip(v - old, ±0.2) = [1.0, 1.2, 1.2]
    # tok0: (v-R)^2 = 0.25, (vc-R)^2 = 0.25 → 0.125
    # tok1: 1.0 vs (1.2-1.0)^2 = 0.04 → 0.5
    # tok2: 1.0 vs (1.2-3.0)^2 = 3.24 → 1.62   (clipped term active: its gradient w.r.t. v is 0)
    assert loss.item() == pytest.approx((0.125 + 0.5 + 1.62) / 3)
    loss.backward()
    torch.testing.assert_close(v.grad, t([[-0.5 / 3, 1.0 / 3, 0.0]]))
    assert v.grad[0, 2].item() == 0.0
    assert m["critic/value_clip_frac"].value.item() == pytest.approx(1 / 3)


def test_value_loss_explained_variance():
    values, returns = [0.0, 1.0, 1.5, 4.0], [0.5, 1.0, 2.0, 3.0]
    _, m = value_loss(t([values]), t([values]), t([returns]), torch.ones(1, 4))
    resid = [r - v for r, v in zip(returns, values)]
    ev = 1 - statistics.pvariance(resid) / statistics.pvariance(returns)
    # by hand: Var(R) = 3.6875/4 = 0.921875; residuals [0.5, 0, 0.5, -1] (mean 0): Var = 1.5/4 = 0.375
    assert ev == pytest.approx(1 - 0.375 / 0.921875)
    assert m["critic/explained_variance"].value.item() == pytest.approx(ev)
    # a perfect critic explains everything
    _, m2 = value_loss(t([returns]), t([returns]), t([returns]), torch.ones(1, 4))
    assert m2["critic/explained_variance"].value.item() == pytest.approx(1.0)


def test_value_loss_masked_and_validation():
    v = t([[1.0, math.nan], [3.0, 0.0]])
    r = t([[2.0, 7.0], [1.0, math.inf]])
    mask = torch.tensor([[1, 0], [1, 0]])
    loss, m = value_loss(v, v, r, mask, clip=0.5)
    # 0.5·[1, 4] → mean 1.25
    assert loss.item() == pytest.approx(1.25)
    assert all(torch.isfinite(x.value) for x in m.values())
    with pytest.raises(ValueError, match=r"value clip must be > 0 or None, got 0"):
        value_loss(v, v, r, mask, clip=0)
    with pytest.raises(ValueError, match=r"values=\(2, 2\), old_values=\(2, 2\), returns=\(2, 3\)"):
        value_loss(v, v, torch.zeros(2, 3), mask)


# --------------------------------------------------------------------------------------------
# aggregate
# --------------------------------------------------------------------------------------------

L = [[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]]
M = [[1, 1, 0, 0], [1, 1, 1, 0]]
AGG_EXPECTED = {
    "token-mean": 21 / 5,  # (1+2+5+6+7)/5
    "seq-mean-token-mean": (3 / 2 + 18 / 3) / 2,  # 3.75
    "seq-mean-token-sum": (3 + 18) / 2,  # 10.5
    "seq-mean-token-sum-norm": 21 / (2 * 4),  # horizon defaults to T = 4
    "micro-batch-token-mean": 21 / 5,  # one micro-batch: its token mean (the update weighs micro-batches alike)
}


@pytest.mark.parametrize("mode", AGGREGATIONS)
def test_aggregate_by_hand(mode):
    out = aggregate(t(L), torch.tensor(M), mode)
    assert out.dim() == 0
    assert out.item() == pytest.approx(AGG_EXPECTED[mode])


def test_aggregate_modes_are_the_five_of_the_contract():
    assert set(AGGREGATIONS) == set(AGG_EXPECTED)


def test_aggregate_default_mode_is_token_mean():
    assert aggregate(t(L), torch.tensor(M)).item() == pytest.approx(21 / 5)


def test_aggregate_horizon():
    assert aggregate(t(L), torch.tensor(M), "seq-mean-token-sum-norm", horizon=10).item() == pytest.approx(21 / 20)
    with pytest.raises(ValueError, match=r"horizon must be > 0, got 0"):
        aggregate(t(L), torch.tensor(M), "seq-mean-token-sum-norm", horizon=0)


@pytest.mark.parametrize("mode", AGGREGATIONS)
def test_aggregate_empty_rows_count_for_nothing(mode):
    loss = t(L + [[9.0, math.nan, 9.0, 9.0]])
    mask = torch.tensor(M + [[0, 0, 0, 0]])
    out = aggregate(loss, mask, mode)
    assert torch.isfinite(out)
    assert out.item() == pytest.approx(AGG_EXPECTED[mode])


@pytest.mark.parametrize("mode", AGGREGATIONS)
def test_aggregate_all_zero_mask_is_zero_not_nan(mode):
    loss = t(L).requires_grad_()
    out = aggregate(loss, torch.zeros(2, 4), mode)
    assert out.item() == 0.0
    out.backward()
    assert torch.equal(loss.grad, torch.zeros(2, 4, dtype=F64))


@pytest.mark.parametrize("mode", AGGREGATIONS)
def test_aggregate_gradient_is_zero_on_masked_positions(mode):
    loss = t(L).requires_grad_()
    aggregate(loss, torch.tensor(M), mode).backward()
    assert (loss.grad[~torch.tensor(M).bool()] == 0).all()


def test_aggregate_gradient_weights_by_hand():
    loss = t(L).requires_grad_()
    aggregate(loss, torch.tensor(M), "seq-mean-token-mean").backward()
    # row 0 has 2 tokens → 1/(2·2); row 1 has 3 tokens → 1/(2·3)
    torch.testing.assert_close(loss.grad, t([[0.25, 0.25, 0, 0], [1 / 6, 1 / 6, 1 / 6, 0]]))


def test_aggregate_validation():
    with pytest.raises(ValueError, match=r"unknown aggregation mode 'sum'; valid: token-mean, seq-mean-token-mean"):
        aggregate(t(L), torch.tensor(M), "sum")
    with pytest.raises(ValueError, match=r"loss_mat must have 2 dimension\(s\), got shape \(4,\)"):
        aggregate(torch.zeros(4), torch.ones(4))
    with pytest.raises(ValueError, match=r"mask must have shape \(2, 4\), got \(2, 3\)"):
        aggregate(t(L), torch.ones(2, 3))


def test_entropy_is_reexported_from_losses():
    from rlhfkit.algorithms import entropy_from_logits

    assert losses_module.entropy_from_logits is entropy_from_logits


def test_value_loss_explained_variance_is_zero_for_constant_returns():
    values = torch.tensor([[0.1, 0.4, -0.2]])
    returns = torch.full((1, 3), 2.0)
    _, m = value_loss(values, values, returns, torch.ones(1, 3))
    assert m["critic/explained_variance"].value.item() == 0.0
