"""One forward pass over prompt+response that yields what the RL loop needs for the response
tokens only: log-probs (logits scaled by the sampling temperature), optionally entropies and the
last hidden states (for a value head sharing the policy's backbone).

Sequences are laid out as ``[left padding | prompt | response | right padding]`` with the response
occupying the last ``T`` columns, so the logits that predict response token ``t`` sit at columns
``-(T+1) .. -2``; ``logits_to_keep=T+1`` keeps only those (never the prompt's).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..algorithms import entropy_from_logits, selective_logprobs


@dataclass
class ResponseForward:
    logprobs: torch.Tensor  # (B, T) float32
    entropy: torch.Tensor | None  # (B, T) float32, when asked for
    hidden: torch.Tensor | None  # (B, T, H) last hidden states at the predicting positions


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
) -> ResponseForward:
    """Per-token log-probs of the last ``response_len`` tokens of ``input_ids`` (B, P+T).

    Logits are divided by ``temperature`` (the sampling temperature, so log-probs match what was
    sampled: "The N Implementation Details of RLHF with PPO", detail on temperature). Entropy is
    computed without gradient unless ``entropy_grad`` (the entropy bonus needs it).
    """
    T = response_len
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        logits_to_keep=T + 1,
        output_hidden_states=with_hidden,
        use_cache=False,
    )
    logits = out.logits[:, -(T + 1) : -1]
    if temperature != 1.0:
        logits = logits / temperature
    logprobs = selective_logprobs(logits, input_ids[:, -T:])
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = entropy_from_logits(logits)
    hidden = out.hidden_states[-1][:, -(T + 1) : -1] if with_hidden else None
    return ResponseForward(logprobs, entropy, hidden)
