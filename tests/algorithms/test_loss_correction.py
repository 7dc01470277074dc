"""The rollout correction is applied around every policy loss (``loss_registry.py``): a loss returns its
per-token loss and ``POLICY_LOSSES`` multiplies it by the correction's weights and aggregates it, so a
loss that ignores the weights still gets them; only a loss registered with ``applies_correction=True``
(VESPO) sees them. The built-in entries give their scalar forms' losses bit for bit."""

import pytest
import torch

from rlhfkit.algorithms import (
    AGGREGATIONS,
    POLICY_LOSSES,
    LossInputs,
    LossOutputs,
    aggregate,
    cispo_policy_loss,
    pg_loss,
    ppo_policy_loss,
    sapo_policy_loss,
    vespo_policy_loss,
)
from rlhfkit.algorithms.loss_registry import PolicyLossRegistry

F64 = torch.float64
G = torch.Generator().manual_seed(11)
OLD = -torch.rand(3, 4, generator=G, dtype=F64)
LOGPROBS = OLD + 0.2 * torch.randn(3, 4, generator=G, dtype=F64)
ADV = torch.randn(3, 4, generator=G, dtype=F64)
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]]).bool()
WEIGHTS = torch.rand(3, 4, generator=G, dtype=F64) * 2


def registry_with_a_loss_that_ignores_the_weights(seen: list) -> PolicyLossRegistry:
    reg = PolicyLossRegistry()

    @reg.register("plain", importance_sampling_levels=("token",), zero_at_zero_advantage=True)
    def plain(inputs):
        seen.append(inputs.weights)
        return LossOutputs(-inputs.advantages * inputs.logprobs)  # never reads inputs.weights

    return reg


@pytest.mark.parametrize("agg", AGGREGATIONS)
def test_a_loss_that_ignores_the_weights_gets_the_correction_applied_by_hand(agg):
    seen: list = []
    reg = registry_with_a_loss_that_ignores_the_weights(seen)
    lp = LOGPROBS.clone().requires_grad_()
    got = reg.get("plain")(LossInputs(lp, OLD, ADV, MASK, agg=agg, weights=WEIGHTS)).loss
    by_hand = aggregate(-ADV * lp * torch.where(MASK, WEIGHTS, 0.0), MASK, agg)
    torch.testing.assert_close(got, by_hand, rtol=0, atol=1e-15)
    uncorrected = reg.get("plain")(LossInputs(lp, OLD, ADV, MASK, agg=agg)).loss
    assert not torch.isclose(got, uncorrected) and seen == [None, None]  # the loss never saw the weights
    (grad,) = torch.autograd.grad(got, lp)
    assert (grad[~MASK] == 0).all()


def test_a_scalar_loss_that_does_not_declare_it_applies_the_weights_is_refused_in_one_line():
    reg = PolicyLossRegistry()

    @reg.register("scalar", importance_sampling_levels=("token",), zero_at_zero_advantage=True)
    def scalar(inputs):
        return LossOutputs(aggregate(-inputs.advantages * inputs.logprobs, inputs.response_mask))

    with pytest.raises(ValueError) as err:
        reg.get("scalar")(LossInputs(LOGPROBS, OLD, ADV, MASK, weights=WEIGHTS))
    message = str(err.value)
    assert "\n" not in message and message.startswith("policy loss 'scalar' returned a loss of shape ()")
    assert "applies_correction=True" in message


def test_a_loss_that_applies_the_correction_itself_sees_the_weights():
    reg, seen = PolicyLossRegistry(), []

    @reg.register("own", importance_sampling_levels=("token",), zero_at_zero_advantage=True, applies_correction=True)
    def own(inputs):
        seen.append(inputs.weights)
        return LossOutputs(aggregate(-inputs.advantages * inputs.logprobs * inputs.weights, inputs.response_mask))

    got = reg.get("own")(LossInputs(LOGPROBS, OLD, ADV, MASK, weights=WEIGHTS)).loss
    assert seen[0] is WEIGHTS and got.dim() == 0
    vespo = POLICY_LOSSES.get("vespo")(LossInputs(LOGPROBS, OLD, ADV, MASK, agg="token-mean", weights=WEIGHTS))
    assert torch.equal(vespo.loss, vespo_policy_loss(LOGPROBS, OLD, ADV, MASK, weights=WEIGHTS)[0])


@pytest.mark.parametrize("agg", [None, *AGGREGATIONS])
@pytest.mark.parametrize(
    "name, scalar_form, knobs",
    [
        ("ppo_clip", ppo_policy_loss, dict(clip_low=0.2, clip_high=0.28, dual_clip=3.0)),
        ("cispo", cispo_policy_loss, dict(clip_high=0.5)),
        ("sapo", sapo_policy_loss, dict(temperature_pos=1.0, temperature_neg=1.05)),
        ("vanilla", pg_loss, {}),
    ],
)
def test_the_built_in_entries_give_their_scalar_forms_bit_for_bit(name, scalar_form, knobs, agg):
    """The registry's correction and aggregation (and each loss's default aggregation when ``agg`` is
    None) are those of ``ppo_policy_loss`` and the others: their losses and gradients, bit for bit."""
    lp = LOGPROBS.clone().requires_grad_()
    entry = POLICY_LOSSES.get(name)(LossInputs(lp, OLD, ADV, MASK, agg=agg, weights=WEIGHTS), **knobs)
    formula, metrics = scalar_form(
        lp, OLD, ADV, MASK, weights=WEIGHTS, **knobs, **({} if agg is None else {"agg": agg})
    )
    assert torch.equal(entry.loss, formula)
    assert torch.equal(torch.autograd.grad(entry.loss, lp)[0], torch.autograd.grad(formula, lp)[0])
    assert entry.metrics.keys() == metrics.keys()
