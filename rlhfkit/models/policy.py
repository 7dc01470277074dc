"""One forward pass over prompt+response that yields what the RL loop needs for the response
tokens only: log-probs (logits scaled by the sampling temperature), optionally entropies and the
last hidden states (for a value head sharing the policy's backbone).

Sequences are laid out as ``[left padding | prompt | response | right padding]`` with the response
occupying the last ``T`` columns, so the logits that predict response token ``t`` sit at columns
``-(T+1) .. -2``; ``logits_to_keep=T+1`` keeps only those (never the prompt's).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ..algorithms import entropy_from_logits, log_kept_mass, selective_logprobs
from . import efficiency


@dataclass
class ResponseForward:
    logprobs: torch.Tensor  # (B, T) float32
    entropy: torch.Tensor | None  # (B, T) float32, when asked for
    hidden: torch.Tensor | None  # (B, T, H) last hidden states at the predicting positions
    log_kept_mass: torch.Tensor | None = None  # (B, T) float32, log of the mass top-k/top-p keep, when asked for


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
) -> ResponseForward:
    """Per-token log-probs of the last ``response_len`` tokens of ``input_ids`` (B, P+T).

    Logits are divided by ``temperature`` (the sampling temperature, so log-probs match what was
    sampled: "The N Implementation Details of RLHF with PPO", detail on temperature). Entropy is
    computed without gradient unless ``entropy_grad`` (the entropy bonus needs it).

    ``prompt_index`` (B,): which prompt each row continues (rows with equal index have identical
    prompt columns, as the ``G`` completions of a group do). When given, each distinct prompt runs
    through the model once and its key/value cache is shared by its rows — the same results (and
    gradients, which flow back through the shared cache) for ``~(G-1)/G`` less prompt compute.

    ``support`` ``(top_k, top_p)``: also return ``log_kept_mass`` (no gradient), the log of the
    probability mass the sampler's truncation keeps at each position (``algorithms.log_kept_mass``);
    ``logprobs - log_kept_mass`` is then the log-prob under the distribution the sampler drew from.
    """
    T = response_len
    start, used = _attended_span(attention_mask, T)
    if start > 0 or used < T:  # columns no row attends: left padding of every row, ends of every response
        P = input_ids.shape[1] - T
        out = forward_response(model, input_ids[:, start : P + used], attention_mask[:, start : P + used], used,
                               temperature, with_entropy, entropy_grad, with_hidden, prompt_index, support)
        return ResponseForward(*(None if x is None else _pad_columns(x, T) for x in
                                 (out.logprobs, out.entropy, out.hidden, out.log_kept_mass)))
    positions = position_ids_from_mask(attention_mask)
    if prompt_index is not None and _can_share_prompt(model):
        unique, inverse = torch.unique(prompt_index, return_inverse=True)
        if len(unique) < len(prompt_index):
            return _forward_shared_prompt(model, input_ids, attention_mask, positions, T, inverse, len(unique),
                                          temperature, with_entropy, entropy_grad, with_hidden, support)
    efficiency.add_computed(input_ids.numel() * (2 if _recomputes(model) else 1))
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=positions,
        logits_to_keep=T + 1,
        output_hidden_states=with_hidden,
        use_cache=False,
    )
    hidden = out.hidden_states[-1][:, -(T + 1) : -1] if with_hidden else None
    return _response_outputs(out.logits[:, -(T + 1) : -1], input_ids[:, -T:], hidden, temperature,
                             with_entropy, entropy_grad, support)


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


def _forward_shared_prompt(model, input_ids, attention_mask, positions, T, inverse, n_prompts, temperature,
                           with_entropy, entropy_grad, with_hidden, support) -> ResponseForward:
    """The prompt columns once per distinct prompt (keeping its cache), then every row's response
    columns on top of its prompt's cache. Response token 0 is predicted by the prompt pass's last
    position, tokens 1..T-1 by the response pass."""
    B, P = input_ids.shape[0], input_ids.shape[1] - T
    rows = torch.arange(B, device=input_ids.device)
    first = torch.full((n_prompts,), B, device=input_ids.device).scatter_reduce(0, inverse, rows, "amin")
    efficiency.add_computed(n_prompts * P + B * T)  # the prompt pass, then the rows' response pass
    head = model(input_ids=input_ids[first, :P], attention_mask=attention_mask[first, :P],
                 position_ids=positions[first, :P], logits_to_keep=1, output_hidden_states=with_hidden,
                 use_cache=True)
    cache = output_cache(head)
    cache.batch_select_indices(inverse)  # differentiable gather: row i reads its prompt's keys/values
    tail = model(input_ids=input_ids[:, P:], attention_mask=attention_mask, position_ids=positions[:, P:],
                 **with_cache(cache), logits_to_keep=T, output_hidden_states=with_hidden, use_cache=True)
    logits = torch.cat([head.logits[inverse], tail.logits[:, :-1]], 1)
    hidden = (torch.cat([head.hidden_states[-1][inverse, -1:], tail.hidden_states[-1][:, :-1]], 1)
              if with_hidden else None)
    return _response_outputs(logits, input_ids[:, -T:], hidden, temperature, with_entropy, entropy_grad, support)


def _response_outputs(logits, targets, hidden, temperature, with_entropy, entropy_grad, support) -> ResponseForward:
    if temperature != 1.0:
        logits = logits / temperature
    logprobs = selective_logprobs(logits, targets)
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = entropy_from_logits(logits)
    kept = log_kept_mass(logits.detach(), targets, *support) if support is not None else None
    return ResponseForward(logprobs, entropy, hidden, kept)


def _recomputes(model) -> bool:
    """Activation checkpointing will run the layers' forward again in the backward pass (counted
    twice by ``models.efficiency``)."""
    return torch.is_grad_enabled() and any(getattr(m, "gradient_checkpointing", False) and m.training
                                           for m in model.modules())


def _can_share_prompt(model) -> bool:
    """Hugging Face layers drop ``past_key_values`` under gradient checkpointing in training mode
    (even without grad), which would silently cut the response off its prompt; a DDP wrapper may
    not run its module twice before one backward (the prompt pass, then the rows)."""
    if type(model).__name__ == "DistributedDataParallel":
        return False
    return not any(getattr(m, "gradient_checkpointing", False) and m.training for m in model.modules())
