"""Forward passes over rows made of several sequences (*segments*): agent episodes whose chat
template rewrote their history (``agents.rows``).

A row of ``Rollout.segments`` is its segments one after another; each segment is a sequence of
its own — the tokens a turn was sampled after, the turn, what followed it until the next
re-rendering. ``forward_rollout`` runs every segment of the batch as a row of its own (left-padded,
positions from 0, attending to its own tokens only: exactly the forward pass of that sequence
alone) and lays the per-token outputs back in the packed row's columns: a response token gets the
log-prob (entropy, hidden state, kept mass) predicted by the tokens before it *in its segment*.
The first token of a segment is predicted by nothing (0 there; it is never a sampled token).
Without segments this is ``forward_response`` itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .policy import ResponseForward, forward_response


@dataclass
class SegmentView:
    """The segments of a batch as rows of their own, and where their outputs go back.

    ``input_ids``, ``attention_mask`` (N, W): one left-padded row per segment; ``response_len``:
    the last T' columns of these rows hold every token the packed rows need an output for;
    ``index`` (B, T): for each packed response column, its position in the flattened (N * T')
    outputs, or N * T' (a zero) where none."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_len: int
    index: torch.Tensor

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """(N, T', ...) outputs of the segment rows → (B, T, ...) in the packed rows' columns."""
        flat = torch.cat([x.reshape(-1, *x.shape[2:]), x.new_zeros((1, *x.shape[2:]))])
        return flat[self.index.reshape(-1).to(x.device)].reshape(*self.index.shape, *x.shape[2:])


def segment_view(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, segments: torch.Tensor, response_len: int
) -> SegmentView:
    """``SegmentView`` of packed rows (B, P+T) whose last ``response_len`` columns are the
    response region; ``segments`` numbers each column's segment (read where attended)."""
    B, L = input_ids.shape
    P = L - response_len
    rows, needs = [], []
    for b in range(B):
        real = attention_mask[b].bool()
        for s in torch.unique(segments[b][real]).tolist():
            cols = torch.nonzero(real & (segments[b] == s)).flatten()
            need = cols[cols >= P]
            if len(need) and need[0] == cols[0]:  # a segment's first token: nothing before it predicts it
                need = need[1:]
            rows.append(input_ids[b, cols].tolist())
            needs.append((b, (need - P).tolist()))
    W = max(len(r) for r in rows)
    ids = torch.tensor([[0] * (W - len(r)) + r for r in rows], dtype=torch.long)
    mask = torch.tensor([[0] * (W - len(r)) + [1] * len(r) for r in rows], dtype=torch.long)
    T = max(1, max(len(n) for _, n in needs))
    index = torch.full((B, response_len), len(rows) * T, dtype=torch.long)
    for r, (b, columns) in enumerate(needs):
        index[b, columns] = torch.arange(r * T + T - len(columns), (r + 1) * T, dtype=torch.long)
    device = input_ids.device
    return SegmentView(ids.to(device), mask.to(device), T, index.to(device))


def forward_rollout(model, rollout, temperature: float = 1.0, **kwargs) -> ResponseForward:
    """``forward_response`` on a rollout's rows (``kwargs``: its options), each segment in its
    own context when the rollout has ``segments`` (a shared prompt pass is then not used)."""
    T = rollout.response_mask.shape[1]
    segments = getattr(rollout, "segments", None)
    if segments is None:
        return forward_response(model, rollout.input_ids, rollout.attention_mask, T, temperature, **kwargs)
    view = segment_view(rollout.input_ids, rollout.attention_mask, segments, T)
    kwargs.pop("prompt_index", None)
    out = forward_response(model, view.input_ids, view.attention_mask, view.response_len, temperature, **kwargs)
    return out.map(view.pack)


def rollout_values(critic, rollout) -> torch.Tensor:
    """A separate critic's (B, T) values (``ScalarModel.values``), each segment in its own context."""
    T = rollout.response_mask.shape[1]
    segments = getattr(rollout, "segments", None)
    if segments is None:
        return critic(rollout.input_ids, rollout.attention_mask, T)
    view = segment_view(rollout.input_ids, rollout.attention_mask, segments, T)
    return view.pack(critic(view.input_ids, view.attention_mask, view.response_len))
