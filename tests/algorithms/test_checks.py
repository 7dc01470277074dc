"""Bad input: every public function refuses it with a ValueError that names the argument and shows
what it saw (shapes, dtypes), before any arithmetic."""

import math

import pytest
import torch

from rlhfkit.algorithms import (
    aggregate,
    cispo_policy_loss,
    gae,
    group_advantages,
    kl_penalty,
    pg_loss,
    ppo_policy_loss,
    rloo_advantages,
    token_level_rewards,
    value_loss,
    whiten,
)
from rlhfkit.algorithms._checks import (
    check_groups,
    check_mask,
    check_nonempty_rows,
    check_same_shape,
    check_tensor,
    masked_mean,
    masked_sum,
)

# --------------------------------------------------------------------------------------------
# the shared checks
# --------------------------------------------------------------------------------------------


def test_check_tensor():
    x = torch.zeros(2, 3)
    assert check_tensor("x", x) is x
    assert check_tensor("x", x, ndim=2) is x
    with pytest.raises(ValueError, match=r"x must be a torch.Tensor, got list"):
        check_tensor("x", [1.0])
    with pytest.raises(ValueError, match=r"x must have 3 dimension\(s\), got shape \(2, 3\)"):
        check_tensor("x", x, ndim=3)


def test_check_same_shape_lists_every_name():
    check_same_shape(a=torch.zeros(2), b=torch.zeros(2))
    with pytest.raises(ValueError, match=r"shape mismatch: expected equal shapes, got a=\(2,\), b=\(3,\), c=\(2,\)"):
        check_same_shape(a=torch.zeros(2), b=torch.zeros(3), c=torch.zeros(2))
    with pytest.raises(ValueError, match=r"b must be a torch.Tensor, got int"):
        check_same_shape(a=torch.zeros(2), b=3)


@pytest.mark.parametrize(
    "mask",
    [
        torch.tensor([[True, False, True]]),
        torch.tensor([[1, 0, 1]], dtype=torch.uint8),
        torch.tensor([[1, 0, 1]], dtype=torch.int8),
        torch.tensor([[1, 0, 1]], dtype=torch.int16),
        torch.tensor([[1, 0, 1]], dtype=torch.int32),
        torch.tensor([[1, 0, 1]], dtype=torch.int64),
        torch.tensor([[1.0, 0.0, 1.0]]),
        torch.tensor([[1.0, 0.0, 1.0]], dtype=torch.float16),
        torch.tensor([[1.0, 0.0, 1.0]], dtype=torch.bfloat16),
        torch.tensor([[1.0, 0.0, 1.0]], dtype=torch.float64),
    ],
    ids=lambda m: str(m.dtype),
)
def test_check_mask_accepts_bool_int_float(mask):
    out = check_mask(mask, (1, 3))
    assert out.dtype == torch.bool
    assert out.tolist() == [[True, False, True]]


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_check_mask_refuses_complex(dtype):
    with pytest.raises(
        ValueError, match=rf"response_mask must be bool, integer or float 0/1 values, got dtype {dtype}"
    ):
        check_mask(torch.ones(1, 3, dtype=dtype), (1, 3))


def test_check_mask_shape_and_name():
    with pytest.raises(ValueError, match=r"has_eos must have shape \(4,\), got \(1, 3\)"):
        check_mask(torch.ones(1, 3), (4,), "has_eos")
    with pytest.raises(ValueError, match=r"response_mask must be a torch.Tensor, got list"):
        check_mask([[1, 0]], (1, 2))


def test_check_nonempty_rows():
    check_nonempty_rows(torch.tensor([[True, False], [False, True]]))
    with pytest.raises(ValueError, match=r"rows without any response token: rows \[0, 2\] of shape \(3, 2\)"):
        check_nonempty_rows(torch.tensor([[0, 0], [1, 0], [0, 0]]))


def test_check_groups():
    assert check_groups(6, 3) == 2
    with pytest.raises(ValueError, match=r"group_size must be an int >= 2 \(a baseline needs other samples\), got 1"):
        check_groups(4, 1)
    with pytest.raises(ValueError, match=r"group_size must be an int >= 2.*got 2.0"):
        check_groups(4, 2.0)
    with pytest.raises(ValueError, match=r"group_size must be an int >= 2.*got True"):
        check_groups(4, True)
    with pytest.raises(ValueError, match=r"group_size=4 does not divide the batch: scores has 6 rows"):
        check_groups(6, 4)


def test_masked_sum_and_mean():
    x = torch.tensor([[1.0, math.nan], [math.inf, 4.0]])
    m = torch.tensor([[True, False], [False, True]])
    assert masked_sum(x, m).item() == 5.0
    assert masked_sum(x, m, dim=1).tolist() == [1.0, 4.0]
    assert masked_mean(x, m).item() == 2.5
    assert masked_mean(x, torch.zeros(2, 2, dtype=torch.bool)).item() == 0.0
    assert masked_mean(x, torch.tensor([[True, False], [False, False]]), dim=1).tolist() == [1.0, 0.0]


# --------------------------------------------------------------------------------------------
# the public functions
# --------------------------------------------------------------------------------------------


def test_gae_bad_shapes():
    with pytest.raises(ValueError, match=r"token_rewards=\(2, 3\), values=\(2, 4\)"):
        gae(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3), 1.0, 0.95)
    with pytest.raises(ValueError, match=r"token_rewards must have 2 dimension\(s\), got shape \(3,\)"):
        gae(torch.zeros(3), torch.zeros(3), torch.ones(3), 1.0, 0.95)
    with pytest.raises(ValueError, match=r"response_mask must have shape \(2, 3\), got \(3, 2\)"):
        gae(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(3, 2), 1.0, 0.95)
    with pytest.raises(
        ValueError, match=r"response_mask must be bool, integer or float 0/1 values, got dtype torch.complex64"
    ):
        gae(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.complex64), 1.0, 0.95)


@pytest.mark.parametrize(
    "fn", [lambda s, g: group_advantages(s, g), lambda s, g: rloo_advantages(s, g)], ids=["group", "rloo"]
)
def test_group_estimators_bad_group_size(fn):
    with pytest.raises(ValueError, match=r"group_size=4 does not divide the batch: scores has 6 rows"):
        fn(torch.zeros(6), 4)
    with pytest.raises(ValueError, match=r"group_size must be an int >= 2 .*got 1"):
        fn(torch.zeros(6), 1)
    with pytest.raises(ValueError, match=r"group_size must be an int >= 2 .*got 0"):
        fn(torch.zeros(6), 0)
    with pytest.raises(ValueError, match=r"scores must have 1 dimension\(s\), got shape \(3, 2\)"):
        fn(torch.zeros(3, 2), 2)


def test_token_level_rewards_empty_row_names_rows_and_shape():
    with pytest.raises(
        ValueError, match=r"response_mask has rows without any response token: rows \[1\] of shape \(3, 4\)"
    ):
        token_level_rewards(torch.zeros(3), torch.zeros(3, 4), torch.tensor([[1, 0, 0, 0], [0] * 4, [1] * 4]), 0.1)


def test_policy_and_value_losses_bad_masks():
    x = torch.zeros(2, 3)
    for fn in (ppo_policy_loss, pg_loss, lambda *a: cispo_policy_loss(*a, clip_high=4.0)):
        with pytest.raises(ValueError, match=r"response_mask must have shape \(2, 3\), got \(2,\)"):
            fn(x, x, x, torch.ones(2))
        with pytest.raises(
            ValueError, match=r"response_mask must be bool, integer or float 0/1 values, got dtype torch.complex128"
        ):
            fn(x, x, x, torch.ones(2, 3, dtype=torch.complex128))
    with pytest.raises(ValueError, match=r"response_mask must have shape \(2, 3\), got \(2, 2\)"):
        value_loss(x, x, x, torch.ones(2, 2))
    with pytest.raises(ValueError, match=r"values must have 2 dimension\(s\), got shape \(3,\)"):
        value_loss(torch.zeros(3), torch.zeros(3), torch.zeros(3), torch.ones(3))


def test_other_bad_inputs():
    with pytest.raises(ValueError, match=r"mask must be bool, integer or float 0/1 values, got dtype torch.complex64"):
        aggregate(torch.zeros(2, 2), torch.ones(2, 2, dtype=torch.complex64))
    with pytest.raises(ValueError, match=r"mask must be bool, integer or float 0/1 values, got dtype torch.complex64"):
        whiten(torch.zeros(2, 2), torch.ones(2, 2, dtype=torch.complex64))
    with pytest.raises(ValueError, match=r"x must be a torch.Tensor, got list"):
        whiten([1.0, 2.0])
    with pytest.raises(ValueError, match=r"logprobs must be a torch.Tensor, got list"):
        kl_penalty([0.0], torch.zeros(1))
