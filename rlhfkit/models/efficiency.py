"""Efficiency counters of an RL step: token positions the forward passes computed against the
minimum the step needs, per pass, machine-independent (``perf/*``).

Three passes are counted:

- ``generate``: the positions a rollout engine ran through the model — the prompt prefill (per
  row, or per distinct prompt when its cache is shared) and ``B`` positions per later decode step,
  finished rows and padding included. *Needed*: each distinct prompt's real tokens once, and each
  completion's real tokens but its last (nothing is sampled after it).
- ``logprob``: the no-gradient passes before the update (old log-probs, reference log-probs).
  *Needed*, per pass run: each distinct prompt's real tokens once and each row's real tokens after
  the prompt but its last once (the last token's logits predict nothing the loss reads).
- ``update``: the forward passes of the update's micro-batches (each is also a backward pass over
  the same positions). *Needed*, per pass over the batch (``num_iterations``): as ``logprob``, the
  prompt once per distinct prompt of each minibatch, over the rows whose loss has a gradient (the
  rows ``rl.update.zero_gradient_rows`` leaves out are not needed).

*Computed* is the width of what is fed to the model: ``rows x columns`` of a padded batch (after
``forward_response`` trims the columns no row attends), or of the packed groups when the prompt is
shared (``models.packing``). It is counted where the model is called
(``policy.forward_response``, ``rollout.hf.HFEngine``) for the pass named by the enclosing
``counting`` block; nothing is counted outside one (evaluation, generator ranks of an
asynchronous run). A separate critic's passes (``critic='separate'``) are not counted.

The counts live in a ``Counters`` object the step owns: the RL loop makes one per step and runs the
step inside its ``counted()`` block, so the model calls of that step (on its thread) add to it;
outside any step they go to a default one (``reset``, ``step_metrics``: tests and benchmarks).
Counts are Python integers from shapes (computed) and device tensors from masks (needed): no
synchronisation until ``Counters.metrics``, which sums them over the processes of the role in one
all-reduce and returns ``perf/tokens_computed_<pass>``, ``perf/tokens_needed_<pass>`` and
``perf/<pass>_efficiency`` = needed / computed (for the passes that ran).
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar

import torch

PASSES = ("generate", "logprob", "update")


class Counters:
    """One step's counts: ``computed`` and ``needed`` per pass, and the passes being counted now
    (innermost last). The RL loop makes one per step and counts inside ``counters.counted()``; the
    model calls add to the counters of the step they run in (``add_computed``, ``add_needed``)."""

    def __init__(self):
        self.passes: list[str] = []
        self.computed: dict[str, int] = dict.fromkeys(PASSES, 0)
        self.needed: dict[str, torch.Tensor | int] = dict.fromkeys(PASSES, 0)

    @contextmanager
    def counted(self):
        """Inside the block, the model calls count into these counters (on this thread)."""
        token = _STEP.set(self)
        try:
            yield self
        finally:
            _STEP.reset(token)

    def reset(self) -> None:
        """Zero every count."""
        for p in PASSES:
            self.computed[p], self.needed[p] = 0, 0

    def metrics(self, reduce_sum=None) -> dict[str, float]:
        """The counts summed over the processes (``reduce_sum``: a tensor's sum over them), as
        ``perf/*`` metrics; then zeroed. One synchronisation."""
        device = next((x.device for x in self.needed.values() if isinstance(x, torch.Tensor)), torch.device("cpu"))
        needed = [torch.as_tensor(self.needed[p], device=device).to(torch.float64) for p in PASSES]
        computed = torch.tensor([float(self.computed[p]) for p in PASSES], dtype=torch.float64, device=device)
        counts = torch.cat([computed, torch.stack(needed)])
        if reduce_sum is not None:
            counts = reduce_sum(counts)
        values: list[float] = counts.tolist()
        self.reset()
        out: dict[str, float] = {}
        for i, p in enumerate(PASSES):
            made, used = values[i], values[len(PASSES) + i]
            out[f"perf/tokens_computed_{p}"], out[f"perf/tokens_needed_{p}"] = made, used
            if made > 0:
                out[f"perf/{p}_efficiency"] = used / made
        return out


# Outside a step's ``counted`` block the model calls count into these (tests, benchmarks).
_DEFAULT = Counters()
_STEP: ContextVar[Counters | None] = ContextVar("rlhfkit_step_counters", default=None)
_computed, _needed = _DEFAULT.computed, _DEFAULT.needed  # read by tests of the default counters


def current() -> Counters:
    """The counters the model calls add to: the step's being counted on this thread, else the default."""
    return _STEP.get() or _DEFAULT


def reset() -> None:
    """Zero the current counters."""
    current().reset()


@contextmanager
def counting(pass_name: str):
    """Positions computed inside the block count toward ``pass_name``."""
    if pass_name not in PASSES:
        raise ValueError(f"unknown pass {pass_name!r}: one of {PASSES}")
    counters = current()
    counters.passes.append(pass_name)
    try:
        yield
    finally:
        counters.passes.pop()


def active() -> str | None:
    """The pass being counted (None: nothing is)."""
    passes = current().passes
    return passes[-1] if passes else None


def add_computed(positions: int) -> None:
    """``positions`` token positions run through the model in the current pass (none: not counted)."""
    counters = current()
    if counters.passes:
        counters.computed[counters.passes[-1]] += int(positions)


def add_needed(pass_name: str, tokens) -> None:
    """The minimum of one pass over some rows (``needed_tokens``), added to ``pass_name``."""
    counters = current()
    counters.needed[pass_name] = counters.needed[pass_name] + tokens


def needed(prompt_tokens: torch.Tensor, completion_tokens: torch.Tensor) -> torch.Tensor:
    """The one rule of what a pass needs: each distinct prompt's real tokens once
    (``prompt_tokens``: one count per distinct prompt) and each completion's real tokens but its
    last (``completion_tokens``: one count per row; nothing is read after the last). A 0-d tensor."""
    return prompt_tokens.sum() + (completion_tokens - 1).clamp(min=0).sum()


def needed_tokens(rollout, rows: torch.Tensor | None = None) -> torch.Tensor:
    """Real tokens of ``rows`` of ``rollout`` (all rows when None) one pass needs: each distinct
    prompt's (``prompt_index``) once, each row's tokens after the prompt but its last once. A 0-d
    tensor."""
    mask = rollout.attention_mask
    P = mask.shape[1] - rollout.response_mask.shape[1]
    if rows is not None:
        rows = rows.to(mask.device)
        mask = mask[rows]
    prompt, completion = mask[:, :P].sum(-1), mask[:, P:].sum(-1)
    index = rollout.prompt_index
    if index is None:
        return needed(prompt, completion)
    index = index.to(mask.device) if rows is None else index.to(mask.device)[rows]
    # Rows of one prompt hold the same prompt tokens: the largest count per prompt. The indices of a
    # slice of a larger rollout (another process's rows, a minibatch) need not be below its row count:
    # renumbered to 0 .. distinct - 1 first.
    _, index = torch.unique(index, return_inverse=True)
    per_prompt = torch.zeros(len(index), dtype=prompt.dtype, device=mask.device).scatter_reduce(
        0, index, prompt, "amax"
    )
    return needed(per_prompt, completion)


def step_metrics(reduce_sum=None) -> dict[str, float]:
    """The current counters' ``metrics`` (summed over the processes by ``reduce_sum``); then zeroed."""
    return current().metrics(reduce_sum)
