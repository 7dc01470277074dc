"""Token-level reward shaping: KL in the reward, score on the last token, missing-EOS penalty."""

import math

import pytest
import torch

from rlhfkit.algorithms import apply_missing_eos_penalty, last_token_index, token_level_rewards

F64 = torch.float64


def t(x, dtype=F64):
    return torch.tensor(x, dtype=dtype)


def test_last_token_index():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1], [0, 1, 0, 1], [1, 1, 0, 0]])
    assert last_token_index(mask).tolist() == [2, 0, 3, 3, 1]
    assert last_token_index(mask.bool()).tolist() == [2, 0, 3, 3, 1]
    assert last_token_index(mask.float()).tolist() == [2, 0, 3, 3, 1]


def test_last_token_index_empty_row():
    with pytest.raises(
        ValueError, match=r"response_mask has rows without any response token: rows \[1\] of shape \(2, 3\)"
    ):
        last_token_index(torch.tensor([[1, 0, 0], [0, 0, 0]]))


def test_token_level_rewards_by_hand():
    scores = t([1.0, -0.5])
    kl = t([[0.2, -0.1, 0.4, 9.0], [0.3, 0.5, math.nan, math.nan]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    out = token_level_rewards(scores, kl, mask, kl_coef=0.1)
    # row 0: -0.1·[0.2, -0.1, 0.4] = [-0.02, 0.01, -0.04], + 1.0 on token 2 → 0.96; padding 0
    # row 1: -0.1·[0.3, 0.5] = [-0.03, -0.05], - 0.5 on token 1 → -0.55; NaN padding stays out
    expected = t([[-0.02, 0.01, 0.96, 0.0], [-0.03, -0.55, 0.0, 0.0]])
    torch.testing.assert_close(out, expected)


def test_token_level_rewards_without_kl():
    out = token_level_rewards(t([2.0, 3.0]), None, torch.tensor([[1, 0, 1, 0], [1, 1, 1, 1]]))
    torch.testing.assert_close(out, t([[0.0, 0.0, 2.0, 0.0], [0.0, 0.0, 0.0, 3.0]]))


def test_token_level_rewards_sum_is_score_minus_kl():
    g = torch.Generator().manual_seed(0)
    scores, kl = torch.randn(4, generator=g, dtype=F64), torch.randn(4, 6, generator=g, dtype=F64)
    mask = torch.tensor([[1] * 6, [1, 1, 0, 0, 0, 0], [1, 0, 1, 1, 0, 0], [1, 0, 0, 0, 0, 0]])
    out = token_level_rewards(scores, kl, mask, kl_coef=0.05)
    torch.testing.assert_close(out.sum(-1), scores - 0.05 * (kl * mask).sum(-1))


def test_token_level_rewards_dtype_follows_scores():
    out = token_level_rewards(
        torch.tensor([1.0]), torch.tensor([[0.5, 0.5]], dtype=torch.bfloat16), torch.ones(1, 2), kl_coef=1.0
    )
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.tensor([[-0.5, 0.5]]))


def test_token_level_rewards_validation():
    mask = torch.ones(2, 3)
    with pytest.raises(
        ValueError, match=r"response_mask has rows without any response token: rows \[0\] of shape \(2, 3\)"
    ):
        token_level_rewards(torch.zeros(2), torch.zeros(2, 3), torch.tensor([[0, 0, 0], [1, 1, 0]]), 0.1)
    with pytest.raises(ValueError, match=r"scores has 3 rows but response_mask has shape \(2, 3\)"):
        token_level_rewards(torch.zeros(3), None, mask)
    with pytest.raises(ValueError, match=r"kl must have shape \(2, 3\), got \(2, 4\)"):
        token_level_rewards(torch.zeros(2), torch.zeros(2, 4), mask, 0.1)
    with pytest.raises(ValueError, match=r"scores must have 1 dimension\(s\), got shape \(2, 1\)"):
        token_level_rewards(torch.zeros(2, 1), None, mask)
    with pytest.raises(ValueError, match=r"response_mask must have 2 dimension\(s\), got shape \(3,\)"):
        token_level_rewards(torch.zeros(3), None, torch.ones(3))
    with pytest.raises(
        ValueError, match=r"response_mask must be bool, integer or float 0/1 values, got dtype torch.complex64"
    ):
        token_level_rewards(torch.zeros(2), None, torch.ones(2, 3, dtype=torch.complex64))
    with pytest.raises(ValueError, match=r"kl must be a torch.Tensor, got list"):
        token_level_rewards(torch.zeros(2), [[0.0] * 3] * 2, mask, 0.1)


def test_apply_missing_eos_penalty_replace():
    scores = t([0.7, 2.0, -0.3])
    has_eos = torch.tensor([True, False, False])
    out = apply_missing_eos_penalty(scores, has_eos, penalty=-1.0)  # "replace" is the default
    torch.testing.assert_close(out, t([0.7, -1.0, -1.0]))
    torch.testing.assert_close(apply_missing_eos_penalty(scores, has_eos, -1.0, mode="replace"), t([0.7, -1.0, -1.0]))
    assert scores.tolist() == [0.7, 2.0, -0.3]  # the input is left alone


def test_apply_missing_eos_penalty_subtract():
    scores = t([0.7, 2.0, -0.3])
    out = apply_missing_eos_penalty(scores, torch.tensor([1, 0, 0]), penalty=1.5, mode="subtract")
    torch.testing.assert_close(out, t([0.7, 0.5, -1.8]))


def test_apply_missing_eos_penalty_validation():
    with pytest.raises(ValueError, match=r"mode must be 'replace' or 'subtract', got 'add'"):
        apply_missing_eos_penalty(torch.zeros(2), torch.ones(2, dtype=torch.bool), 1.0, mode="add")
    with pytest.raises(ValueError, match=r"has_eos must have shape \(2,\), got \(3,\)"):
        apply_missing_eos_penalty(torch.zeros(2), torch.ones(3, dtype=torch.bool), 1.0)
