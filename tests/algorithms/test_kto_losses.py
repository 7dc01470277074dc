"""KTO's unpaired losses and reference point against values computed by hand (the arithmetic is in
the comments, with math.exp, never the function under test), their gradients and argument checks."""

import math

import pytest
import torch

from rlhfkit.algorithms.kto import KTO_LOSS_TYPES, kto_kl, kto_loss, kto_needs_kl


def t(*values):
    return torch.tensor(values, dtype=torch.float32)


def sigmoid(x):
    return 1 / (1 + math.exp(-x))


LABELS = torch.tensor([True, False, True])


def test_kto_loss_weighs_each_side_and_shifts_by_z0():
    # log-ratios r = logps - ref = (-5 + 6, -4 + 3, -7 + 7) = (1, -1, 0); β = 0.5, z0 = 0.4
    # row 0 desirable: λ_D (1 - σ(0.5 (1 - 0.4))) = 2 (1 - σ(0.3))
    # row 1 undesirable: λ_U (1 - σ(0.5 (0.4 + 1))) = 0.5 (1 - σ(0.7))
    # row 2 desirable: 2 (1 - σ(0.5 (0 - 0.4))) = 2 (1 - σ(-0.2))
    losses, rewards = kto_loss(
        t(-5, -4, -7), t(-6, -3, -7), LABELS, torch.tensor(0.4), beta=0.5, desirable_weight=2.0, undesirable_weight=0.5
    )
    expected = [2 * (1 - sigmoid(0.3)), 0.5 * (1 - sigmoid(0.7)), 2 * (1 - sigmoid(-0.2))]
    assert losses.tolist() == pytest.approx(expected, rel=1e-6)
    assert rewards.tolist() == pytest.approx([0.5, -0.5, 0.0], abs=1e-7)  # β r
    assert not rewards.requires_grad


def test_apo_zero_unpaired_ignores_z0():
    # r = (1, -1, 0), β = 0.5: desirable 1 - σ(β r), undesirable σ(β r); z0 = 3 changes nothing
    losses, _ = kto_loss(
        t(-5, -4, -7), t(-6, -3, -7), LABELS, 3.0, beta=0.5, loss_type="apo_zero_unpaired", undesirable_weight=0.5
    )
    assert losses.tolist() == pytest.approx([1 - sigmoid(0.5), 0.5 * sigmoid(-0.5), 1 - sigmoid(0.0)], rel=1e-6)
    assert not kto_needs_kl("apo_zero_unpaired") and kto_needs_kl("kto")


def test_the_gradient_reaches_the_policy_only():
    # d/dlogp of 1 - σ(β (r - z0)) = -β σ(x)(1 - σ(x)), x = β (r - z0); r = 1, z0 = 0.4, β = 0.5: x = 0.3
    logps = t(-5.0).requires_grad_()
    ref = t(-6.0).requires_grad_()
    z0 = torch.tensor(0.4, requires_grad=True)
    losses, _ = kto_loss(logps, ref, torch.tensor([True]), z0, beta=0.5)
    losses.sum().backward()
    s = sigmoid(0.3)
    assert logps.grad.item() == pytest.approx(-0.5 * s * (1 - s), rel=1e-6)
    assert ref.grad is None and z0.grad is None  # the reference and the reference point are constants


def test_kl_is_the_mean_mismatched_log_ratio_clamped_at_zero():
    # (−3 + 4) + (−2 + 2.5) + (−6 + 5) = 1 + 0.5 − 1 = 0.5, over 3 rows: 1/6
    assert kto_kl(t(-3, -2, -6), t(-4, -2.5, -5)).item() == pytest.approx(0.5 / 3, rel=1e-6)
    assert kto_kl(t(-3, -2), t(-1, -1)).item() == 0.0  # mean -1.5: clamped
    x = t(-3, -2).requires_grad_()
    assert not kto_kl(x, t(-4, -4)).requires_grad


def test_kl_with_reduce_is_the_mean_over_every_process():
    # another process holds rows summing to 2.5 over 2 rows: (0.5 + 2.5) / (3 + 2) = 0.6
    other = torch.tensor([2.5, 2.0])
    z0 = kto_kl(t(-3, -2, -6), t(-4, -2.5, -5), reduce=lambda x: x + other)
    assert z0.item() == pytest.approx(0.6, rel=1e-6)
    assert kto_kl(t(), t(), reduce=lambda x: x).item() == 0.0  # no rows anywhere


def test_bad_arguments_are_one_line():
    with pytest.raises(ValueError, match="loss_type must be one of kto, apo_zero_unpaired"):
        kto_loss(t(1), t(1), torch.tensor([True]), loss_type="sigmoid")
    with pytest.raises(ValueError, match="labels must be a bool tensor"):
        kto_loss(t(1), t(1), torch.tensor([1]))
    with pytest.raises(ValueError, match="undesirable_weight must be >= 0"):
        kto_loss(t(1), t(1), torch.tensor([True]), undesirable_weight=-1.0)
    with pytest.raises(ValueError, match="beta must be > 0"):
        kto_loss(t(1), t(1), torch.tensor([True]), beta=0.0)
    assert list(KTO_LOSS_TYPES) == ["kto", "apo_zero_unpaired"]
