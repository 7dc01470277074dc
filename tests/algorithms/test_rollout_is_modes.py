"""The rollout IS modes as registry entries: their traits against what each mode does, and the
metrics reduced over processes (``reduce`` / ``reduce_max``) against those of the whole batch,
and the bounds set apart (``low``, no cap: TRL's clip_min / clip_max). The values of every mode
are in test_rollout_is.py."""

import math

import pytest
import torch

from rlhfkit.algorithms import ROLLOUT_IS_MODES, rollout_is_weights

L, C = math.log, 2.0
# token ratios 0.5, 3, 1 | 1.5, 2, (padding) | 0.5, 0.5, 1: the token masks drop the 3, the sequence
# masks rows 1 (ratio 3) and 2 (ratio 0.25)
OLD = torch.tensor(
    [[L(0.25), L(0.75), L(0.9)], [L(0.75), L(0.5), 0.0], [L(0.25), L(0.25), L(0.9)]], dtype=torch.float64
)
ROLLOUT = torch.tensor(
    [[L(0.5), L(0.25), L(0.9)], [L(0.5), L(0.25), 0.0], [L(0.5), L(0.5), L(0.9)]], dtype=torch.float64
)
MASK = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1]]).bool()


def test_iterating_the_registry_gives_the_modes_in_the_documented_order():
    assert list(ROLLOUT_IS_MODES) == ["none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]


@pytest.mark.parametrize("mode", ROLLOUT_IS_MODES)
def test_traits_say_what_each_mode_does(mode):
    """``masks``: the mode may remove tokens (the trainer then needs the kept mask before the
    update); ``level``: a sequence mode weighs every kept token of a row alike, a token mode not."""
    traits = ROLLOUT_IS_MODES.traits(mode)
    weights, kept, _ = rollout_is_weights(OLD, ROLLOUT, MASK, mode, C)
    assert traits["masks"] == (not torch.equal(kept, MASK))
    row_weights = [set(weights[row][kept[row]].tolist()) for row in range(len(MASK))]
    if traits["level"] == "sequence":
        assert all(len(w) <= 1 for w in row_weights)
    elif mode != "none":
        assert len(row_weights[0]) > 1


@pytest.mark.parametrize("mode", ROLLOUT_IS_MODES)
def test_merged_metrics_are_those_of_the_whole_batch(mode):
    """Rows 0-1 on one "process" (or micro-batch) and row 2 on another: their metrics' statistics,
    merged (as the update and ``metrics.reduced`` do), give the metrics of the three rows together;
    the weights stay each part's own."""
    whole = rollout_is_weights(OLD, ROLLOUT, MASK, mode, C)[2]
    weights, _, first = rollout_is_weights(OLD[:2], ROLLOUT[:2], MASK[:2], mode, C)
    second = rollout_is_weights(OLD[2:], ROLLOUT[2:], MASK[2:], mode, C)[2]
    merged = {k: first[k].merge(second[k]).value.item() for k in first}
    assert merged == pytest.approx({k: v.value.item() for k, v in whole.items()}, abs=1e-7)
    assert torch.equal(weights, rollout_is_weights(OLD, ROLLOUT, MASK, mode, C)[0][:2])


def test_trls_bounds_a_floor_no_cap_and_a_one_sided_mask():
    """TRL's vllm_importance_sampling_clip_min / _max as ``low`` / ``threshold``, by hand:
    ratios e^-1.5, e^0.5, e^1.5 (one row, one sequence of log-ratio sum 0.5)."""
    old, rollout, mask = torch.tensor([[-1.5, 0.5, 1.5]]), torch.zeros(1, 3), torch.ones(1, 3, dtype=torch.bool)
    e = torch.tensor([[-1.5, 0.5, 1.5]]).exp()
    w, kept, _ = rollout_is_weights(old, rollout, mask, "token_truncate", None)  # no cap, no floor
    assert torch.allclose(w, e) and kept.all()
    w, _, _ = rollout_is_weights(old, rollout, mask, "token_truncate", 3.0, low=0.5)  # clamp(rho, 0.5, 3)
    assert torch.allclose(w, torch.tensor([[0.5, e[0, 1], 3.0]]))
    w, kept, _ = rollout_is_weights(old, rollout, mask, "token_mask", 3.0, low=0.0)  # [0, 3]: only e^1.5 leaves
    assert kept.tolist() == [[True, True, False]] and torch.allclose(w, torch.tensor([[e[0, 0], e[0, 1], 0.0]]))
    _, kept, _ = rollout_is_weights(old, rollout, mask, "token_mask", 3.0)  # native [1/3, 3]: e^-1.5 leaves too
    assert kept.tolist() == [[False, True, False]]
    w, kept, _ = rollout_is_weights(old, rollout, mask, "sequence_mask", 1.5, low=0.0)  # e^0.5 = 1.65 > 1.5
    assert not kept.any() and (w == 0).all()


@pytest.mark.parametrize("low", [-0.1, 3.0, float("nan"), True])
def test_a_floor_outside_zero_to_threshold_is_refused(low):
    with pytest.raises(ValueError, match="lower bound"):
        rollout_is_weights(OLD, ROLLOUT, MASK, "token_mask", 3.0, low=low)
