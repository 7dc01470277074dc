"""Unscored samples (a reward function returned None for every function) are absent from every
statistic: a batch with invalid rows gives its valid rows exactly the advantages of the same batch
with those rows removed (rl/advantages.py)."""

import pytest
import torch

from rlhfkit.algorithms import group_advantages, reinforce_advantages, rloo_advantages
from rlhfkit.config import RLConfig, part
from rlhfkit.rl.advantages import AdvantageEstimation, compute_advantages, shape_scores


def _batch(B, T=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    scores = torch.randn(B, generator=gen, dtype=torch.float64)
    kl = torch.randn(B, T, generator=gen, dtype=torch.float64).abs() * 0.1
    values = torch.randn(B, T, generator=gen, dtype=torch.float64)
    has_eos = torch.rand(B, generator=gen) > 0.3
    return scores, mask, kl, values, has_eos


@pytest.mark.parametrize(
    "algorithm,extra",
    [
        ("grpo", {}),
        ("grpo", {"whiten_advantages": True}),
        ("dr_grpo", {}),
        ("rloo", {}),
        ("reinforce", {}),
        ("reinforce_plus_plus", {}),
        ("ppo", {}),
        ("grpo", {"normalize_rewards": True, "reward_clip": 1.0, "missing_eos_penalty": -1.0}),
    ],
)
def test_invalid_rows_give_the_advantages_of_the_batch_without_them(algorithm, extra):
    grouped = RLConfig(algorithm=algorithm).group_size > 1
    G, n_prompts = (4, 3) if grouped else (1, 12)
    B = G * n_prompts
    scores, mask, kl, values, has_eos = _batch(B)
    valid = torch.ones(B, dtype=torch.bool)
    if grouped:
        valid[torch.tensor([1, 4, 11])] = False  # one unscored sample in each group of 4
    else:
        valid[torch.tensor([0, 5, 6, 11])] = False
    scores = torch.where(valid, scores, torch.full_like(scores, 123.0))  # what an invalid row holds must not matter
    keep = valid.nonzero().flatten()
    full_args = RLConfig(algorithm=algorithm, group_size=G, prompts_per_step=n_prompts, **extra)
    kept_args = full_args.replace(group_size=G - 1 if grouped else 1)

    full_scores, full_metrics = shape_scores(scores, valid, has_eos, full_args)
    kept_scores, kept_metrics = shape_scores(
        scores[keep], torch.ones(len(keep), dtype=torch.bool), has_eos[keep], kept_args
    )
    torch.testing.assert_close(full_scores[keep], kept_scores)
    torch.testing.assert_close(full_metrics["reward/mean"], kept_metrics["reward/mean"])
    torch.testing.assert_close(full_metrics["reward/std"], kept_metrics["reward/std"])

    vals = values if full_args.use_critic else None
    adv, ret, _, train_mask = compute_advantages(
        part(AdvantageEstimation, full_args), full_scores, valid, mask, kl, vals, 0.05
    )
    kept = compute_advantages(
        part(AdvantageEstimation, kept_args),
        kept_scores,
        torch.ones(len(keep), dtype=torch.bool),
        mask[keep],
        kl[keep],
        vals[keep] if vals is not None else None,
        0.05,
    )
    torch.testing.assert_close(adv[keep], kept[0])
    assert (adv[~valid] == 0).all() and not train_mask[~valid].any()
    assert torch.equal(train_mask[keep], mask[keep])
    if ret is not None:
        torch.testing.assert_close(ret[keep], kept[1])


def test_group_statistics_by_hand_with_an_invalid_sample():
    scores = torch.tensor([1.0, 0.0, 9.0, 1.0], dtype=torch.float64)
    valid = torch.tensor([True, True, False, True])
    # valid: 1, 0, 1 -> mean 2/3, unbiased std sqrt(1/3)
    std = (1 / 3) ** 0.5
    expected = torch.tensor([(1 / 3) / std, (-2 / 3) / std, 0.0, (1 / 3) / std], dtype=torch.float64)
    torch.testing.assert_close(group_advantages(scores, 4, eps=0.0, valid=valid), expected)
    torch.testing.assert_close(
        group_advantages(scores, 4, scale="none", valid=valid),
        torch.tensor([1 / 3, -2 / 3, 0.0, 1 / 3], dtype=torch.float64),
    )
    torch.testing.assert_close(
        rloo_advantages(scores, 4, valid=valid), torch.tensor([0.5, -1.0, 0.0, 0.5], dtype=torch.float64)
    )
    torch.testing.assert_close(
        reinforce_advantages(scores, valid=valid), torch.tensor([1 / 3, -2 / 3, 0.0, 1 / 3], dtype=torch.float64)
    )


def test_a_group_with_one_valid_sample_has_no_baseline():
    scores = torch.tensor([5.0, 1.0, 2.0, 3.0])
    valid = torch.tensor([True, False, True, True])
    for adv in (group_advantages(scores, 2, valid=valid), rloo_advantages(scores, 2, valid=valid)):
        assert adv[0] == 0 and adv[1] == 0 and adv[2] != 0


def test_without_invalid_rows_nothing_changes():
    scores = torch.randn(8, dtype=torch.float64)
    every = torch.ones(8, dtype=torch.bool)
    torch.testing.assert_close(group_advantages(scores, 4, valid=every), group_advantages(scores, 4))
    grouped = scores.view(2, 4)
    by_formula = (grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-6)
    torch.testing.assert_close(group_advantages(scores, 4), by_formula.reshape(-1))


@pytest.mark.parametrize("algorithm", ["reinforce_plus_plus", "grpo", "ppo", "rloo", "reinforce"])
def test_a_batch_no_function_scored_gives_zero_advantages_without_error(algorithm):
    args = RLConfig(algorithm=algorithm, prompts_per_step=2)
    B = args.batch_size
    scores, mask, kl, values, _ = _batch(B)
    nothing = torch.zeros(B, dtype=torch.bool)
    adv, _, _, train_mask = compute_advantages(
        part(AdvantageEstimation, args), scores, nothing, mask, kl, values if args.use_critic else None, 0.05
    )
    assert (adv == 0).all() and not train_mask.any()


def test_advantage_epsilon_reaches_the_group_estimator():
    """(r - mean_g) / (std_g + ε) with the config's ε: scores 0 and 1 in a group of two have an
    unbiased std of 1/√2, so ε = 1 gives ±0.5 / (1/√2 + 1)."""
    args = RLConfig(algorithm="grpo", group_size=2, prompts_per_step=1, advantage_epsilon=1.0)
    mask = torch.ones(2, 3, dtype=torch.bool)
    adv, *_ = compute_advantages(
        part(AdvantageEstimation, args),
        torch.tensor([0.0, 1.0]),
        torch.ones(2, dtype=torch.bool),
        mask,
        None,
        None,
        0.0,
    )
    expected = 0.5 / (2**-0.5 + 1.0)
    torch.testing.assert_close(adv[:, 0], torch.tensor([-expected, expected]))
