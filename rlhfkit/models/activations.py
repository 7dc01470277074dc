"""What a forward pass with gradient keeps for backward, measured, and activation checkpointing
switched per pass.

**The measurement** (``measure_activation_cost``). A probe runs the trainer's own forward pass with
gradient on one synthetic row at a few lengths, with every decoder layer checkpointed and without, and
counts the bytes autograd keeps: every tensor saved for backward (``torch.autograd.graph.
saved_tensors_hooks``; each storage once, parameters left out); a checkpointed layer's inputs, which it
keeps to recompute itself, are among them (torch's non-reentrant checkpoint saves them for backward,
outside the layer). The counts are exact for
the model, the attention implementation, the dtype, autocast and the LM head mode the run uses (on a
CPU as on a GPU), and cost a few short passes. Per row of ``w`` tokens the kept bytes are fitted as
``a + b w + c w^2`` (``c``: attention that keeps ``w x w`` scores, eager; 0 for SDPA and flash), so a
micro-batch of ``r`` rows of width ``w`` keeps ``a + r (b w + c w^2)`` (``ActivationCost``).

**The switch** (``checkpointing``). transformers' decoder layers (``GradientCheckpointingLayer``)
recompute themselves in backward when their ``gradient_checkpointing`` flag is set and a checkpoint
function is installed (``enable_activation_checkpointing``: non-reentrant ``torch.utils.checkpoint``,
so FSDP2's hooks stay outside the checkpoint and LoRA's frozen inputs need no gradient). The flag is
read at each call, so one pass can checkpoint and the next not: the same weights and gradients either
way, up to float rounding (the recompute runs the same kernels on the same inputs)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers.modeling_layers import GradientCheckpointingLayer

PROBE_LENGTHS = (16, 32, 64)
"""The row lengths the probe runs (three, so the quadratic term of eager attention is fitted too)."""


def checkpointable_layers(model: torch.nn.Module) -> list[GradientCheckpointingLayer]:
    """The layers of ``model`` that checkpoint themselves when their flag is set: transformers'
    ``GradientCheckpointingLayer`` modules it installed a checkpoint function on
    (``enable_activation_checkpointing``)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [
        m
        for m in model.modules()
        if isinstance(m, GradientCheckpointingLayer) and getattr(m, "_gradient_checkpointing_func", None) is not None
    ]


def probe_ids(model: torch.nn.Module, n: int, device=None) -> torch.Tensor:
    """(1, n) token ids for a probe pass: 0, 1, 2, ... below the vocabulary size of ``model`` (or of the
    first config among its modules: a wrapped backbone's)."""
    sizes = (getattr(getattr(m, "config", None), "vocab_size", None) for m in model.modules())
    vocab = next((v for v in sizes if isinstance(v, int)), 2)
    return (torch.arange(n, device=device) % max(vocab - 1, 1)).unsqueeze(0)


def decoder_layer_count(model: torch.nn.Module) -> int:
    """The decoder layers of ``model`` (its first config's ``num_hidden_layers``, a wrapped
    backbone's too); 1 when none says."""
    for m in model.modules():
        n = getattr(getattr(m, "config", None), "num_hidden_layers", None)
        if isinstance(n, int) and n > 0:
            return n
    return 1


@contextmanager
def checkpointing(layers: Sequence[GradientCheckpointingLayer], on: bool):
    """Every layer of ``layers`` (``checkpointable_layers``) checkpointed (``on``) or not for the
    passes run inside; the flags are restored after."""
    before = [m.gradient_checkpointing for m in layers]
    for m in layers:
        m.gradient_checkpointing = on
    try:
        yield
    finally:
        for m, flag in zip(layers, before):
            m.gradient_checkpointing = flag


@dataclass(frozen=True)
class ActivationCost:
    """Bytes a forward pass with gradient keeps for backward, per micro-batch of ``rows`` rows of
    ``width`` tokens: ``a + rows (b width + c width^2)`` with ``off`` = (a, b, c) measured without
    checkpointing and ``on`` with every one of the ``layers`` checkpointed (None: not measured)."""

    off: tuple[float, float, float]
    on: tuple[float, float, float] | None
    layers: int

    def kept(self, rows: int, width: int, checkpointed: bool) -> float:
        a, b, c = self.on if checkpointed and self.on is not None else self.off
        return a + rows * (b * width + c * width * width)

    def peak(self, rows: int, width: int, checkpointed: bool) -> float:
        """``kept``, plus with checkpointing the one layer whose activations backward recomputes at a
        time (``(off - on) / layers`` of the micro-batch)."""
        kept = self.kept(rows, width, checkpointed)
        if checkpointed and self.on is not None:
            kept += max(self.kept(rows, width, False) - kept, 0.0) / max(self.layers, 1)
        return kept

    def max_tokens(self, free: float, width: int, checkpointed: bool) -> int:
        """The most tokens (rows of ``width``) whose ``peak`` fits in ``free`` bytes."""
        per_row = self.peak(2, width, checkpointed) - self.peak(1, width, checkpointed)
        fixed = self.peak(1, width, checkpointed) - per_row
        if per_row <= 0:
            return 1 << 40
        return max(int((free - fixed) / per_row), 0) * width

    def per_layer_per_token(self, checkpointed: bool = False) -> float:
        """Bytes per token per layer (the linear term; what ``benchmarks/scale.py`` compares)."""
        coefs = self.on if checkpointed and self.on is not None else self.off
        return coefs[1] / max(self.layers, 1)


def kept_bytes(forward: Callable[[], torch.Tensor]) -> tuple[int, torch.Tensor]:
    """``(bytes, output)``: the bytes the autograd graph of ``forward()`` keeps for backward (each
    storage once, parameters left out), and ``forward``'s output (keep it alive as long as the graph is
    needed)."""
    kept = _Kept()
    with torch.autograd.graph.saved_tensors_hooks(kept.pack, lambda t: t):
        out = forward()
    return kept.total, out


class _Kept:
    """Counts the storages autograd keeps (each once; parameters are not activations)."""

    def __init__(self):
        self.storages: dict[int, int] = {}

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        if not isinstance(t, torch.nn.Parameter):
            try:
                storage = t.untyped_storage()
                self.storages.setdefault(storage.data_ptr(), storage.nbytes())
            except (RuntimeError, NotImplementedError):  # a tensor subclass without a storage of its own
                self.storages.setdefault(id(t), t.numel() * t.element_size())
        return t

    @property
    def total(self) -> int:
        return sum(self.storages.values())


def _fit(lengths: Sequence[int], sizes: Sequence[float]) -> tuple[float, float, float]:
    """``(a, b, c)`` of ``a + b n + c n^2`` through three points (``c`` and ``b`` kept >= 0)."""
    (n1, n2, n3), (s1, s2, s3) = lengths, sizes
    d1, d2 = (s2 - s1) / (n2 - n1), (s3 - s2) / (n3 - n2)
    c = max((d2 - d1) / (n3 - n1), 0.0)
    b = max(d2 - c * (n3 + n2), 0.0)
    a = max(s3 - b * n3 - c * n3 * n3, 0.0)
    return a, b, c


def measure_activation_cost(
    forward: Callable[[int], torch.Tensor],
    modules: Iterable[torch.nn.Module],
    layers: Sequence[GradientCheckpointingLayer],
    with_checkpointing: bool,
    n_layers: int,
    lengths: Sequence[int] = PROBE_LENGTHS,
) -> ActivationCost:
    """The ``ActivationCost`` of ``forward(n)`` (one row of ``n`` tokens through the trainer's own
    forward pass with gradient, returning a scalar of its outputs), without checkpointing and, when
    ``with_checkpointing``, with every one of ``layers`` checkpointed. Each probe pass is then
    backpropagated (a zero loss) and the gradients of ``modules`` cleared, so wrappers whose backward
    is a collective (DDP, FSDP2) see whole iterations: every process must call this alike.
    ``n_layers``: the model's decoder layers (``ActivationCost.layers``)."""
    modules = list(modules)
    fits = {}
    for on in (False, True) if with_checkpointing and layers else (False,):
        sizes = []
        for n in lengths:
            with checkpointing(layers, on):
                size, out = kept_bytes(functools.partial(forward, n))
                sizes.append(size)
                (out * 0).backward()
            del out
            for m in modules:
                m.zero_grad(set_to_none=True)
        fits[on] = _fit(lengths, sizes)
    return ActivationCost(fits[False], fits.get(True), max(n_layers, 1))
