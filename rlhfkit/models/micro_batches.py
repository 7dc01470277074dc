"""Micro-batches of a batch's rows bounded by a row count and by a token budget (verl's dynamic
batch size, ``RLConfig.max_tokens_per_micro_batch``): what the RL update and the no-gradient
log-prob passes of ``RLModels`` split their rows into.

The tokens of a micro-batch are the positions an unpacked forward pass over its rows computes
(``policy.forward_response``, which first trims the columns no row of the micro-batch attends):
``rows x (prompt columns + response columns)``, where the prompt columns run from the earliest
attended prompt column of any of its rows to the end of the prompt region (prompts are
left-padded) and the response columns up to the last attended response column of any of its rows
(responses are right-padded) — padding inside that span counts, since the pass computes it. It is
at least verl's count (the attended tokens of the rows, computed without padding there), and
equal to it for rows of one length. A packed group (``models.packing``) computes less than its
padded rows, so the bound holds for it too. Agent rows with several segments are counted as laid
out in the batch.

Rows are grouped by length: the units (rows, or whole prompt groups, see ``split_rows``) are sorted
longest first and filled greedily into micro-batches while both bounds hold; inside a micro-batch
the rows keep the order they were given in, so a batch that fits in one micro-batch runs exactly as
it did without a budget.
"""

from __future__ import annotations

import torch

DEFAULT_MAX_TOKENS = 16384
"""The token budget when neither ``micro_batch_size`` nor ``max_tokens_per_micro_batch`` is set:
TRL's default micro-batch (``per_device_train_batch_size=8`` rows) at 2048-token rows."""


def token_budget(micro_batch_size: int | None, max_tokens_per_micro_batch: int | str | None) -> int | None:
    """The token budget the config sets: ``max_tokens_per_micro_batch`` when a number; None for
    'auto' (the memory decides: ``models.memory.MemoryPlan.token_budget``); else
    ``DEFAULT_MAX_TOKENS`` when ``micro_batch_size`` is None too; else None (rows alone bound a
    micro-batch, as TRL's ``per_device_train_batch_size``)."""
    if max_tokens_per_micro_batch == "auto":
        return None
    if isinstance(max_tokens_per_micro_batch, int):
        return max_tokens_per_micro_batch
    return DEFAULT_MAX_TOKENS if micro_batch_size is None else None


def row_spans(attention_mask: torch.Tensor, response_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(lead, tail)``, (B,) CPU integer tensors: per row, the prompt columns from its first attended
    column to the end of the prompt region, and the response columns up to its last attended one."""
    mask = attention_mask.bool().cpu()
    P = mask.shape[1] - response_len
    first = mask.long().argmax(1)
    lead = torch.where(mask.any(1), (P - first).clamp(min=0), 0)
    response = mask[:, P:]
    tail = torch.where(response.any(1), response_len - response.flip(1).long().argmax(1), 0)
    return lead, tail


def padded_tokens(lead: torch.Tensor, tail: torch.Tensor, rows: torch.Tensor, prompt_region: bool = True) -> int:
    """Positions an unpacked forward pass over ``rows`` computes (``row_spans``' ``lead`` and ``tail``;
    ``prompt_region``: the batch has prompt columns, of which the pass keeps at least one)."""
    if not len(rows):
        return 0
    return len(rows) * _width(int(lead[rows].max()), int(tail[rows].max()), prompt_region)


def _width(lead: int, tail: int, prompt_region: bool) -> int:
    return max(lead, 1 if prompt_region else 0) + max(tail, 1)


def split_rows(
    rows: torch.Tensor,
    lead: torch.Tensor | None,
    tail: torch.Tensor | None,
    *,
    max_rows: int | None = None,
    max_tokens: int | None = None,
    groups: torch.Tensor | None = None,
    prompt_region: bool = True,
) -> list[torch.Tensor]:
    """``rows`` (indices into a batch) in micro-batches of at most ``max_rows`` rows and
    ``max_tokens`` tokens (``padded_tokens``; ``lead``, ``tail``: ``row_spans`` of the whole batch).

    Without ``max_tokens``: consecutive slices of ``max_rows`` rows (all rows when None), as the
    row-counted micro-batches always were (``lead`` and ``tail`` unread: None will do). With it: units
    sorted by their longest row (longest first, ties in the given order) fill micro-batches greedily;
    a micro-batch is closed when the next unit would break a bound. A unit is a row, or with
    ``groups`` ((B,) the prompt of each row, when the caller keeps a prompt's group together for
    packing) the rows of one prompt — kept whole when they fit both bounds on their own, else split
    into rows. A single row longer than ``max_tokens`` is a
    micro-batch of its own. Each micro-batch lists its rows in the order of ``rows``."""
    rows = rows.cpu()
    if not len(rows):
        return []
    if max_tokens is None:
        return list(rows.split(max_rows or len(rows)))
    if lead is None or tail is None:
        raise ValueError("split_rows: max_tokens needs the batch's lead and tail (row_spans)")
    lead, tail = lead.cpu(), tail.cpu()
    row_lead, row_tail = lead[rows].tolist(), tail[rows].tolist()
    units: list[list[int]] = [[i] for i in range(len(rows))]  # positions in ``rows``
    if groups is not None:
        by_group: dict[int, list[int]] = {}
        for i, g in enumerate(groups.cpu()[rows].tolist()):
            by_group.setdefault(g, []).append(i)
        units = []
        for members in by_group.values():
            fits = (max_rows is None or len(members) <= max_rows) and len(members) * _width(
                max(row_lead[i] for i in members), max(row_tail[i] for i in members), prompt_region
            ) <= max_tokens
            units.extend([members] if fits else [[i] for i in members])
    units.sort(key=lambda u: -max(row_lead[i] + row_tail[i] for i in u))  # stable: ties keep their order
    chunks: list[list[int]] = []
    current: list[int] = []
    n, most_lead, most_tail = 0, 0, 0
    for unit in units:
        u_lead, u_tail = max(row_lead[i] for i in unit), max(row_tail[i] for i in unit)
        new_n, new_lead, new_tail = n + len(unit), max(most_lead, u_lead), max(most_tail, u_tail)
        over = new_n * _width(new_lead, new_tail, prompt_region) > max_tokens or (
            max_rows is not None and new_n > max_rows
        )
        if current and over:
            chunks.append(current)
            current, n, new_n, new_lead, new_tail = [], 0, len(unit), u_lead, u_tail
        current, n, most_lead, most_tail = current + unit, new_n, new_lead, new_tail
    chunks.append(current)
    return [rows[sorted(c)] for c in chunks]
