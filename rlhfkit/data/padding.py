"""The one padder: rows of token ids of different lengths laid out as one (N, L) batch.

Left padding puts every row's last token in the last column (prompts to generate from, the prompt
half of ``[left padding | prompt | completion | right padding]``); right padding puts every row's
first token in column 0 (sequences to score or train on, completions). The attention mask, not
the pad id, marks the padding: the pad id may equal a real token (EOS).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.nn.utils.rnn import pad_sequence

SIDES = ("left", "right")


def pad(
    rows: Sequence[Sequence[int]], value: int, side: str = "right", *, min_width: int = 0, device=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, mask)``, both (N, L) long: each row of ``rows`` flush against ``side``'s opposite end
    (``side`` is where the padding goes) with ``value`` in the padding, and 1 on the row's tokens,
    0 on the padding. ``L`` is the longest row, or ``min_width`` when that is wider; the tensors
    are moved to ``device`` when given."""
    if side not in SIDES:
        raise ValueError(f"pad: side must be 'left' or 'right', got {side!r}")
    tensors = [torch.as_tensor(list(row), dtype=torch.long) for row in rows]
    ids = pad_sequence(tensors, batch_first=True, padding_value=value, padding_side=side)
    mask = pad_sequence([torch.ones(len(t), dtype=torch.long) for t in tensors], batch_first=True, padding_side=side)
    if ids.shape[1] < min_width:
        extra = (min_width - ids.shape[1], 0) if side == "left" else (0, min_width - ids.shape[1])
        ids = torch.nn.functional.pad(ids, extra, value=value)
        mask = torch.nn.functional.pad(mask, extra, value=0)
    if device is not None:
        ids, mask = ids.to(device), mask.to(device)
    return ids, mask


__all__ = ["pad"]
