"""Left-aligned rows: a padded batch run with no attention mask, so attention runs SDPA's fused causal
kernels instead of a materialised ``(B, 1, N, N)`` mask.

A batch of the RL loop is laid out ``[left padding | prompt | response | right padding]``. Given that
2-D mask, transformers builds a dense 4-D mask for SDPA whenever any row has padding (nearly every
batch: prompts and completions differ in length), which costs ``B·N²`` bytes per layer call (8 rows
of 8k tokens: 512 MB) and keeps SDPA off its flash kernels (on CUDA, flash attention takes no mask).
Shifted left by its own padding, every row starts at column 0 and its padding is only at its end;
under a causal mask a token attends to the tokens before it, which are then all real, so the model
can run with ``attention_mask=None`` (``is_causal``): the padding at a row's end is computed but read
by no real token and no output. The positions are the row's own (``0, 1, ...``), as
``position_ids_from_mask`` numbers them, so the results are the padded rows' up to float summation
order. It applies where packing does (``models.packing.packable_model``: architectures whose tokens
meet only through causal attention with positions from ``position_ids``) and where each row's
attended tokens are contiguous (the padding is only at its two ends).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .packing import packable_model


@dataclass
class AlignedRows:
    """A batch shifted left by each row's padding, and where its response's predicting columns lie."""

    input_ids: torch.Tensor  # (B, W): row b's tokens from column 0, its padding at the end
    keep: int  # logits_to_keep: the columns from the first predicting column of any row on
    index: torch.Tensor  # (B, T): the kept column (of the last ``keep``) that predicts response token t

    def pick(self, values: torch.Tensor) -> torch.Tensor:
        """(B, keep, ...) per kept column -> (B, T, ...) per response token."""
        index = self.index.reshape(*self.index.shape, *([1] * (values.dim() - 2)))
        return values.gather(1, index.expand(*self.index.shape, *values.shape[2:]))


def align_left(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_len: int) -> AlignedRows | None:
    """The left-aligned layout of ``input_ids`` (B, P+T), or None where it does not apply: no row has
    padding (the mask is then none already), a row's attended tokens are not contiguous, or the model
    is not one ``packable_model`` accepts."""
    mask = attention_mask.bool()
    B, W = input_ids.shape
    if bool(mask.all()) or not packable_model(model, W):
        return None
    columns = torch.arange(W, device=input_ids.device)
    lead = (mask.long().cumsum(-1) == 0).sum(-1)  # (B,) left padding of each row
    count = mask.sum(-1)
    contiguous = (columns >= lead[:, None]) & (columns < (lead + count)[:, None])
    if not torch.equal(contiguous, mask):
        return None
    P = W - response_len
    if int(lead.max()) > P - 1:  # a row with no attended prompt token: nothing predicts its first token
        return None
    shifted = input_ids.gather(1, (columns + lead[:, None]).clamp(max=W - 1))
    first = P - 1 - int(lead.max())  # the leftmost predicting column of any row
    keep = W - first
    t = torch.arange(response_len, device=input_ids.device)
    index = (P - 1 - lead)[:, None] + t[None, :] - first  # row b's token t is predicted at P-1-lead+t
    return AlignedRows(shifted, keep, index)
