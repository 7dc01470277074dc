"""Pieces every trainer shares: seeding, the learning-rate schedule, and the optimizer step."""

from __future__ import annotations

import math
import random
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager

import numpy as np
import torch

from ..config import SCHEDULERS
from . import trace


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's global generators."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def make_scheduler(optimizer, kind: str, warmup_steps: int, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """``LambdaLR`` whose factor after ``s`` applied updates (skipped steps do not count: see
    ``optimizer_step``) is ``(s+1)/(w+1)`` during warmup ``w``, then 1 (constant), ``1 - p``
    (linear) or ``0.5 (1 + cos(π p))`` (cosine, Loshchilov & Hutter 2017) with
    ``p = (s - w) / (total - w)`` clipped to 1.

    ``hf_constant``, ``hf_linear``, ``hf_cosine`` follow transformers' ``get_scheduler`` exactly
    (``constant_with_warmup``, ``linear``, ``cosine``; what the TRL drop-ins select): ``s / w``
    during warmup (the first update runs at learning rate 0), then 1, ``max(0, (total - s) /
    max(1, total - w))`` or ``max(0, 0.5 (1 + cos(π p)))`` with ``p = (s - w) / max(1, total - w)``."""
    if kind not in SCHEDULERS:
        raise ValueError(f"lr_scheduler must be one of {', '.join(SCHEDULERS)}, got {kind!r}")
    build = _hf_factor if kind.startswith("hf_") else _factor
    return torch.optim.lr_scheduler.LambdaLR(optimizer, build(kind, warmup_steps, total_steps))


def _hf_factor(kind: str, warmup_steps: int, total_steps: int) -> Callable[[int], float]:
    """The factor of the ``hf_*`` schedules, transformers' (``make_scheduler``)."""

    def hf_factor(step: int) -> float:
        if step < warmup_steps:
            return step / max(1, warmup_steps)
        if kind == "hf_linear":
            return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))
        if kind == "hf_cosine":
            progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
            return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
        return 1.0

    return hf_factor


def _factor(kind: str, warmup_steps: int, total_steps: int) -> Callable[[int], float]:
    """The factor of rlhfkit's own schedules (``make_scheduler``)."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        if kind == "linear":
            return 1.0 - progress
        if kind == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        return 1.0

    return factor


class NonFiniteGuard:
    """The numerical guard every trainer steps through: an optimizer step whose gradient norm (or
    loss) is not finite — NaN or ±inf anywhere in the gradients makes the global norm so — is
    skipped: the weights, AdamW's moments and the learning-rate schedule stay as they were (warm-up
    and decay count applied updates, as DeepSpeed's and Megatron's loss scalers do on an overflow;
    a run with k skips ends its decay k steps short of the end), and the skip is counted
    (``perf/skipped_steps``) and reported in one line on stderr. ``limit`` skips in a row stop the
    run with one clear error: the model or the data produce non-finite numbers every time, and
    nothing non-finite reaches the weights.

    An update can also overflow with a finite gradient (a huge learning rate, float16 weights):
    ``check_weights`` looks at the updated weights once per applied step and stops the run in one
    line when any is NaN or ±inf. It stops rather than undoing the step: undoing needs a copy of
    every trained weight and AdamW moment at every step (three times the trained parameters' memory
    and a copy per step) to save a run whose settings will overflow again. Nothing non-finite is
    saved (the saves check too) and earlier checkpoints stay intact.

    The gradient norm is global (FSDP2's and DDP's are reduced over processes) and the weight check
    is all-reduced, so every process makes the same decision."""

    def __init__(self, limit: int):
        self.limit, self.skipped, self.in_a_row = limit, 0, 0

    def allow(self, grad_norm: torch.Tensor, loss: torch.Tensor | None = None) -> bool:
        values = grad_norm.detach().float().reshape(1)
        if loss is not None:
            values = torch.cat([values, loss.detach().float().reshape(-1).to(values.device)])
        if bool(torch.isfinite(values).all()):  # one device synchronisation
            self.in_a_row = 0
            return True
        self.skipped, self.in_a_row = self.skipped + 1, self.in_a_row + 1
        from .. import distributed

        bad_loss = not bool(torch.isfinite(values[1:]).all())  # the loss first: the cause, when it is
        what, shown = ("loss", float(values[1:].sum())) if bad_loss else ("gradient norm", float(values[0]))
        if self.in_a_row >= self.limit:
            raise ValueError(
                f"stopping: the {what} was not finite in {self.in_a_row} optimizer steps in a row "
                f"(max_consecutive_skips={self.limit}); the weights keep their last finite values. "
                "Check the data, the rewards and the learning rate, or use float32"
            )
        if distributed.is_main():
            print(
                f"warning: optimizer step skipped: the {what} is {shown} ({self.skipped} skipped so far, "
                f"{self.in_a_row} in a row)",
                file=sys.stderr,
                flush=True,
            )
        return False

    def check_weights(self, params, lr: float) -> None:
        """Raise one line when any of ``params`` (this process's shards under FSDP2) holds NaN or
        ±inf after an update, one all-reduce. Each tensor's 2-norm flags it (NaN and ±inf propagate;
        on the CPU it is ~10x faster than the largest |w|, ~0.15 s a step for 135M weights); a flagged
        tensor is then checked element by element, so a finite tensor whose norm overflows is not
        taken for a broken one."""
        from .. import distributed

        local = [p.to_local() if hasattr(p, "to_local") else p for p in params]
        groups: dict = {}
        for t in local:
            if t.numel():
                groups.setdefault((t.dtype, t.device), []).append(t.detach())
        bad = torch.zeros((), dtype=torch.long)
        for tensors in groups.values():
            flagged = (~torch.isfinite(torch.stack(torch._foreach_norm(tensors)))).nonzero().flatten().tolist()
            bad = bad + sum(int(not bool(torch.isfinite(tensors[i]).all())) for i in flagged)
        if int(distributed.reduce_sum(bad)):
            dtypes = sorted({str(t.dtype).removeprefix("torch.") for t in local})
            advice = "lower learning_rate" + ("" if dtypes == ["float32"] else ", or use dtype=float32")
            raise ValueError(
                f"stopping: the weights became non-finite (NaN or inf) in an optimizer step with a finite "
                f"gradient (learning rate {lr:g}, weights in {', '.join(dtypes)}): the update overflowed. "
                f"Nothing non-finite is saved; {advice}"
            )


def optimizer_step(
    optimizer,
    scheduler,
    max_grad_norm: float | None,
    guard: NonFiniteGuard | None = None,
    loss: torch.Tensor | None = None,
) -> tuple[torch.Tensor, float]:
    """Clip the global gradient norm (None: no clipping, norm still measured), step the optimizer
    and the schedule (neither when ``guard`` refuses a non-finite gradient norm or ``loss``: the
    schedule counts applied updates), check the updated weights (``guard.check_weights``), clear
    gradients. Returns ``(grad_norm, learning rate used)`` (a skipped step: the rate it would have used)."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm if max_grad_norm is not None else float("inf"))
    if hasattr(grad_norm, "full_tensor"):  # FSDP2: a DTensor holding the global norm
        grad_norm = grad_norm.full_tensor()
    lr = scheduler.get_last_lr()[0]
    if guard is None or guard.allow(grad_norm, loss):
        optimizer.step()
        scheduler.step()
        if guard is not None:
            guard.check_weights(params, lr)
    optimizer.zero_grad(set_to_none=True)
    return grad_norm.detach(), lr


def epoch_order(seed: int, epoch: int, n: int) -> list[int]:
    """The data order of ``epoch``: a permutation of ``range(n)`` fixed by (seed, epoch), so a
    resumed run continues the same order from its saved position."""
    gen = torch.Generator().manual_seed(seed * 100003 + epoch)
    return torch.randperm(n, generator=gen).tolist()


def make_optimizer(params, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW (Loshchilov & Hutter 2019). The fused kernel updates every parameter in one pass without
    the per-step copies of the foreach path (lower peak memory, faster on CPU); it needs float
    parameters on the CPU or a GPU, else the default path is used. ``params``: tensors or groups."""
    params = list(params)
    tensors = [p for g in params for p in (g["params"] if isinstance(g, dict) else [g])]
    fused = bool(tensors) and all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in tensors)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=fused)


@contextmanager
def timer(timings: dict, name: str):
    """Wall time of the block added to ``timings[name]`` (seconds; a block timed twice in one
    ``timings``, as the rounds of dynamic sampling, counts its total), and the block as one event
    ``name`` of the step timeline when the run records one (``run/trace.py``)."""
    start = time.perf_counter()
    yield
    end = time.perf_counter()
    timings[name] = timings.get(name, 0.0) + end - start
    trace.record(name, start, end)
