"""The objectives of issue 21 against values computed by hand from their formulas: GSPO and
GSPO-token (sequence-level importance ratios in PPO's clipped surrogate), CISPO (the detached,
capped ratio weighting a policy gradient), and DAPO's pure pieces (the soft overlong punishment,
the dynamic-sampling group filter, truncated completions out of the loss)."""

import math

import pytest
import torch

from rlhfkit.algorithms import (
    IMPORTANCE_SAMPLING_LEVELS,
    POLICY_LOSSES,
    LossInputs,
    cispo_policy_loss,
    group_has_variance,
    importance_ratio,
    mask_truncated,
    overlong_penalty,
    ppo_policy_loss,
)

F64 = torch.float64
L = math.log
NAN = float("nan")


def t(x, dtype=F64):
    return torch.tensor(x, dtype=dtype)


# --------------------------------------------------------------------------------------------
# GSPO (arXiv:2507.18071): s_i = exp(mean_t log(π/π_old)), clipped per sequence
# --------------------------------------------------------------------------------------------

# old = log 0.5 everywhere; row 0 has two tokens with ratios 2 and 1.125 (s_0 = sqrt(2.25) = 1.5)
# and padding holding NaN; row 1 has three with ratios 0.5, 1.8, 0.81 (s_1 = 0.729^(1/3) = 0.9).
GSPO_MASK = [[1, 1, 0], [1, 1, 1]]


def _gspo_inputs():
    old = torch.full((2, 3), L(0.5), dtype=F64)
    delta = t([[L(2.0), L(1.125), NAN], [L(0.5), L(1.8), L(0.81)]])
    return (old + delta).requires_grad_(), old, torch.tensor(GSPO_MASK)


def test_sequence_ratio_by_hand():
    logprobs, old, mask = _gspo_inputs()
    for level in ("sequence", "sequence_token"):
        ratio = importance_ratio(logprobs, old, mask, level)
        torch.testing.assert_close(ratio[mask.bool()], t([1.5, 1.5, 0.9, 0.9, 0.9]), rtol=0, atol=1e-12)
    token = importance_ratio(logprobs, old, mask, "token")
    torch.testing.assert_close(token[mask.bool()], t([2.0, 1.125, 0.5, 1.8, 0.81]), rtol=0, atol=1e-12)


def test_sequence_ratio_gradients_by_hand():
    # d s_1 / d logp_{1,u}: "sequence" through the mean, s_1 / |y_1| = 0.3 on each of row 1's
    # tokens; "sequence_token": s_1 = 0.9 on its own token only.
    logprobs, old, mask = _gspo_inputs()
    (grad,) = torch.autograd.grad(importance_ratio(logprobs, old, mask, "sequence")[1, 0], logprobs)
    torch.testing.assert_close(grad, t([[0.0, 0.0, 0.0], [0.3, 0.3, 0.3]]), rtol=0, atol=1e-12)
    (grad,) = torch.autograd.grad(importance_ratio(logprobs, old, mask, "sequence_token")[1, 0], logprobs)
    torch.testing.assert_close(grad, t([[0.0, 0.0, 0.0], [0.9, 0.0, 0.0]]), rtol=0, atol=1e-12)


def test_gspo_loss_clips_whole_sequences_by_hand():
    # A = [1, -1], ε = 0.2, seq-mean-token-mean:
    #   row 0: s = 1.5 > 1.2 with A > 0 → clipped: -1.2 on each token, no gradient
    #   row 1: s = 0.9 ≥ 0.8 with A < 0 → -A·s = 0.9; d/dlogp_{1,u} = -A·s/|y_1| = 0.3
    # loss = (-1.2 + 0.9) / 2 = -0.15; gradient 0.3 / 2 rows = 0.15 on row 1's tokens
    logprobs, old, mask = _gspo_inputs()
    loss, m = ppo_policy_loss(
        logprobs, old, t([1.0, -1.0]), mask, agg="seq-mean-token-mean", importance_sampling_level="sequence"
    )
    loss.backward()
    assert loss.item() == pytest.approx(-0.15, abs=1e-12)
    torch.testing.assert_close(logprobs.grad, t([[0.0, 0.0, 0.0], [0.15, 0.15, 0.15]]), rtol=0, atol=1e-12)
    assert m["policy/clip_frac"].value.item() == pytest.approx(2 / 5)  # the 2 tokens of the clipped row
    assert m["policy/ratio_mean"].value.item() == pytest.approx((2 * 1.5 + 3 * 0.9) / 5, abs=1e-12)
    assert m["policy/ratio_max"].value.item() == pytest.approx(1.5, abs=1e-12)
    # token-mean weighs the rows by their tokens: (2·(-1.2) + 3·0.9) / 5 = 0.06; row 1: 3·0.3/5
    logprobs, old, mask = _gspo_inputs()
    loss, _ = ppo_policy_loss(logprobs, old, t([1.0, -1.0]), mask, importance_sampling_level="sequence")
    loss.backward()
    assert loss.item() == pytest.approx(0.06, abs=1e-12)
    torch.testing.assert_close(logprobs.grad[1], t([0.18, 0.18, 0.18]), rtol=0, atol=1e-12)


def test_gspo_token_equals_gspo_with_sequence_advantages_and_differs_with_token_advantages():
    # One advantage per sequence: the same loss and gradient as GSPO.
    logprobs, old, mask = _gspo_inputs()
    loss, _ = ppo_policy_loss(
        logprobs, old, t([1.0, -1.0]), mask, agg="seq-mean-token-mean", importance_sampling_level="sequence_token"
    )
    loss.backward()
    assert loss.item() == pytest.approx(-0.15, abs=1e-12)
    torch.testing.assert_close(logprobs.grad, t([[0.0, 0.0, 0.0], [0.15, 0.15, 0.15]]), rtol=0, atol=1e-12)
    # Row 1 with token advantages [-1, -2, 0] (row 0's A = 1 is clipped as before), s_1 = 0.9:
    #   GSPO-token: d/dlogp_{1,t} of -A_t·s_{1,t} is -A_t·0.9 = [0.9, 1.8, 0], / (2 rows · 3 tokens)
    #   GSPO: each token's loss moves with s_1: Σ_t -A_t · 0.3 / 6 = 3·0.3/6 = 0.15 on every token
    adv = t([[1.0, 1.0, 1.0], [-1.0, -2.0, 0.0]])
    grads = {}
    for level in ("sequence_token", "sequence"):
        logprobs, old, mask = _gspo_inputs()
        loss, _ = ppo_policy_loss(logprobs, old, adv, mask, agg="seq-mean-token-mean", importance_sampling_level=level)
        loss.backward()
        assert loss.item() == pytest.approx((-1.2 + (0.9 + 1.8 + 0.0) / 3) / 2, abs=1e-12)
        grads[level] = logprobs.grad[1]
    torch.testing.assert_close(grads["sequence_token"], t([0.15, 0.3, 0.0]), rtol=0, atol=1e-12)
    torch.testing.assert_close(grads["sequence"], t([0.15, 0.15, 0.15]), rtol=0, atol=1e-12)


def test_gspo_with_the_papers_clip_range():
    # ε_low = 3e-4, ε_high = 4e-4 (GSPO §5.1). Each row: two tokens with ratios s·1.01 and s/1.01,
    # far outside the range one by one, whose geometric mean is s; A = [1, 1, -1, -1]:
    #   s = 1.0005 > 1.0004 (A > 0): clipped → -1.0004, no gradient
    #   s = 1.0003 (A > 0): kept → -1.0003, gradient -A·s/|y| / 4 rows = -1.0003/8 on each token
    #   s = 0.9996 < 0.9997 (A < 0): clipped → 0.9997, no gradient
    #   s = 0.9998 (A < 0): kept → 0.9998, gradient 0.9998/8 on each token
    ratios = [1.0005, 1.0003, 0.9996, 0.9998]
    old = torch.full((4, 2), L(0.25), dtype=F64)
    logprobs = (old + t([[L(r * 1.01), L(r / 1.01)] for r in ratios])).requires_grad_()
    loss, m = ppo_policy_loss(
        logprobs,
        old,
        t([1.0, 1.0, -1.0, -1.0]),
        torch.ones(4, 2),
        clip_low=3e-4,
        clip_high=4e-4,
        agg="seq-mean-token-mean",
        importance_sampling_level="sequence",
    )
    loss.backward()
    assert loss.item() == pytest.approx((-1.0004 - 1.0003 + 0.9997 + 0.9998) / 4, abs=1e-12)
    want = t([[0.0, 0.0], [-1.0003 / 8, -1.0003 / 8], [0.0, 0.0], [0.9998 / 8, 0.9998 / 8]])
    torch.testing.assert_close(logprobs.grad, want, rtol=0, atol=1e-12)
    assert m["policy/clip_frac"].value.item() == pytest.approx(0.5)


def test_sequence_level_dual_clip_by_hand():
    # One row of two tokens with ratios 4 and 9: s = 6; A = -1, c = 3: PPO's clip gives
    # max(6, 1.2) = 6 > c·|A| = 3 → bounded to 3, no gradient; without the dual clip 6 on both
    # tokens, token-mean 6 = s, whose gradient through the mean is s/2 = 3 on each token.
    old = torch.full((1, 2), L(0.1), dtype=F64)
    for dual, want, grad in ((3.0, 3.0, 0.0), (None, 6.0, 3.0)):
        logprobs = (old + t([[L(4.0), L(9.0)]])).requires_grad_()
        loss, m = ppo_policy_loss(
            logprobs, old, t([-1.0]), torch.ones(1, 2), dual_clip=dual, importance_sampling_level="sequence"
        )
        loss.backward()
        assert loss.item() == pytest.approx(want, abs=1e-12)
        torch.testing.assert_close(logprobs.grad, t([[grad, grad]]), rtol=0, atol=1e-12)
        assert m["policy/clip_frac_dual"].value.item() == (1.0 if dual else 0.0)


def test_sequence_level_empty_rows_and_padding_count_for_nothing():
    logprobs, old, mask = _gspo_inputs()
    kw = dict(agg="seq-mean-token-mean", importance_sampling_level="sequence")
    want, _ = ppo_policy_loss(logprobs, old, t([1.0, -1.0]), mask, **kw)
    padded = torch.cat([logprobs, t([[NAN, 5.0, -7.0]])])
    got, m = ppo_policy_loss(
        padded,
        torch.cat([old, t([[0.0, 0.0, 0.0]])]),
        t([1.0, -1.0, 3.0]),
        torch.cat([mask, torch.zeros(1, 3, dtype=mask.dtype)]),
        **kw,
    )
    assert got.item() == pytest.approx(want.item(), abs=1e-12) and torch.isfinite(got)
    assert importance_ratio(padded, torch.zeros(3, 3, dtype=F64), torch.tensor(GSPO_MASK + [[0, 0, 0]]), "sequence")[
        2
    ].tolist() == [1.0, 1.0, 1.0]  # an empty row: s = 1
    assert m["policy/ratio_max"].value.item() == pytest.approx(1.5, abs=1e-12)


def test_token_level_is_the_default_and_unchanged():
    logprobs, old, mask = _gspo_inputs()
    a, ma = ppo_policy_loss(logprobs, old, t([1.0, -1.0]), mask)
    b, mb = ppo_policy_loss(logprobs, old, t([1.0, -1.0]), mask, importance_sampling_level="token")
    assert torch.equal(a, b) and ma.keys() == mb.keys()
    # by hand: ratios [2, 1.125 | 0.5, 1.8, 0.81], A = [1 | -1]: [-1.2, -1.125 | 0.8, 1.8, 0.81]
    assert a.item() == pytest.approx((-1.2 - 1.125 + 0.8 + 1.8 + 0.81) / 5, abs=1e-12)
    assert ma["policy/ratio_max"].value.item() == pytest.approx(2.0, abs=1e-12)


def test_unknown_importance_sampling_level_is_refused():
    logprobs, old, mask = _gspo_inputs()
    with pytest.raises(
        ValueError,
        match=r"importance_sampling_level must be one of token, sequence, sequence_token, sequence_sum, "
        r"got 'seq'",
    ):
        ppo_policy_loss(logprobs, old, t([1.0, -1.0]), mask, importance_sampling_level="seq")
    assert IMPORTANCE_SAMPLING_LEVELS == ("token", "sequence", "sequence_token", "sequence_sum")


# --------------------------------------------------------------------------------------------
# CISPO (arXiv:2506.13585, eqs. 4-5): loss_t = -sg(min(ρ_t, 1 + ε_high)) · A_t · log π_t
# --------------------------------------------------------------------------------------------


def _cispo_inputs():
    # old = log 0.1; ratios [1.5, 0.5, 8] → log π = [ln 0.15, ln 0.05, ln 0.8]
    old = torch.full((1, 3), L(0.1), dtype=F64)
    return t([[L(0.15), L(0.05), L(0.8)]]).requires_grad_(), old, t([[1.0, -1.0, 1.0]]), torch.ones(1, 3)


def test_cispo_by_hand():
    # ε_high = 4: weights min(ρ, 5) = [1.5, 0.5, 5] (8 capped; no floor: 0.5 stays 0.5)
    # loss_t = -w·A·log π = [-1.5 ln 0.15, 0.5 ln 0.05, -5 ln 0.8], token-mean over 3
    # gradient -w·A/3 = [-0.5, 0.5/3, -5/3]: no token loses its gradient, capped or not
    logprobs, old, adv, mask = _cispo_inputs()
    loss, m = cispo_policy_loss(logprobs, old, adv, mask, clip_high=4.0)
    loss.backward()
    assert loss.item() == pytest.approx((-1.5 * L(0.15) + 0.5 * L(0.05) - 5 * L(0.8)) / 3, abs=1e-12)
    torch.testing.assert_close(logprobs.grad, t([[-0.5, 0.5 / 3, -5 / 3]]), rtol=0, atol=1e-12)
    assert m["policy/clip_frac"].value.item() == pytest.approx(1 / 3)
    assert m["policy/ratio_mean"].value.item() == pytest.approx(10 / 3, abs=1e-12)
    assert m["policy/ratio_max"].value.item() == pytest.approx(8.0, abs=1e-12)
    assert m["policy/approx_kl"].value.item() == pytest.approx(-(L(1.5) + L(0.5) + L(8.0)) / 3, abs=1e-12)
    # PPO on the same tokens drops the gradient of the capped one and of the one below its floor
    logprobs2, *_ = _cispo_inputs()
    ppo, _ = ppo_policy_loss(logprobs2, old, adv, mask, clip_low=0.2, clip_high=4.0)
    ppo.backward()
    assert logprobs2.grad[0, 1].item() == 0.0 and logprobs2.grad[0, 2].item() == 0.0


def test_cispo_on_policy_is_the_policy_gradient():
    lp = t([[-1.0, -2.0], [-0.5, -3.0]]).requires_grad_()
    adv = t([2.0, -1.0])
    loss, m = cispo_policy_loss(lp, lp.detach(), adv, torch.tensor([[1, 1], [1, 0]]), clip_high=0.2)
    loss.backward()
    # ρ = 1: loss = -(2·(-1) + 2·(-2) - 1·(-0.5)) / 3 = 5.5 / 3; gradient -A/3 on the mask
    assert loss.item() == pytest.approx(5.5 / 3, abs=1e-12)
    torch.testing.assert_close(lp.grad, t([[-2 / 3, -2 / 3], [1 / 3, 0.0]]), rtol=0, atol=1e-12)
    assert m["policy/clip_frac"].value.item() == 0.0


def test_cispo_registry_entry_reads_clip_high_only():
    logprobs, old, adv, mask = _cispo_inputs()
    want, _ = cispo_policy_loss(logprobs, old, adv, mask, clip_high=4.0)
    inputs = LossInputs(logprobs, old, adv, mask, "token-mean", None, None, "token")
    assert torch.equal(POLICY_LOSSES.get("cispo")(inputs, clip_high=4.0).loss, want)
    assert torch.equal(POLICY_LOSSES.get("cispo")(inputs).loss, want)  # its declared default: 4
    # clip_low and dual_clip are no knobs of CISPO's: not declared, not taken
    assert [h.name for h in POLICY_LOSSES.hyperparameters("cispo")] == ["clip_high"]
    with pytest.raises(TypeError, match="dual_clip"):
        POLICY_LOSSES.get("cispo")(inputs, clip_high=4.0, dual_clip=3.0)
    with pytest.raises(ValueError, match=r"clip_high must be > -1 \(the weight's cap 1 \+ clip_high > 0\), got -1"):
        cispo_policy_loss(logprobs, old, adv, mask, clip_high=-1)


def test_cispo_caps_below_one_as_trl_does_with_its_default_epsilon_high():
    """TRL's loss_type="cispo" with its default epsilon_high=0.2 caps the ratio at 0.2 (clip_high -0.8 here):
    on policy (ratio 1) every token's weight is 0.2, so the loss is 0.2 x the uncapped one."""
    logprobs, old, adv, mask = _cispo_inputs()
    on_policy = old.clone()
    capped, _ = cispo_policy_loss(on_policy, old, adv, mask, clip_high=-0.8)
    plain, _ = cispo_policy_loss(on_policy, old, adv, mask, clip_high=4.0)
    assert torch.allclose(capped, 0.2 * plain)


def test_cispo_sequence_level_caps_the_sequence_ratio():
    # ratios 4 and 9: s = 6 capped at 1 + 1 = 2 on both tokens, A = 1:
    # loss = -2·(log π_0 + log π_1) / 2 with log π = [ln 0.4, ln 0.9]; gradient -2/2 = -1 each
    old = torch.full((1, 2), L(0.1), dtype=F64)
    logprobs = (old + t([[L(4.0), L(9.0)]])).requires_grad_()
    loss, m = cispo_policy_loss(
        logprobs, old, t([1.0]), torch.ones(1, 2), clip_high=1.0, importance_sampling_level="sequence"
    )
    loss.backward()
    assert loss.item() == pytest.approx(-(L(0.4) + L(0.9)), abs=1e-12)
    torch.testing.assert_close(logprobs.grad, t([[-1.0, -1.0]]), rtol=0, atol=1e-12)
    assert m["policy/ratio_max"].value.item() == pytest.approx(6.0, abs=1e-12)


@pytest.mark.parametrize(
    "name, direct, kw",
    [
        ("ppo_clip", ppo_policy_loss, dict(clip_low=0.2, clip_high=0.2)),
        ("cispo", cispo_policy_loss, dict(clip_high=0.2)),
    ],
)
def test_registry_entries_forward_the_level(name, direct, kw):
    logprobs, old, mask = _gspo_inputs()
    adv = t([1.0, -1.0])
    token = POLICY_LOSSES.get(name)(LossInputs(logprobs, old, adv, mask, "token-mean"), **kw).loss
    for level in ("sequence", "sequence_token"):
        inputs = LossInputs(logprobs, old, adv, mask, "token-mean", importance_sampling_level=level)
        got = POLICY_LOSSES.get(name)(inputs, **kw).loss
        want, _ = direct(logprobs, old, adv, mask, agg="token-mean", importance_sampling_level=level, **kw)
        assert torch.equal(got, want) and not torch.equal(got, token)


def test_the_levels_each_loss_takes():
    assert POLICY_LOSSES.traits("vanilla") == {
        "importance_sampling_levels": ("token",),
        "zero_at_zero_advantage": True,
        "applies_correction": False,
    }
    assert POLICY_LOSSES.traits("vespo")["applies_correction"] is True
    assert POLICY_LOSSES.traits("ppo_clip")["importance_sampling_levels"] == IMPORTANCE_SAMPLING_LEVELS
    assert POLICY_LOSSES.traits("cispo")["importance_sampling_levels"] == IMPORTANCE_SAMPLING_LEVELS
    lp = torch.zeros(1, 2)
    with pytest.raises(
        ValueError,
        match=r"policy loss 'vanilla' has no importance ratio: importance_sampling_level "
        r"must be 'token', got 'sequence'",
    ):
        POLICY_LOSSES.get("vanilla")(LossInputs(lp, lp, lp, torch.ones(1, 2), importance_sampling_level="sequence"))


# --------------------------------------------------------------------------------------------
# DAPO (arXiv:2503.14476): overlong punishment (eq. 13), dynamic sampling, overlong filtering
# --------------------------------------------------------------------------------------------


def test_overlong_penalty_by_hand():
    # L_max = 20, L_cache = 4: free up to 16 tokens, then (16 - L)/4, -1 past 20; factor 0.5
    lengths = torch.tensor([10, 16, 17, 18, 20, 21])
    out = overlong_penalty(lengths, max_len=20, buffer_len=4, penalty_factor=0.5)
    assert out.dtype == torch.get_default_dtype()
    torch.testing.assert_close(out, torch.tensor([0.0, 0.0, -0.125, -0.25, -0.5, -0.5]), rtol=0, atol=0)
    out = overlong_penalty(t([19.0, 15.0]), 20, 4)  # default factor 1; float lengths keep their dtype
    assert out.dtype == F64 and out.tolist() == [-0.75, 0.0]


def test_overlong_penalty_refusals():
    n = torch.tensor([3])
    with pytest.raises(ValueError, match=r"buffer_len must be an int >= 1, got 0"):
        overlong_penalty(n, 8, 0)
    with pytest.raises(ValueError, match=r"buffer_len must be at most max_len \(8\), got 9"):
        overlong_penalty(n, 8, 9)
    with pytest.raises(ValueError, match=r"max_len must be an int >= 1, got True"):
        overlong_penalty(n, True, 1)
    with pytest.raises(ValueError, match=r"penalty_factor must be >= 0, got -1"):
        overlong_penalty(n, 8, 2, -1)
    with pytest.raises(ValueError, match=r"lengths must have 1 dimension\(s\), got shape \(1, 1\)"):
        overlong_penalty(n[None], 8, 2)


def test_group_has_variance_by_hand():
    # G = 3; invalid rows (False) are ignored, whatever they hold:
    #   [1, 1, 1] all equal → drop; [0, 1, 0] → keep; [2, 2, (9)] two valid, equal → drop;
    #   [5, (nan), (nan)] one valid → drop; [3, 4, (nan)] → keep
    scores = t([1, 1, 1, 0, 1, 0, 2, 2, 9, 5, NAN, NAN, 3, 4, NAN])
    valid = torch.tensor([1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 0, 0, 1, 1, 0]).bool()
    assert group_has_variance(scores, valid, 3).tolist() == [False, True, False, False, True]
    with pytest.raises(ValueError, match=r"group_size must be an int >= 2"):
        group_has_variance(scores, valid, 1)
    with pytest.raises(ValueError, match=r"group_size=4 does not divide the batch: scores has 15 rows"):
        group_has_variance(scores, valid, 4)


def test_mask_truncated_by_hand():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]])
    out = mask_truncated(mask, torch.tensor([True, False, True]))
    assert out.dtype == torch.bool and out.tolist() == [
        [True, True, False],
        [False, False, False],
        [True, False, False],
    ]
    with pytest.raises(ValueError, match=r"has_eos must have shape \(3,\), got \(2,\)"):
        mask_truncated(mask, torch.tensor([True, False]))
