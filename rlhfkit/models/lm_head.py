"""The streamed LM head: a causal LM's forward pass that returns per-token log-probs (and entropies,
and the kept mass of top-k/top-p) computed from the last hidden states through the output layer in
chunks (``algorithms.linear_logprobs``), so no tensor of tokens × vocabulary exists, forward or
backward.

How: for the one model call, the output layer's ``forward`` is replaced (on that module instance,
under a lock, restored after) by one that takes the hidden states the model hands it, keeps the
rows the caller asked for, and returns their ``(N, 3)`` statistics in place of logits. The model's
own forward runs as always — its hooks too, so FSDP2 gathers a sharded head and LoRA layers run
— and its output's ``logits`` field carries the statistics, through which backward reaches the
hidden states and the head's weight.

That is right only where the model hands the head's output back untouched. Some do not: Gemma 2/3
soft-cap the logits (``tanh(z/c)·c``), Cohere scales them (``logit_scale``), Granite divides them
(``logits_scaling``). Rather than a list of such architectures, ``streamable`` asks the model once
(a one-token pass whose head returns a known tensor, compared with what comes out) and caches the
answer per model; a head that is not a plain ``nn.Linear`` (a LoRA-adapted head, a tied
embedding module) is not streamed either. The caller runs the unstreamed pass then: never silently
wrong.

The switch, the trainers' ``lm_head`` config field, is an argument of every pass that reads the head
(``streamable(model, lm_head)``, ``policy.forward_response(..., lm_head=...)``): ``"chunked"`` (the
default) streams wherever the model allows it; ``"full"`` always runs the model's own head and full
logits (the path before streaming, for comparison and for exotic heads).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import torch

from .. import distributed
from ..algorithms.linear_logprobs import linear_logprobs
from ..config.base import LM_HEADS

_PATCH_LOCK = threading.RLock()
# ``plain_head``'s answer for each model it has probed (its DDP wrapper unwrapped), held weakly: a model
# that is freed leaves the table
_PLAIN_HEADS: weakref.WeakKeyDictionary[torch.nn.Module, bool] = weakref.WeakKeyDictionary()


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside a DDP wrapper (whose attributes it does not forward)."""
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


def output_layer(model: torch.nn.Module) -> torch.nn.Linear | None:
    """The model's output layer when it is a plain ``nn.Linear`` (FSDP2's wrapped class included),
    else None (no head, a LoRA-adapted or otherwise replaced one)."""
    inner = _unwrapped(model)
    get = getattr(inner, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if not isinstance(head, torch.nn.Linear) or type(head).forward is not torch.nn.Linear.forward:
        return None
    return head


def streamable(model: torch.nn.Module, lm_head: str = "chunked") -> bool:
    """Whether ``model``'s log-prob passes stream its output layer under the ``lm_head`` mode
    (``"chunked"`` or ``"full"``, the trainers' config field): the mode is ``"chunked"``, the head a
    plain linear map, and the model hands the head's output back untouched (``plain_head``: asked once
    per model, by a one-token pass). The trainers call it once at setup, so the probe's pass runs then
    rather than inside the first training step; every process of a distributed run calls it alike."""
    if lm_head not in LM_HEADS:
        raise ValueError(f"lm_head must be one of {', '.join(LM_HEADS)}, got {lm_head!r}")
    return lm_head == "chunked" and plain_head(model)


def plain_head(model: torch.nn.Module) -> bool:
    """Whether ``model``'s output layer is a plain linear map whose output the model hands back untouched, whatever
    the ``lm_head`` mode: then its logits are ``h Wᵀ + b`` of the hidden states the head receives (asked once per
    model, by a one-token pass, and the answer kept; every process of a distributed run asks at the same call)."""
    inner = _unwrapped(model)
    head = output_layer(model)
    if head is None:
        return False
    plain = _PLAIN_HEADS.get(inner)
    if plain is None:
        plain = _PLAIN_HEADS[inner] = _probe(model, head)
    return plain


@torch.no_grad()
def _probe(model, head: torch.nn.Linear) -> bool:
    """Run one token through ``model`` with a head that returns a known tensor; the model is plain
    when its output's logits are that tensor, unchanged."""
    sentinel = {}

    def known(hidden):
        g = torch.Generator(device="cpu").manual_seed(0)
        values = torch.randn((*hidden.shape[:-1], head.out_features), generator=g).to(hidden.device, hidden.dtype)
        sentinel["value"] = values
        return values

    device = head.weight.device
    ids = torch.zeros((1, 1), dtype=torch.long, device=device)
    modes = {m: m.training for m in model.modules()}
    model.eval()  # no dropout: the probe draws no random number, so a resumed run stays the uninterrupted one
    try:
        with _patched(head, known):
            out = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False, logits_to_keep=1)
    finally:
        for m, training in modes.items():
            m.training = training
        distributed.reshard(model)  # as before the probe: FSDP2 keeps the root's gathered weights after a forward
    logits = getattr(out, "logits", None)
    value = sentinel.get("value")
    return (
        value is not None
        and isinstance(logits, torch.Tensor)
        and logits.shape == value.shape
        and torch.equal(logits.to(value.dtype), value)
    )


@contextmanager
def _patched(head: torch.nn.Module, forward: Callable):
    """``head.forward`` is ``forward`` inside the block (the instance's own attribute, so the module's
    hooks still run around it), and what it was after."""
    with _PATCH_LOCK:
        before: Callable | None = head.__dict__.get("forward")  # an instance's own forward (another patch's)
        head.forward = forward
        try:
            yield
        finally:
            if before is not None:
                head.forward = before
            else:
                del head.forward


def streamed_forward(
    model,
    select: Callable[[torch.Tensor], torch.Tensor],
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    support: tuple[int, float] | None = None,
    **model_kwargs,
) -> tuple[Any, tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]]:
    """Call ``model(**model_kwargs)`` with its output layer streamed; returns ``(out, stats)``.

    ``select`` maps the hidden states the head receives (``(B, K, H)`` for ``logits_to_keep=K``) to
    the ``(N, H)`` rows to score, ``targets`` ``(N,)`` their tokens. ``stats`` is
    ``(logprobs, entropy or None, log_kept_mass or None)``, each ``(N,)`` float32, as
    ``algorithms.linear_logprobs`` computes them; ``out`` is the model's output (its hidden states
    when asked for; its ``logits`` field holds the statistics). Only for models ``streamable`` in
    ``"chunked"`` mode."""
    head = output_layer(model)
    if head is None:
        raise ValueError("streamed_forward: the model's output layer is not a plain nn.Linear (see streamable)")

    def stream(hidden):
        lp, ent, kept = linear_logprobs(
            select(hidden), head.weight, targets, head.bias, temperature, with_entropy, entropy_grad, support
        )
        zeros = torch.zeros_like(lp)
        return torch.stack([lp, zeros if ent is None else ent, zeros if kept is None else kept], -1)

    with _patched(head, stream):
        out = model(**model_kwargs)
    stats = out.logits
    if stats.dim() != 2 or stats.shape[-1] != 3:
        raise RuntimeError(
            f"the streamed LM head's statistics came back as {tuple(stats.shape)}: "
            "the model reshaped its head's output; run it with lm_head='full'"
        )
    entropy = (stats[:, 1] if entropy_grad else stats[:, 1].detach()) if with_entropy else None
    return out, (stats[:, 0], entropy, stats[:, 2].detach() if support is not None else None)
