"""Phase 6's batch structure (``rl/update.py:update``): the minibatches of an update, drawn from the
global batch alike on every process, each minibatch's rows on this process, their micro-batches,
and the loss denominator they share over the processes (``plan_minibatch``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from .. import distributed
from ..config.parts import ConfigFields, takes
from ..models import efficiency
from ..models.micro_batches import row_spans, split_rows
from .experience import Experience


@takes("mini_batch_size", "micro_batch_size", "seed", "share_prompt")
class MinibatchSplit(ConfigFields):
    """The fields of ``RLConfig`` that split an update's batch: the rows of a minibatch, of a
    micro-batch, the seed of the minibatch order, whether micro-batches keep a prompt's group together."""


@dataclass(frozen=True)
class Minibatch:
    """One minibatch (one optimizer step) as this process runs it.

    ``chunks``: this process's micro-batches (rows of the experience); ``weight``: the loss
    denominator of the whole minibatch over every process (``loss_weights`` summed; for
    micro-batch-token-mean the micro-batches of every process), at least 1; ``ran``: some process
    runs a row with a token; ``passes``: the most micro-batches any process holds — every process
    runs that many forward and backward passes (collectives under FSDP2), short ones zero-weight
    fillers; ``micro_steps``: the micro-batches of every process divided by the processes (TRL's
    ``gradient_accumulation_steps``, which its micro-batch entropy term divides by)."""

    chunks: list[torch.Tensor]
    weight: torch.Tensor
    ran: bool
    passes: int
    micro_steps: float


def minibatch_generator(seed: int, step: int) -> torch.Generator:
    """The generator of this step's minibatch order: the same on every process, fixed by the run's
    ``seed`` and ``step`` so a resumed run draws the same order and the rollout's RNG is untouched."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


def minibatch_rows(rows: int, mini_batch_size: int | None, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """One pass over the batch: each minibatch's rows on this process (indices into its ``rows``
    rows). Minibatches of ``mini_batch_size`` rows (None: the whole batch) are drawn from the *global*
    batch (every process's rows, in process order) by one permutation that every process draws
    alike (``generator``), so one update gives the same weights on any number of processes."""
    world = distributed.role_size()
    first = distributed.role_rank() * rows  # this process's rows are global rows first .. first + rows - 1
    for global_rows in torch.randperm(rows * world, generator=generator).split(mini_batch_size or rows * world):
        yield global_rows[(global_rows >= first) & (global_rows < first + rows)] - first


def group_by_prompt(exp: Experience, rows: torch.Tensor, *, share_prompt: bool) -> torch.Tensor:
    """With ``share_prompt``, a minibatch's rows ordered by prompt, so micro-batches hold whole
    groups that pack into one row each (gradient accumulation over a minibatch does not depend on
    the order); else ``rows`` as they are."""
    index = exp.rollout.prompt_index
    if not share_prompt or index is None:
        return rows
    return rows[torch.sort(index[rows.to(index.device)].cpu(), stable=True).indices]


def loss_weights(mask: torch.Tensor, loss_agg: str, rows: torch.Tensor | None = None) -> torch.Tensor:
    """The share of a micro-batch in its minibatch's loss: tokens for ``loss_agg`` token-mean, 1 for
    micro-batch-token-mean (``update`` divides by the step's micro-batches), else rows — ``rows``
    (B,) bool when given (``Experience.counted_rows``), else those with a token."""
    if loss_agg == "token-mean":
        return mask.sum().float()
    if loss_agg == "micro-batch-token-mean":
        return torch.ones(())
    return (rows if rows is not None else mask.sum(-1) > 0).sum().float()


def micro_batch_split(
    args: MinibatchSplit, exp: Experience, budget: int | None
) -> Callable[[torch.Tensor], list[torch.Tensor]]:
    """The micro-batches of a minibatch's rows (``models.micro_batches.split_rows``): at most
    ``micro_batch_size`` rows and ``budget`` tokens (``RLModels.token_budget``: the one of
    ``max_tokens_per_micro_batch``, capped by what fits in memory), a prompt's group kept whole with
    ``share_prompt`` when it fits. Without a budget, consecutive slices of ``micro_batch_size`` rows
    (the whole minibatch when None)."""
    if budget is None:  # no token bound: the rows' spans are not needed
        return lambda rows: split_rows(rows, None, None, max_rows=args.micro_batch_size)
    rollout = exp.rollout
    T = rollout.response_mask.shape[1]
    lead, tail = row_spans(rollout.attention_mask, T)
    groups = rollout.prompt_index if args.share_prompt else None
    prompt_region = rollout.attention_mask.shape[1] > T
    return lambda rows: split_rows(
        rows, lead, tail, max_rows=args.micro_batch_size, max_tokens=budget, groups=groups, prompt_region=prompt_region
    )


def plan_minibatch(
    args: MinibatchSplit,
    exp: Experience,
    rows: torch.Tensor,
    loss_agg: str,
    skip: torch.Tensor | None,
    split: Callable[[torch.Tensor], list[torch.Tensor]],
) -> Minibatch:
    """This process's part of one minibatch (``rows``, from ``minibatch_rows``): ordered by prompt
    (``group_by_prompt``), without the ``skip`` rows (``update.zero_gradient_rows``, which keep their
    share of the denominator ``loss_weights``), split into micro-batches (``split``:
    ``micro_batch_split``). The denominator, the tokens that run and the micro-batches are summed over
    the processes in one collective, the most micro-batches of a process in another."""
    rows = group_by_prompt(exp, rows, share_prompt=args.share_prompt)
    counted = exp.counted_rows[rows] if exp.counted_rows is not None else None
    weight = loss_weights(exp.mask[rows], loss_agg, counted)
    if skip is not None:
        rows = rows[~skip.cpu()[rows]]
    if len(rows):
        efficiency.add_needed("update", efficiency.needed_tokens(exp.rollout, rows))
    chunks = split(rows)
    tokens = exp.mask[rows].sum().to(weight.device).float()
    total = distributed.reduce_sum(torch.stack([weight, tokens, weight.new_tensor(float(len(chunks)))]))
    _, all_tokens, all_chunks = total.tolist()  # one read of the sums
    return Minibatch(
        chunks,
        weight=(total[2] if loss_agg == "micro-batch-token-mean" else total[0]).clamp(min=1),
        ran=all_tokens > 0,
        passes=max(distributed.reduce_max(len(chunks)), 1),
        micro_steps=all_chunks / distributed.role_size(),
    )
