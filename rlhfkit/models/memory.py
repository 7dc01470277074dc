"""The memory a run may still use, and the activation policy that keeps it there
(``gradient_checkpointing: off | on | auto``, ``memory_budget_gb``).

**Free memory** (``free_bytes``) is what the process may still allocate on its device, less what the
training state will take that does not exist yet (``MemoryPlan.pending``: gradients before the first
backward, AdamW's two moments before the first step). On CUDA: the driver's free memory plus what
torch's caching allocator holds unused (a colocated vLLM engine's share is not free), capped by
``torch.cuda.set_per_process_memory_fraction`` and ``memory_budget_gb``, minus what is allocated. On a
CPU: the kernel's ``MemAvailable`` (and a cgroup's ``memory.max``, in a container) plus the process's
anonymous resident memory (``resident_bytes``), capped by ``memory_budget_gb``, minus that memory. Other
devices report nothing to plan with: only ``memory_budget_gb`` bounds them, and without it ``auto`` does
not checkpoint.

**The policy** (``MemoryPlan``). ``off``: never checkpoint; ``on``: checkpoint every decoder layer in
every pass with gradient; ``auto``: per micro-batch, checkpoint when the measured activations
(``activations.ActivationCost``) of that micro-batch without checkpointing would not fit in
``SAFETY`` of the free memory, so a run that fits keeps its speed. Under ``auto`` the micro-batches'
token budget is also capped to what fits with checkpointing (``token_budget``), and a single row that
cannot fit even then is refused before the first step (``check_row``). Under several processes a pass
checkpoints on every process when it would not fit on one: transformers before 5.24 checkpoint a layer's
``__call__``, FSDP2's hooks inside, so the recompute gathers the layer's parameters again — a collective
every process must run (5.24 checkpoints ``forward`` inside the hooks, where it would not matter)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

from .. import distributed
from .activations import ActivationCost, checkpointing

if TYPE_CHECKING:
    from transformers.modeling_layers import GradientCheckpointingLayer

SAFETY = 0.85
"""The share of the free memory activations may take: the rest is for what the measurement does not
count (gradient buffers of backward, allocator fragmentation, the loss's own small tensors)."""

GB = 1e9


def _meminfo_available() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float("inf")


def _cgroup_free() -> float:
    try:
        limit = open("/sys/fs/cgroup/memory.max").read().strip()
        used = float(open("/sys/fs/cgroup/memory.current").read().strip())
    except (OSError, ValueError):
        return float("inf")
    return float("inf") if limit == "max" else float(limit) - used


def resident_bytes() -> float:
    """This process's anonymous resident memory (``RssAnon`` of ``/proc/self/status``: what it allocated;
    pages of files it maps, a loaded safetensors file among them, are the page cache's, and ``MemAvailable``
    counts them as free), or its whole resident set where that line is missing; 0 where there is none to
    read."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return float(line.split()[1]) * 1024
        with open("/proc/self/statm") as f:
            return float(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0.0


def free_bytes(device: torch.device, budget_gb: float | None = None) -> float:
    """What this process may still allocate on ``device`` (module docstring), under ``budget_gb``."""
    budget = budget_gb * GB if budget_gb is not None else float("inf")
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        capacity = free + torch.cuda.memory_reserved(device)
        fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)
        if fraction is not None:
            capacity = min(capacity, fraction(device) * total)
        return min(capacity, budget) - torch.cuda.memory_allocated(device)
    if device.type == "cpu":
        rss = resident_bytes()
        return min(min(_meminfo_available(), _cgroup_free()) + rss, budget) - rss
    return budget


def state_bytes(p: torch.Tensor) -> int:
    """Bytes of this process's share of a parameter (a DTensor's local shard under FSDP2)."""
    local = p.to_local() if hasattr(p, "to_local") else p
    return local.numel() * local.element_size()


class MemoryPlan:
    """The activation policy of one trained model (module docstring).

    ``mode``: 'off', 'on' or 'auto'; ``cost``: the measured ``ActivationCost`` (None: not measured,
    with 'off' or 'on' and nothing to plan); ``layers``: the checkpointable layers
    (``activations.checkpointable_layers``); ``trained``: the trained modules (their pending
    gradients and AdamW moments count against the free memory). Set ``optimizer`` once it exists."""

    def __init__(
        self,
        mode: str | bool,
        cost: ActivationCost | None,
        device: torch.device,
        budget_gb: float | None,
        layers: list[GradientCheckpointingLayer],
        trained: Iterable[torch.nn.Module],
    ):
        if isinstance(mode, bool):  # TRL's form
            mode = "on" if mode else "off"
        self.mode, self.cost, self.device, self.budget_gb, self.layers = mode, cost, device, budget_gb, layers
        self.params = [p for m in trained for p in m.parameters() if p.requires_grad]
        self.optimizer: torch.optim.Optimizer | None = None
        self.passes = self.checkpointed = 0
        for m in layers:  # outside a pass_context (any pass not planned here): checkpointed only under 'on'
            m.gradient_checkpointing = mode == "on"

    def pending(self) -> float:
        """Bytes the training state will still take: each trainable parameter's gradient until it has
        one, AdamW's two moments until the optimizer holds them."""
        state: dict = self.optimizer.state if self.optimizer is not None else {}
        return float(sum(state_bytes(p) * (int(p.grad is None) + 2 * int(not state.get(p))) for p in self.params))

    def free(self) -> float:
        """The bytes activations may use now: ``free_bytes`` less ``pending``."""
        return free_bytes(self.device, self.budget_gb) - self.pending()

    def checkpoints(self, rows: int, width: int) -> bool:
        """Whether a pass with gradient over ``rows`` rows of ``width`` tokens checkpoints: the mode,
        or under 'auto' whether its activations without checkpointing would not fit — on any process
        (module docstring): every process calls this for each of its passes with gradient."""
        if self.mode != "auto" or self.cost is None or not self.layers:
            return self.mode == "on"
        need = self.cost.peak(rows, width, False) if rows else 0.0
        return bool(distributed.reduce_max(int(need > SAFETY * self.free())))

    def pass_context(self, rows: int, width: int):
        """The context of one pass with gradient: its layers checkpointed or not (``checkpoints``)."""
        on = self.checkpoints(rows, width)
        self.passes += 1
        self.checkpointed += on
        return checkpointing(self.layers, on)

    def token_budget(self, configured: int | None, width: int, by_memory: bool = False) -> int | None:
        """The micro-batch token budget in force for rows up to ``width`` tokens: ``configured`` (None:
        none), capped under 'auto', or set alone with ``by_memory`` (``max_tokens_per_micro_batch:
        auto``), by the tokens whose activations fit in the free memory with the policy's cheapest mode
        (``ActivationCost.max_tokens``); never below one row."""
        if self.cost is None or not (by_memory or self.mode == "auto"):
            return configured
        fits = max(self.cost.max_tokens(SAFETY * self.free(), width, self._cheapest()), width)
        return fits if configured is None else min(configured, fits)

    def _cheapest(self) -> bool:
        """Whether the policy's cheapest mode checkpoints."""
        return self.mode == "on" or (self.mode == "auto" and bool(self.layers))

    def check_row(self, width: int, what: str = "row") -> None:
        """Refuse, in one line naming the knobs, a single row of ``width`` tokens whose activations do
        not fit even with checkpointing (under 'auto'; 'on' and 'off' are the user's choice of
        mode, checked alike with it)."""
        if self.cost is None:
            return
        checkpointed = self._cheapest()
        need, free = self.cost.peak(1, width, checkpointed), SAFETY * self.free()
        if need <= free:
            return
        mode = "with every layer checkpointed" if checkpointed else "without activation checkpointing"
        hint = "gradient_checkpointing='auto' or 'on', " if not checkpointed else ""
        raise ValueError(
            f"one {what} of {width} tokens keeps {need / GB:.3g} GB of activations {mode}, but "
            f"{max(free, 0) / GB:.3g} GB are free for them on {self.device} "
            f"(memory_budget_gb={self.budget_gb}, after the weights, gradients and optimizer state): "
            f"use {hint}LoRA (peft_config), a shorter max_new_tokens or max_length, or a larger memory_budget_gb"
        )

    def metrics(self) -> dict[str, float]:
        """``perf/checkpointed_frac``: the share of the passes with gradient since the last call that
        checkpointed (counters reset)."""
        out = {"perf/checkpointed_frac": self.checkpointed / self.passes} if self.passes else {}
        self.passes = self.checkpointed = 0
        return out
