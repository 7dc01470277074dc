"""LD-DPO's desensitised log-probs and WPO's pair weights against values computed by hand."""

import math

import pytest
import torch

from rlhfkit.algorithms import ld_logps, log_sum_sq_probs, wpo_weights

# one pair: the chosen completion has 3 tokens, the rejected 2 (a padding column after it)
LOGPS = torch.tensor([[-1.0, -2.0, -3.0], [-4.0, -5.0, -7.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


def test_ld_weighs_the_longer_completions_excess():
    # shared length min(3, 2) = 2: chosen -1 - 2 + α (-3); rejected -4 - 5 (no excess; the padding never counts)
    for alpha in (0.0, 0.5, 1.0):
        assert ld_logps(LOGPS, MASK, alpha).tolist() == pytest.approx([-3 - 3 * alpha, -9.0])
    swapped = ld_logps(LOGPS.flip(0), MASK.flip(0), 0.5)  # the rejected one longer: its excess is weighed
    assert swapped.tolist() == pytest.approx([-9.0, -4.5])


def test_ld_at_one_is_the_plain_sum_and_its_gradient_is_alpha_on_the_excess():
    x = LOGPS.clone().requires_grad_()
    assert torch.equal(ld_logps(x, MASK, 1.0), (LOGPS * MASK).sum(-1))
    ld_logps(x, MASK, 0.25).sum().backward()
    assert x.grad.tolist() == [[1.0, 1.0, 0.25], [1.0, 1.0, 0.0]]


def test_ld_refuses_an_alpha_outside_0_1_and_odd_rows():
    with pytest.raises(ValueError, match=r"ld_alpha must be in \[0, 1\]"):
        ld_logps(LOGPS, MASK, 1.5)
    with pytest.raises(ValueError, match="2n rows"):
        ld_logps(LOGPS[:1], MASK[:1], 0.5)


def test_wpo_weights_by_hand():
    # chosen: mean of (log p - log Σp²) = mean(-1 - -0.5, -2 - -1, -3 - -2) = -2.5/3
    # rejected: mean(-4 - -3, -5 - -3) = -1.5 (its padding column never counts)
    log_sum_sq = torch.tensor([[-0.5, -1.0, -2.0], [-3.0, -3.0, 99.0]])
    weights = wpo_weights(LOGPS.requires_grad_(), log_sum_sq, MASK)
    assert weights.tolist() == pytest.approx([math.exp(-2.5 / 3 - 1.5)])
    assert not weights.requires_grad
    with pytest.raises(ValueError, match="log_sum_sq_probs must have shape"):
        wpo_weights(LOGPS, log_sum_sq[:, :2], MASK)


def test_wpo_weight_is_one_for_a_deterministic_policy():
    # one token of probability 1: log p = 0 and log Σp² = 0
    zeros = torch.zeros(2, 1)
    assert wpo_weights(zeros, zeros, torch.ones(2, 1)).tolist() == [1.0]


def test_log_sum_sq_probs_from_the_half_temperature_log_prob():
    """log Σ_v p(v)² computed over the whole vocabulary equals 2 log p(y) - log p_½(y) for any token y."""
    torch.manual_seed(0)
    z = torch.randn(3, 5, 11, dtype=torch.float64)
    y = torch.randint(0, 11, (3, 5))
    direct = torch.logsumexp(2 * torch.log_softmax(z, -1), -1)
    logp = torch.log_softmax(z, -1).gather(-1, y[..., None]).squeeze(-1)
    half = torch.log_softmax(2 * z, -1).gather(-1, y[..., None]).squeeze(-1)
    assert torch.allclose(log_sum_sq_probs(logp, half), direct, atol=1e-12)
