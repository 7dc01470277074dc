"""The rollout IS modes as registry entries: their traits against what each mode does, and the
metrics reduced over processes (``reduce`` / ``reduce_max``) against those of the whole batch.
The values of every mode are in test_rollout_is.py."""

import math

import pytest
import torch

from rlhfkit.algorithms import ROLLOUT_IS_MODES, rollout_is_weights

L, C = math.log, 2.0
# token ratios 0.5, 3, 1 | 1.5, 2, (padding) | 0.5, 0.5, 1: the token masks drop the 3, the sequence
# masks rows 1 (ratio 3) and 2 (ratio 0.25)
OLD = torch.tensor([[L(0.25), L(0.75), L(0.9)], [L(0.75), L(0.5), 0.0], [L(0.25), L(0.25), L(0.9)]],
                   dtype=torch.float64)
ROLLOUT = torch.tensor([[L(0.5), L(0.25), L(0.9)], [L(0.5), L(0.25), 0.0], [L(0.5), L(0.5), L(0.9)]],
                       dtype=torch.float64)
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
def test_reduced_metrics_are_those_of_the_whole_batch(mode):
    """Rows 0-1 on one "process" and row 2 on another, reduced (as the trainer passes
    ``distributed.reduce_sum`` / ``reduce_tensor_max``), give the metrics of the three rows
    together; the weights stay the process's own."""
    whole = rollout_is_weights(OLD, ROLLOUT, MASK, mode, C)[2]
    other = {}
    rollout_is_weights(OLD[2:], ROLLOUT[2:], MASK[2:], mode, C,
                       reduce=lambda x: other.setdefault("sum", x), reduce_max=lambda x: other.setdefault("max", x))
    weights, _, metrics = rollout_is_weights(OLD[:2], ROLLOUT[:2], MASK[:2], mode, C,
                                             reduce=lambda x: x + other["sum"],
                                             reduce_max=lambda x: torch.maximum(x, other["max"]))
    assert {k: v.item() for k, v in metrics.items()} == pytest.approx({k: v.item() for k, v in whole.items()},
                                                                      abs=1e-7)
    assert torch.equal(weights, rollout_is_weights(OLD[:2], ROLLOUT[:2], MASK[:2], mode, C)[0])
