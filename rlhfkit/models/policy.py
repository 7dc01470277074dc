"""One forward pass over prompt+response that yields what the RL loop needs for the response
tokens only: log-probs (logits scaled by the sampling temperature), optionally entropies and the
last hidden states (for a value head sharing the policy's backbone).

Sequences are laid out as ``[left padding | prompt | response | right padding]`` with the response
occupying the last ``T`` columns, so the logits that predict response token ``t`` sit at columns
``-(T+1) .. -2``; ``logits_to_keep=T+1`` keeps only those (never the prompt's).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..algorithms import entropy_from_logits, log_kept_mass, selective_logprobs
from . import efficiency
from .activations import checkpointable_layers
from .aligned import align_left
from .lm_head import streamable, streamed_forward
from .packing import PackedGroups, pack_groups


@dataclass
class ResponseForward:
    logprobs: torch.Tensor  # (B, T) float32
    entropy: torch.Tensor | None  # (B, T) float32, when asked for
    hidden: torch.Tensor | None  # (B, T, H) last hidden states at the predicting positions
    log_kept_mass: torch.Tensor | None = None  # (B, T) float32, log of the mass top-k/top-p keep, when asked for

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> ResponseForward:
        """Each output through ``fn`` (a layout change: padded, scattered, packed back); one not asked for
        stays None."""
        return ResponseForward(
            fn(self.logprobs),
            None if self.entropy is None else fn(self.entropy),
            None if self.hidden is None else fn(self.hidden),
            None if self.log_kept_mass is None else fn(self.log_kept_mass),
        )


@functools.cache
def cache_name() -> str:
    """The KV cache's name in this transformers' model calls and outputs: ``cache`` (the newer name;
    ``past_key_values`` is deprecated there) or ``past_key_values`` (older 5.x)."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    return "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


def with_cache(cache) -> dict:
    """The keyword argument that passes ``cache`` to a model's forward or ``generate``."""
    return {cache_name(): cache}


def output_cache(out):
    """The KV cache of a model output (``use_cache=True``)."""
    return getattr(out, cache_name())


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding, exactly as ``generate`` numbers them."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def forward_response(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_len: int,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    with_hidden: bool = False,
    prompt_index: torch.Tensor | None = None,
    support: tuple[int, float] | None = None,
    lm_head: str = "chunked",
) -> ResponseForward:
    """Per-token log-probs of the last ``response_len`` tokens of ``input_ids`` (B, P+T).

    Logits are divided by ``temperature`` (the sampling temperature, so log-probs match what was
    sampled: "The N Implementation Details of RLHF with PPO", detail on temperature). Entropy is
    computed without gradient unless ``entropy_grad`` (the entropy bonus needs it).

    ``prompt_index`` (B,): which prompt each row continues (rows with equal index have identical
    prompt columns, as the ``G`` completions of a group do). When given, the rows of each prompt
    run as one packed sequence (``models.packing``): the prompt once, the completions after it
    without padding — the same results and gradients for the prompt's ``(G-1)/G`` and the padding's
    compute. Where packing does not apply (``models.packing.pack_groups``: another architecture or
    attention, a narrower sliding window, rows past the original length of a length-dependent rope,
    long completions) the rows run as they are.

    ``support`` ``(top_k, top_p)``: also return ``log_kept_mass`` (no gradient), the log of the
    probability mass the sampler's truncation keeps at each position (``algorithms.log_kept_mass``);
    ``logprobs - log_kept_mass`` is then the log-prob under the distribution the sampler drew from.

    ``lm_head``: how the output layer is read (``models.lm_head``, the trainers' config field):
    ``"chunked"`` streams it where the model allows (no tokens x vocabulary logits), ``"full"`` runs
    the model's own logits.
    """
    T = response_len
    start, used = _attended_span(attention_mask, T)
    if start > 0 or used < T:  # columns no row attends: left padding of every row, ends of every response
        P = input_ids.shape[1] - T
        out = forward_response(
            model,
            input_ids[:, start : P + used],
            attention_mask[:, start : P + used],
            used,
            temperature,
            with_entropy,
            entropy_grad,
            with_hidden,
            prompt_index,
            support,
            lm_head,
        )
        return out.map(lambda x: _pad_columns(x, T))
    if prompt_index is not None:
        packed = pack_groups(model, input_ids, attention_mask, T, prompt_index)
        if packed is not None:
            return _forward_packed(
                model, packed, input_ids, T, temperature, with_entropy, entropy_grad, with_hidden, support, lm_head
            )
    efficiency.add_computed(input_ids.numel() * (2 if _recomputes(model) else 1))
    aligned = align_left(model, input_ids, attention_mask, T)
    inputs: dict[str, Any]
    if aligned is not None:  # no attention mask: SDPA's fused causal kernels (models.aligned)
        keep, pick = aligned.keep, aligned.pick
        inputs = dict(input_ids=aligned.input_ids, attention_mask=None)
    else:
        keep, pick = T + 1, (lambda values: values[:, :-1])
        inputs = dict(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids_from_mask(attention_mask)
        )
    inputs.update(logits_to_keep=keep, output_hidden_states=with_hidden, use_cache=False)
    B = input_ids.shape[0]
    if streamable(model, lm_head):
        out, (logprobs, entropy, kept) = streamed_forward(
            model,
            lambda h: pick(h).reshape(-1, h.shape[-1]),
            input_ids[:, -T:].reshape(-1),
            **_stream_options(temperature, with_entropy, entropy_grad, support),
            **inputs,
        )
        rows = ResponseForward(logprobs, entropy, None, kept).map(lambda x: x.reshape(B, T))
        rows.hidden = pick(out.hidden_states[-1][:, -keep:]) if with_hidden else None
        return rows
    out = model(**inputs)
    hidden = pick(out.hidden_states[-1][:, -keep:]) if with_hidden else None
    return _response_outputs(
        pick(out.logits), input_ids[:, -T:], hidden, temperature, with_entropy, entropy_grad, support
    )


def _stream_options(temperature, with_entropy, entropy_grad, support) -> dict:
    return dict(
        temperature=temperature,
        with_entropy=with_entropy,
        entropy_grad=entropy_grad and torch.is_grad_enabled(),
        support=support,
    )


def _attended_span(attention_mask: torch.Tensor, T: int) -> tuple[int, int]:
    """(first column any row attends, capped to leave one prompt column; response columns up to the
    last one any row attends, at least 1)."""
    P = attention_mask.shape[1] - T
    attended = attention_mask.bool().any(0)
    start = min(int(attended.long().argmax()) if bool(attended.any()) else 0, max(P - 1, 0))
    in_response = attended[P:].nonzero()
    used = int(in_response[-1]) + 1 if len(in_response) else 1
    return start, used


def _pad_columns(x: torch.Tensor, T: int) -> torch.Tensor:
    """(B, t, ...) -> (B, T, ...) with zeros in the new (unattended) columns."""
    pad = x.new_zeros((x.shape[0], T - x.shape[1], *x.shape[2:]))
    return torch.cat([x, pad], 1)


def _forward_packed(
    model, packed: PackedGroups, input_ids, T, temperature, with_entropy, entropy_grad, with_hidden, support, lm_head
) -> ResponseForward:
    """One pass over the packed groups (``models.packing``); the outputs of the real response tokens,
    in the batch's (B, T) layout.

    The kept logits ``(n, K, V)`` are read where they lie, not gathered into a copy: a column ``>= 1``
    predicts one token (the next of its completion), so the log-probs of all of them come from one
    ``(n, K)`` grid of targets; column 0 (the prompt's last) predicts the first token of every row of
    its group and is computed on those rows' copies of its logits, ``B x V``."""
    efficiency.add_computed(packed.computed * (2 if _recomputes(model) else 1))
    inputs = dict(
        **packed.model_inputs(model),
        logits_to_keep=packed.input_ids.shape[1] - packed.first_kept,
        output_hidden_states=with_hidden,
        use_cache=False,
    )
    targets = input_ids[packed.row, input_ids.shape[1] - T + packed.step]  # (M,) the token each output scores
    B = input_ids.shape[0]
    if streamable(model, lm_head):  # each needed output's hidden state, column 0's once per row of its group
        out, stats = streamed_forward(
            model,
            lambda h: h[packed.group, packed.column],
            targets,
            **_stream_options(temperature, with_entropy, entropy_grad, support),
            **inputs,
        )
        hidden = out.hidden_states[-1][:, packed.first_kept :][packed.group, packed.column] if with_hidden else None
        return ResponseForward(stats[0], stats[1], hidden, stats[2]).map(lambda x: packed.scatter(x, B, T))
    out = model(**inputs)
    logits = out.logits
    first = packed.step == 0
    grid = torch.zeros(logits.shape[:2], dtype=torch.long, device=logits.device)
    grid[packed.group[~first], packed.column[~first]] = targets[~first]
    per_column = _response_outputs(logits, grid, None, temperature, with_entropy, entropy_grad, support)
    heads = _response_outputs(logits[packed.group[first], 0], targets[first], None, temperature, False, False, support)

    def pick(values, head_values=None):  # (n, K) -> (M,), column 0's target-dependent values from ``heads``
        taken = values[packed.group, packed.column]
        return taken if head_values is None else taken.masked_scatter(first, head_values)

    hidden = out.hidden_states[-1][:, packed.first_kept :][packed.group, packed.column] if with_hidden else None
    outputs = ResponseForward(
        pick(per_column.logprobs, heads.logprobs),
        None if per_column.entropy is None else pick(per_column.entropy),
        hidden,
        None if support is None else pick(per_column.log_kept_mass, heads.log_kept_mass),
    )
    return outputs.map(lambda x: packed.scatter(x, B, T))


def _response_outputs(logits, targets, hidden, temperature, with_entropy, entropy_grad, support) -> ResponseForward:
    """The model's own logits (the unstreamed head) read as the streamed head reads them: divided by
    the temperature in float32, chunk by chunk (``algorithms.logprobs``), never in the logits' dtype."""
    logprobs = selective_logprobs(logits, targets, temperature=temperature)
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = entropy_from_logits(logits, temperature=temperature)
    kept = None
    if support is not None:
        top_k, top_p = support
        kept = log_kept_mass(logits.detach(), targets, top_k, top_p, temperature=temperature)
    return ResponseForward(logprobs, entropy, hidden, kept)


def _recomputes(model) -> bool:
    """Activation checkpointing will run the layers' forward again in the backward pass (counted
    twice by ``models.efficiency``)."""
    return torch.is_grad_enabled() and any(
        m.gradient_checkpointing and m.training for m in checkpointable_layers(model)
    )
