"""Bradley–Terry reward-model loss: hand-computed values, the Llama 2 margin, gradients, metrics
and input checks."""

import math

import pytest
import torch

from rlhfkit.algorithms import bradley_terry_loss

F64 = torch.float64


def t(x, dtype=F64):
    return torch.tensor(x, dtype=dtype)


def softplus(x):  # -log σ(d) = log(1 + e^-d) = softplus(-d), by hand
    return math.log1p(math.exp(x))


# chosen − rejected = [1, −1, 0]
CHOSEN, REJECTED = [2.0, 0.0, 1.0], [1.0, 1.0, 1.0]


def test_loss_and_metrics_by_hand():
    loss, m = bradley_terry_loss(t(CHOSEN), t(REJECTED))
    # mean(log(1+e^-1), log(1+e^1), log 2) = (0.3132617 + 1.3132617 + 0.6931472) / 3
    expected = (softplus(-1.0) + softplus(1.0) + math.log(2.0)) / 3
    assert expected == pytest.approx(0.7732235, abs=1e-7)
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    assert m["rm/accuracy"].item() == pytest.approx(1 / 3)  # the tie (0) counts as wrong
    assert m["rm/margin_mean"].item() == pytest.approx(0.0)
    assert m["rm/chosen_mean"].item() == pytest.approx(1.0)
    assert m["rm/rejected_mean"].item() == pytest.approx(1.0)
    assert m["rm/reward_mean"].item() == pytest.approx(1.0)
    # rewards [2, 0, 1, 1, 1, 1]: squared deviations sum to 2, unbiased variance 2/5
    assert m["rm/reward_std"].item() == pytest.approx(math.sqrt(0.4), abs=1e-12)


def test_per_pair_margin_by_hand():
    loss, m = bradley_terry_loss(t(CHOSEN), t(REJECTED), margin=t([0.5, 0.0, 1.0]))
    # differences minus margins: [0.5, -1, -1]
    expected = (softplus(-0.5) + 2 * softplus(1.0)) / 3
    assert expected == pytest.approx(1.0335335, abs=1e-7)
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    assert m["rm/accuracy"].item() == pytest.approx(1 / 3)  # metrics ignore the margin
    assert m["rm/margin_mean"].item() == pytest.approx(0.0)


def test_scalar_margin_by_hand():
    loss, _ = bradley_terry_loss(t(CHOSEN), t(REJECTED), margin=1.0)
    # differences minus 1: [0, -2, -1]
    expected = (math.log(2.0) + softplus(2.0) + softplus(1.0)) / 3
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    assert loss.item() == pytest.approx(1.3777790, abs=1e-7)


def test_margin_equals_shifting_the_chosen_rewards():
    gen = torch.Generator().manual_seed(0)
    c, r, m = (torch.randn(7, generator=gen, dtype=F64) for _ in range(3))
    with_margin, _ = bradley_terry_loss(c, r, margin=m)
    shifted, _ = bradley_terry_loss(c - m, r)
    torch.testing.assert_close(with_margin, shifted)
    zero, _ = bradley_terry_loss(c, r, margin=torch.zeros(7, dtype=F64))
    torch.testing.assert_close(zero, bradley_terry_loss(c, r)[0])


def test_gradient_by_hand():
    c, r = t(CHOSEN).requires_grad_(), t(REJECTED).requires_grad_()
    loss, metrics = bradley_terry_loss(c, r)
    loss.backward()
    # d/dr_c of -log σ(d) / B is -σ(-d) / B; the rejected reward gets the opposite.
    sig = [1 / (1 + math.exp(d)) for d in (1.0, -1.0, 0.0)]
    expected = t([-s / 3 for s in sig])
    torch.testing.assert_close(c.grad, expected)
    torch.testing.assert_close(r.grad, -expected)
    assert all(not v.requires_grad for v in metrics.values())


def test_loss_is_finite_for_huge_differences_in_float32():
    loss, _ = bradley_terry_loss(t([-100.0, 100.0], torch.float32), t([100.0, -100.0], torch.float32))
    assert torch.isfinite(loss) and loss.item() == pytest.approx(100.0, rel=1e-6)  # (200 + 0) / 2


def test_only_reward_differences_matter():
    c, r = t(CHOSEN), t(REJECTED)
    torch.testing.assert_close(bradley_terry_loss(c + 5.0, r + 5.0)[0], bradley_terry_loss(c, r)[0])


@pytest.mark.parametrize(
    "chosen,rejected,margin,message",
    [
        (torch.zeros(3), torch.zeros(2), None, "shape mismatch"),
        (torch.zeros(2, 3), torch.zeros(2, 3), None, "chosen must have 1 dimension"),
        (torch.zeros(0), torch.zeros(0), None, "at least one pair"),
        (torch.zeros(3), torch.zeros(3), torch.zeros(2), "margin must be a number or have shape"),
        ([1.0], torch.zeros(1), None, "chosen must be a torch.Tensor"),
    ],
)
def test_bad_inputs_raise_clear_errors(chosen, rejected, margin, message):
    with pytest.raises(ValueError, match=message):
        bradley_terry_loss(chosen, rejected, margin)
