"""The one padder (rlhfkit/data/padding.py): layouts by hand, for both sides and a minimum width."""

import pytest
import torch

from rlhfkit.data.padding import pad


def test_left_padding_puts_every_last_token_in_the_last_column():
    ids, mask = pad([[5, 6, 7], [8], []], 0, "left")
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8], [0, 0, 0]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1], [0, 0, 0]]
    assert ids.dtype == torch.long and mask.dtype == torch.long


def test_right_padding_is_the_default_and_the_mask_not_the_pad_id_marks_padding():
    ids, mask = pad([(5, 1), [1, 1, 1]], 1)  # the pad id equals a real token (EOS)
    assert ids.tolist() == [[5, 1, 1], [1, 1, 1]]
    assert mask.tolist() == [[1, 1, 0], [1, 1, 1]]
    assert ids.dtype == torch.long and mask.dtype == torch.long


@pytest.mark.parametrize(
    "side, ids_row, mask_row", [("right", [4, 9, 9, 9], [1, 0, 0, 0]), ("left", [9, 9, 9, 4], [0, 0, 0, 1])]
)
def test_min_width_widens_on_the_padding_side_only(side, ids_row, mask_row):
    ids, mask = pad([[4]], 9, side, min_width=4)
    assert ids.tolist() == [ids_row] and mask.tolist() == [mask_row]
    assert pad([[4, 5, 6]], 9, side, min_width=2)[0].tolist() == [[4, 5, 6]]  # never narrower than a row
    assert pad([[]], 9, side, min_width=1)[0].tolist() == [[9]]


def test_unknown_side_is_one_line():
    with pytest.raises(ValueError, match="side must be 'left' or 'right', got 'middle'"):
        pad([[1]], 0, "middle")
