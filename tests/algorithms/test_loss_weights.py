"""The weights argument of the policy losses (the rollout importance-sampling correction's weights,
tests/algorithms/test_rollout_is.py): by hand, as the aggregate of the weighted loss matrix, no gradient into
them, garbage off the mask ignored, shapes checked, and end to end from the rollout weights."""

import dataclasses
from functools import partial

import pytest
import torch

from rlhfkit.algorithms import (
    AGGREGATIONS,
    POLICY_LOSSES,
    LossInputs,
    aggregate,
    cispo_policy_loss,
    pg_loss,
    ppo_policy_loss,
    rollout_is_weights,
    sapo_policy_loss,
    vespo_policy_loss,
)

from .test_rollout_is import F64, MASK, NAN, OLD, ROLLOUT, C, L, t

# --------------------------------------------------------------------------------------------
# the policy losses' ``weights``
# --------------------------------------------------------------------------------------------


def _policy_inputs(ratios, advantages):
    """old = log 0.5 everywhere, logprobs = old + log ρ: the ratios are exact up to rounding."""
    old = torch.full((1, len(ratios)), L(0.5), dtype=F64)
    logprobs = (old + t([[L(r) for r in ratios]])).requires_grad_()
    return logprobs, old, t([advantages])


def test_ppo_with_weights_by_hand():
    # ρ = [1.1, 1.5, 0.9], A = [1, 2, -1], ε = 0.2:
    #   loss_t = -min(ρA, clip(ρ)A) = [-1.1, -2.4 (clipped at 1.2), 0.9]
    # w = [0.5, 2, 1]: token-mean = (-0.55 - 4.8 + 0.9) / 3 = -4.45 / 3
    # gradient w_t · (-A_t ρ_t) / 3 on the unclipped tokens: [0.5·(-1.1), 0 (clipped), 0.9] / 3
    logprobs, old, adv = _policy_inputs([1.1, 1.5, 0.9], [1.0, 2.0, -1.0])
    w = t([[0.5, 2.0, 1.0]], torch.float32)
    loss, metrics = ppo_policy_loss(logprobs, old, adv, torch.ones(1, 3), weights=w)
    loss.backward()
    assert loss.item() == pytest.approx(-4.45 / 3, abs=1e-12)
    torch.testing.assert_close(logprobs.grad, t([[-0.55 / 3, 0.0, 0.9 / 3]]), rtol=1e-12, atol=1e-15)
    assert logprobs.grad[0, 1].item() == 0.0
    assert metrics["policy/clip_frac"].value.item() == pytest.approx(1 / 3)  # metrics ignore the weights


def test_pg_with_weights_by_hand():
    # logp = [ln .5, ln .25 | ln .5, pad], A = [2, -1] per row, w = [[2, 0.5], [3, 9]]
    # loss_t = -A·logp·w: row 0: -2·ln.5·2 = 4 ln2, -2·ln.25·0.5 = 2 ln2 → Σ 6 ln2
    #                     row 1: 1·ln.5·3 = -3 ln2 (the padding's 9 is masked away)
    # seq-mean-token-sum: (6 ln2 - 3 ln2) / 2 = 1.5 ln2
    logprobs = t([[L(0.5), L(0.25)], [L(0.5), NAN]]).requires_grad_()
    mask = t([[1, 1], [1, 0]])
    loss, _ = pg_loss(logprobs, logprobs.detach(), t([2.0, -1.0]), mask, weights=t([[2, 0.5], [3, 9]]))
    assert loss.item() == pytest.approx(1.5 * L(2), abs=1e-12)
    loss.backward()
    # d/dlogp = -A·w / 2 rows: [[-2, -0.5], [1.5, 0]]
    torch.testing.assert_close(logprobs.grad, t([[-2.0, -0.5], [1.5, 0.0]]))


def _random_policy_batch(seed=0, B=4, T=6):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=F64).mul(3)
    logprobs = (old + torch.randn(B, T, generator=g, dtype=F64).mul(0.3)).requires_grad_()
    adv = torch.randn(B, T, generator=g, dtype=F64)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0], [1, 0, 1, 1, 0, 1]])[:B]
    w = torch.rand(B, T, generator=g).mul(2)
    return logprobs, old, adv, mask, w


def _ppo_loss_mat(logprobs, old, adv, lo=0.2, hi=0.2):
    ratio = torch.exp(logprobs - old)
    return torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - lo, 1 + hi))


@pytest.mark.parametrize("agg", AGGREGATIONS)
def test_weighted_losses_equal_aggregate_of_weighted_matrix(agg):
    logprobs, old, adv, mask, w = _random_policy_batch()
    got, _ = ppo_policy_loss(logprobs, old, adv, mask, agg=agg, weights=w)
    want = aggregate(_ppo_loss_mat(logprobs, old, adv) * w, mask, agg)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)
    got, _ = pg_loss(logprobs, old, adv, mask, agg=agg, weights=w)
    want = aggregate(-adv * logprobs * w, mask, agg)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("agg", AGGREGATIONS)
def test_weights_none_and_ones_are_bit_for_bit_the_unweighted_loss(agg):
    logprobs, old, adv, mask, _ = _random_policy_batch(seed=1)
    for fn, kw, mat in [
        (ppo_policy_loss, dict(clip_low=0.2, clip_high=0.28), _ppo_loss_mat(logprobs, old, adv, 0.2, 0.28)),
        (pg_loss, {}, -adv * logprobs),
    ]:
        unweighted = aggregate(mat, mask, agg)  # the formula, as computed before weights existed
        plain, plain_metrics = fn(logprobs, old, adv, mask, agg=agg, **kw)
        grad_plain = torch.autograd.grad(plain, logprobs)[0]
        assert torch.equal(plain, unweighted)
        none, none_metrics = fn(logprobs, old, adv, mask, agg=agg, weights=None, **kw)
        assert torch.equal(none, plain)
        assert torch.equal(torch.autograd.grad(none, logprobs)[0], grad_plain)
        for w in (torch.ones(mask.shape), torch.ones(mask.shape, dtype=F64), mask.float()):
            ones, ones_metrics = fn(logprobs, old, adv, mask, agg=agg, weights=w, **kw)
            assert torch.equal(ones, plain)
            assert torch.equal(torch.autograd.grad(ones, logprobs)[0], grad_plain)
            assert all(torch.equal(ones_metrics[k].stats, plain_metrics[k].stats) for k in plain_metrics)
        assert all(torch.equal(none_metrics[k].stats, plain_metrics[k].stats) for k in plain_metrics)


@pytest.mark.parametrize("fn", [ppo_policy_loss, pg_loss, partial(cispo_policy_loss, clip_high=0.2)])
def test_no_gradient_flows_into_the_weights(fn):
    logprobs, old, adv, mask, w = _random_policy_batch(seed=2)
    w = w.double().requires_grad_()
    loss, _ = fn(logprobs, old, adv, mask, weights=w)
    loss.backward()
    assert w.grad is None
    assert logprobs.grad is not None


@pytest.mark.parametrize("fn", [ppo_policy_loss, pg_loss, partial(cispo_policy_loss, clip_high=0.2)])
def test_garbage_weights_off_the_mask_reach_neither_loss_nor_gradient(fn):
    logprobs, old, adv, mask, w = _random_policy_batch(seed=4)
    clean = torch.where(mask.bool(), w, torch.zeros(()))
    dirty = torch.where(mask.bool(), w, torch.full((), NAN))
    ref, _ = fn(logprobs, old, adv, mask, weights=clean)
    ref_grad = torch.autograd.grad(ref, logprobs)[0]
    got, _ = fn(logprobs, old, adv, mask, weights=dirty)
    got_grad = torch.autograd.grad(got, logprobs)[0]
    assert torch.equal(got, ref) and torch.equal(got_grad, ref_grad)
    assert torch.isfinite(got_grad).all()


@pytest.mark.parametrize("fn", [ppo_policy_loss, pg_loss, partial(cispo_policy_loss, clip_high=0.2)])
def test_weights_shape_is_checked(fn):
    logprobs, old, adv, mask, w = _random_policy_batch()
    with pytest.raises(ValueError, match=r"weights must have shape \(4, 6\), got \(4, 5\)"):
        fn(logprobs, old, adv, mask, weights=w[:, :5])
    with pytest.raises(ValueError, match="weights must be a torch.Tensor"):
        fn(logprobs, old, adv, mask, weights=[[1.0] * 6] * 4)


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_registry_entries_forward_the_weights(name):
    logprobs, old, adv, mask, w = _random_policy_batch(seed=5)
    direct = {
        "ppo_clip": ppo_policy_loss,
        "cispo": cispo_policy_loss,
        "sapo": sapo_policy_loss,
        "vespo": vespo_policy_loss,  # its weights join the sequence ratio instead of multiplying the loss
    }.get(name, pg_loss)
    direct_kw = {"ppo_clip": dict(clip_low=0.2, clip_high=0.2), "cispo": dict(clip_high=0.2)}.get(name, {})
    got = POLICY_LOSSES.get(name)(LossInputs(logprobs, old, adv, mask, "token-mean", weights=w), **direct_kw).loss
    want, _ = direct(logprobs, old, adv, mask, agg="token-mean", weights=w, **direct_kw)
    unweighted = POLICY_LOSSES.get(name)(LossInputs(logprobs, old, adv, mask, "token-mean"), **direct_kw).loss
    assert torch.equal(got, want)
    assert not torch.equal(got, unweighted)
    assert "weights" in {f.name for f in dataclasses.fields(LossInputs)}


def test_rollout_weights_feed_the_loss_end_to_end():
    """The trainer's path: weights and the kept mask of ``rollout_is_weights`` go into the loss.
    token_mask on the hand example with A = 1 everywhere and pg_loss (token-mean): the kept tokens
    are 7 with weights summing to 7 (see EXPECTED), so loss = -Σ w_t logp_t / 7."""
    weights, kept, _ = rollout_is_weights(t(OLD), t(ROLLOUT), t(MASK), "token_mask", C)
    logprobs = t([[-1.0, -2.0, -3.0], [-4.0, -5.0, NAN], [-6.0, -7.0, -8.0]])
    loss, _ = pg_loss(logprobs, logprobs, torch.ones(3), kept, agg="token-mean", weights=weights)
    # -(0.5·-1 + 1·-3 + 1.5·-4 + 2·-5 + 0.5·-6 + 0.5·-7 + 1·-8) / 7 = (0.5+3+6+10+3+3.5+8)/7 = 34/7
    assert loss.item() == pytest.approx(34 / 7, rel=1e-6)
