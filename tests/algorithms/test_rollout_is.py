"""Rollout importance-sampling correction (engine vs trainer mismatch): every mode against values
computed by hand, padding garbage, the trainer's own sampler, gradients, refusals, empty masks,
and the ``weights`` argument of the policy losses."""

import math

import pytest
import torch

from rlhfkit.algorithms import (
    ROLLOUT_IS_MODES,
    rollout_is_weights,
)

F64 = torch.float64
NAN, INF = float("nan"), float("inf")
L = math.log


def t(x, dtype=F64):
    return torch.tensor(x, dtype=dtype)


# --------------------------------------------------------------------------------------------
# the hand example: 3 rows x 3 tokens, threshold C = 2 (so the mask bounds are [1/2, 2])
# --------------------------------------------------------------------------------------------
#
# token ratios ρ_t = π_old / π_rollout (old and rollout are the logs of these probabilities):
#   row 0: 0.25/0.5 = 0.5 | 0.75/0.25 = 3   | 0.9/0.9 = 1      → sequence ratio 0.5·3·1   = 1.5
#   row 1: 0.75/0.5 = 1.5 | 0.5/0.25  = 2   | padding          → sequence ratio 1.5·2     = 3
#   row 2: 0.25/0.5 = 0.5 | 0.25/0.5  = 0.5 | 0.9/0.9 = 1      → sequence ratio 0.5·0.5·1 = 0.25
# ln .25 - ln .5 = -ln 2 and ln .5 - ln .25 = ln 2 exactly in float64 (ln .25 = 2 ln .5), so the
# ratios 0.5 and 2 sit exactly on the bounds of the mask interval (which are included).
# The padding (row 1, token 2) holds old = NaN, rollout = inf.
OLD = [[L(0.25), L(0.75), L(0.9)], [L(0.75), L(0.5), NAN], [L(0.25), L(0.25), L(0.9)]]
ROLLOUT = [[L(0.5), L(0.25), L(0.9)], [L(0.5), L(0.25), INF], [L(0.5), L(0.5), L(0.9)]]
MASK = [[1, 1, 1], [1, 1, 0], [1, 1, 1]]
C = 2.0

# mode: (weights, mask, is_weight_mean, is_masked_frac)
EXPECTED = {
    # w = 1 on the mask
    "none": ([[1, 1, 1], [1, 1, 0], [1, 1, 1]], MASK, 1.0, 0.0),
    # w_t = min(ρ_t, 2); mean over the 8 tokens = (0.5+2+1 + 1.5+2 + 0.5+0.5+1) / 8 = 9/8
    "token_truncate": ([[0.5, 2, 1], [1.5, 2, 0], [0.5, 0.5, 1]], MASK, 9 / 8, 0.0),
    # ρ = 3 > 2 leaves the mask; 0.5 >= 1/2 and 2 <= 2 stay with w = ρ;
    # mean over the 7 kept = (0.5+1 + 1.5+2 + 0.5+0.5+1) / 7 = 7/7 = 1; removed 1 of 8
    "token_mask": ([[0.5, 0, 1], [1.5, 2, 0], [0.5, 0.5, 1]], [[1, 0, 1], [1, 1, 0], [1, 1, 1]], 1.0, 1 / 8),
    # w_i = min(ρ_i, 2) on the row's tokens (no lower cap: 0.25 stays);
    # mean = (3·1.5 + 2·2 + 3·0.25) / 8 = 9.25/8
    "sequence_truncate": ([[1.5, 1.5, 1.5], [2, 2, 0], [0.25, 0.25, 0.25]], MASK, 9.25 / 8, 0.0),
    # row 1 (3 > 2) and row 2 (0.25 < 1/2) leave the mask: 2 + 3 = 5 of 8 tokens removed;
    # row 0 keeps w = 1.5 on its 3 tokens: mean 1.5
    "sequence_mask": ([[1.5, 1.5, 1.5], [0, 0, 0], [0, 0, 0]], [[1, 1, 1], [0, 0, 0], [0, 0, 0]], 1.5, 5 / 8),
}
# |old - rollout| over the 8 tokens: ln2, ln3, 0 | ln1.5, ln2 | ln2, ln2, 0
DIFF_MEAN = (4 * L(2) + L(3) + L(1.5)) / 8
DIFF_MAX = L(3)


def test_every_mode_has_a_hand_example():
    assert set(EXPECTED) == set(ROLLOUT_IS_MODES)


def test_hand_example_bounds_are_exact():
    """The premise of the boundary cases: the float64 log-ratios are exactly ±ln 2."""
    assert L(0.25) - L(0.5) == -L(2)
    assert L(0.5) - L(0.25) == L(2)


@pytest.mark.parametrize("mode", ROLLOUT_IS_MODES)
def test_every_mode_by_hand(mode):
    weights, mask, metrics = rollout_is_weights(t(OLD), t(ROLLOUT), t(MASK, torch.int64), mode, C)
    w_exp, m_exp, wmean, masked = EXPECTED[mode]
    assert weights.dtype == torch.float32 and weights.shape == (3, 3)
    assert mask.dtype == torch.bool
    torch.testing.assert_close(weights, t(w_exp, torch.float32), rtol=1e-6, atol=0)
    assert torch.equal(mask, t(m_exp, torch.int64).bool())
    assert torch.isfinite(weights).all()
    assert set(metrics) == {
        "rollout/logprob_diff_mean",
        "rollout/logprob_diff_max",
        "rollout/is_weight_mean",
        "rollout/is_masked_frac",
        "rollout/is_weight_std",
        "rollout/kl_sampler_trainer",
    }
    for v in metrics.values():
        assert v.value.dim() == 0 and v.value.dtype in (torch.float32, torch.float64) and not v.stats.requires_grad
    assert metrics["rollout/logprob_diff_mean"].value.item() == pytest.approx(DIFF_MEAN, rel=1e-6)
    assert metrics["rollout/logprob_diff_max"].value.item() == pytest.approx(DIFF_MAX, rel=1e-6)
    assert metrics["rollout/is_weight_mean"].value.item() == pytest.approx(wmean, rel=1e-6)
    assert metrics["rollout/is_masked_frac"].value.item() == pytest.approx(masked, rel=1e-6)


def test_default_mode_is_token_truncate_with_threshold_2():
    w_default, m_default, _ = rollout_is_weights(t(OLD), t(ROLLOUT), t(MASK))
    w, m, _ = rollout_is_weights(t(OLD), t(ROLLOUT), t(MASK), "token_truncate", 2.0)
    assert torch.equal(w_default, w) and torch.equal(m_default, m)


def test_a_wider_threshold_keeps_more():
    """C = 4: bounds [1/4, 4]. token_truncate no longer caps ρ = 3; token_mask keeps it; sequence_mask
    keeps row 1 (3 <= 4) and row 2 (0.25 >= 1/4, the bound: ln .25 sums -ln2 - ln2 exactly)."""
    w, m, _ = rollout_is_weights(t(OLD), t(ROLLOUT), t(MASK), "token_truncate", 4.0)
    torch.testing.assert_close(w, t([[0.5, 3, 1], [1.5, 2, 0], [0.5, 0.5, 1]], torch.float32), rtol=1e-6, atol=0)
    w, m, _ = rollout_is_weights(t(OLD), t(ROLLOUT), t(MASK), "token_mask", 4.0)
    assert torch.equal(m, t(MASK).bool())
    w, m, met = rollout_is_weights(t(OLD), t(ROLLOUT), t(MASK), "sequence_mask", 4.0)
    assert torch.equal(m, t(MASK).bool())
    torch.testing.assert_close(w, t([[1.5] * 3, [3, 3, 0], [0.25] * 3], torch.float32), rtol=1e-6, atol=0)
    assert met["rollout/is_masked_frac"].value.item() == 0.0


# --------------------------------------------------------------------------------------------
# padding, the trainer's own sampler, overflow
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ROLLOUT_IS_MODES)
@pytest.mark.parametrize("garbage", [(NAN, NAN), (INF, -INF), (-INF, INF), (INF, INF), (1e30, -1e30), (0.0, 0.0)])
def test_padding_content_changes_nothing(mode, garbage):
    ref = rollout_is_weights(t(OLD), t(ROLLOUT), t(MASK), mode, C)
    old, rollout = t(OLD), t(ROLLOUT)
    old[1, 2], rollout[1, 2] = garbage
    got = rollout_is_weights(old, rollout, t(MASK), mode, C)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
    for k in ref[2]:
        assert torch.equal(got[2][k].stats, ref[2][k].stats), k


@pytest.mark.parametrize("mode", ROLLOUT_IS_MODES)
@pytest.mark.parametrize("dtype", [F64, torch.float32, torch.bfloat16])
def test_own_sampler_gives_weights_exactly_one(mode, dtype):
    """old == rollout (the trainer samples itself): every weight exactly 1, nothing masked, no diff."""
    g = torch.Generator().manual_seed(0)
    lp = -torch.rand(4, 6, generator=g, dtype=F64).mul(5).to(dtype)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0], [1, 0, 1, 1, 0, 1]])
    lp = torch.where(mask.bool(), lp, torch.full_like(lp, NAN))  # NaN padding: NaN - NaN is NaN, not 0
    weights, kept, metrics = rollout_is_weights(lp, lp.clone(), mask, mode, 1.5)
    assert torch.equal(weights, mask.float())
    assert torch.equal(kept, mask.bool())
    assert metrics["rollout/logprob_diff_mean"].value.item() == 0.0
    assert metrics["rollout/logprob_diff_max"].value.item() == 0.0
    assert metrics["rollout/is_weight_mean"].value.item() == 1.0
    assert metrics["rollout/is_masked_frac"].value.item() == 0.0


@pytest.mark.parametrize("mode", ROLLOUT_IS_MODES)
def test_huge_log_ratios_are_clamped_before_exp(mode):
    """A log-ratio of ±1000 (or ±inf: the engine gave a sampled token probability 0) is clamped to
    ±20 before exp: everything stays finite. With C = inf, token_truncate gives exactly exp(20)."""
    old = t([[0.0, -1000.0, 0.0, -5.0], [0.0, 0.0, 0.0, 0.0]])
    rollout = t([[-1000.0, 0.0, -INF, -5.0], [-15.0, -15.0, -15.0, 0.0]])  # row 1: Σ lr = 45 → 20
    mask = torch.ones(2, 4)
    for c in (2.0, INF):
        weights, kept, metrics = rollout_is_weights(old, rollout, mask, mode, c)
        assert torch.isfinite(weights).all()
        for k, v in metrics.items():
            if k != "rollout/logprob_diff_max" and k != "rollout/logprob_diff_mean":  # |old - rollout| = inf: honest
                assert torch.isfinite(v.value), k
    weights, _, _ = rollout_is_weights(old, rollout, mask, "token_truncate", INF)
    # exp(20) exp(-20) exp(20) 1 | exp(15) x3, 1
    e = math.exp
    torch.testing.assert_close(weights, t([[e(20), e(-20), e(20), 1], [e(15), e(15), e(15), 1]], torch.float32))
    weights, _, _ = rollout_is_weights(old, rollout, mask, "sequence_truncate", INF)
    # row 0: 20 - 20 + 20 + 0 = 20; row 1: 3·15 = 45 clamped to 20
    torch.testing.assert_close(weights, torch.full((2, 4), e(20), dtype=torch.float32))


# --------------------------------------------------------------------------------------------
# gradients, refusals, empty masks, mask dtypes
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ROLLOUT_IS_MODES)
def test_no_gradient_through_the_weights(mode):
    old = t(OLD).nan_to_num(0.0, 0.0, 0.0).requires_grad_()
    rollout = t(ROLLOUT).nan_to_num(0.0, 0.0, 0.0).requires_grad_()
    weights, kept, metrics = rollout_is_weights(old, rollout, t(MASK), mode, C)
    assert not weights.requires_grad and weights.grad_fn is None
    assert not kept.requires_grad
    assert all(not v.stats.requires_grad for v in metrics.values())


@pytest.mark.parametrize("threshold", [1.0, 0.5, 0.0, -2.0, NAN, True, "2"])
def test_threshold_must_exceed_one(threshold):
    with pytest.raises(ValueError, match=r"threshold must be a number > 1") as info:
        rollout_is_weights(t(OLD), t(ROLLOUT), t(MASK), "token_truncate", threshold)
    assert "\n" not in str(info.value)


def test_threshold_may_be_an_int():
    w_int, _, _ = rollout_is_weights(t(OLD), t(ROLLOUT), t(MASK), "token_truncate", 2)
    w_float, _, _ = rollout_is_weights(t(OLD), t(ROLLOUT), t(MASK), "token_truncate", 2.0)
    assert torch.equal(w_int, w_float)


@pytest.mark.parametrize("mode", ["token-truncate", "tis", "", "NONE"])
def test_unknown_mode_lists_the_modes(mode):
    with pytest.raises(ValueError, match="unknown rollout IS mode") as info:
        rollout_is_weights(t(OLD), t(ROLLOUT), t(MASK), mode, C)
    assert all(m in str(info.value) for m in ROLLOUT_IS_MODES)


def test_shapes_are_checked():
    with pytest.raises(ValueError, match="shape mismatch"):
        rollout_is_weights(t(OLD), t(ROLLOUT)[:, :2], t(MASK))
    with pytest.raises(ValueError, match="response_mask must have shape"):
        rollout_is_weights(t(OLD), t(ROLLOUT), t(MASK)[:2])
    with pytest.raises(ValueError, match="must have 2 dimension"):
        rollout_is_weights(t(OLD)[0], t(ROLLOUT)[0], t(MASK)[0])


@pytest.mark.parametrize("mode", ROLLOUT_IS_MODES)
@pytest.mark.parametrize("shape", [(3, 3), (0, 3), (2, 0)])
def test_empty_mask_gives_finite_metrics(mode, shape):
    """No response token: weights all 0, mask all False, diff metrics 0, weight mean 1 (no
    correction), masked fraction 0 — never NaN, even over NaN inputs or an empty batch."""
    old = torch.full(shape, NAN, dtype=F64)
    weights, kept, metrics = rollout_is_weights(old, old.clone(), torch.zeros(shape), mode, C)
    assert weights.shape == shape and not weights.any() and not kept.any()
    assert metrics["rollout/logprob_diff_mean"].value.item() == 0.0
    assert metrics["rollout/logprob_diff_max"].value.item() == 0.0
    assert metrics["rollout/is_weight_mean"].value.item() == 1.0
    assert metrics["rollout/is_masked_frac"].value.item() == 0.0


def test_weight_mean_is_one_when_every_token_is_masked():
    """Every token rejected: the kept set is empty, the weight mean reads 1, the masked fraction 1."""
    old, rollout = t([[0.0, 0.0]]), t([[-5.0, 5.0]])  # ρ = e^5, e^-5: both outside [1/2, 2]
    weights, kept, metrics = rollout_is_weights(old, rollout, torch.ones(1, 2), "token_mask", C)
    assert not kept.any() and not weights.any()
    assert metrics["rollout/is_weight_mean"].value.item() == 1.0
    assert metrics["rollout/is_masked_frac"].value.item() == 1.0


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.int64, torch.uint8, torch.float32, F64])
def test_mask_dtypes_agree(mask_dtype):
    ref = rollout_is_weights(t(OLD), t(ROLLOUT), t(MASK).bool(), "token_mask", C)
    got = rollout_is_weights(t(OLD), t(ROLLOUT), t(MASK).to(mask_dtype), "token_mask", C)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])


def test_returned_mask_is_a_subset_of_the_response_mask():
    g = torch.Generator().manual_seed(3)
    old = -torch.rand(8, 10, generator=g).mul(4)
    rollout = old + torch.randn(8, 10, generator=g).mul(0.5)
    mask = torch.rand(8, 10, generator=g) > 0.3
    for mode in ROLLOUT_IS_MODES:
        weights, kept, _ = rollout_is_weights(old, rollout, mask, mode, 1.3)
        assert not (kept & ~mask).any()
        assert not weights[~kept].any()
        assert (weights[kept] > 0).all()
        if mode.endswith("mask"):
            assert (weights[kept] >= 1 / 1.3).all() and (weights[kept] <= 1.3).all()
        if mode.endswith("truncate"):
            assert (weights[kept] <= 1.3).all() and torch.equal(kept, mask)
