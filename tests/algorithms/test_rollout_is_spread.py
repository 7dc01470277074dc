"""The sampler–trainer gap metrics of ``rollout_is_weights`` against hand-computed values: the
IS weights' spread (``rollout/is_weight_std``) and KL(sampler ‖ trainer) by the k3 estimator
(``rollout/kl_sampler_trainer``), over one process and merged over several (``Metric.merge``)."""

import math

import pytest
import torch

from rlhfkit.algorithms.rollout_is import rollout_is_weights


def k3(lr: float) -> float:
    return math.exp(lr) - 1 - lr


def test_weight_spread_and_kl_by_hand():
    # token log ratios old - rollout: 0.5, -0.5, 0 on row 0; ln 3 (capped at C = 2) on row 1; the 5th column is padding
    old = torch.tensor([[0.0, -1.0, -2.0, 0.0, 9.0], [math.log(3.0), 0.0, 0.0, 0.0, 0.0]])
    rollout = torch.tensor([[-0.5, -0.5, -2.0, 0.0, float("nan")], [0.0, 0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    _, _, m = rollout_is_weights(old, rollout, mask, "token_truncate", threshold=2.0)
    w = [math.exp(0.5), math.exp(-0.5), 1.0, 2.0]
    mean = sum(w) / 4
    assert m["rollout/is_weight_mean"].value.item() == pytest.approx(mean)
    assert m["rollout/is_weight_std"].value.item() == pytest.approx(math.sqrt(sum((x - mean) ** 2 for x in w) / 4))
    expected_kl = (k3(0.5) + k3(-0.5) + k3(0.0) + k3(math.log(3.0))) / 4  # the KL is of the ratios before the cap
    assert m["rollout/kl_sampler_trainer"].value.item() == pytest.approx(expected_kl)


def test_an_identical_sampler_has_no_spread_and_no_kl():
    lp = torch.tensor([[-0.3, -1.2, -0.7]])
    _, _, m = rollout_is_weights(lp, lp.clone(), torch.ones(1, 3), "token_mask", threshold=2.0)
    assert m["rollout/is_weight_std"].value.item() == 0 and m["rollout/kl_sampler_trainer"].value.item() == 0


def test_empty_mask_gives_zeros_not_nan():
    lp = torch.zeros(2, 3)
    _, _, m = rollout_is_weights(lp, lp, torch.zeros(2, 3), "sequence_truncate", threshold=2.0)
    assert m["rollout/is_weight_std"].value.item() == 0 and m["rollout/kl_sampler_trainer"].value.item() == 0


def test_merged_over_processes_is_the_metric_of_all_tokens():
    """The statistics of two halves (two processes, two micro-batches) merged give the spread and
    the KL of every token together: not the mean of the halves' values."""
    old = torch.tensor([[0.4, -0.2], [0.0, 0.1]])
    rollout = torch.zeros(2, 2)
    mask = torch.ones(2, 2)
    _, _, whole = rollout_is_weights(old, rollout, mask, "token_truncate", threshold=5.0)
    halves = [
        rollout_is_weights(old[i : i + 1], rollout[i : i + 1], mask[i : i + 1], "token_truncate", 5.0)[2]
        for i in (0, 1)
    ]
    for name in ("rollout/is_weight_std", "rollout/kl_sampler_trainer", "rollout/is_weight_mean"):
        merged = halves[0][name].merge(halves[1][name]).value.item()
        assert merged == pytest.approx(whole[name].value.item())
    halves_mean = (halves[0]["rollout/is_weight_std"].value + halves[1]["rollout/is_weight_std"].value) / 2
    assert halves_mean.item() != pytest.approx(whole["rollout/is_weight_std"].value.item(), abs=1e-3)
