"""Token-level reward shaping: the KL penalty folded into the reward, the outcome score placed on
the last response token, and the missing-EOS penalty ("EOS trick")."""

from __future__ import annotations

import torch

from ._checks import check_mask, check_nonempty_rows, check_tensor


def last_token_index(response_mask: torch.Tensor) -> torch.Tensor:
    """(B,) index of the last unmasked position of each row (rows must be non-empty)."""
    mask = check_mask(response_mask, response_mask.shape)
    check_nonempty_rows(mask)
    positions = torch.arange(1, mask.shape[-1] + 1, device=mask.device)
    return (mask * positions).argmax(dim=-1)


def token_level_rewards(
    scores: torch.Tensor,
    kl: torch.Tensor | None,
    response_mask: torch.Tensor,
    kl_coef: float = 0.0,
) -> torch.Tensor:
    """Per-token rewards of RLHF with the KL penalty in the reward (Ziegler et al. 2019,
    arXiv:1909.08593; Ouyang et al. 2022, eq. 2): ``r_t = -kl_coef · kl_t`` on every response
    token, plus the outcome ``score`` on the last real token (EOS, or the last one if truncated).

    Args: ``scores`` (B,), ``kl`` (B, T) or None (no KL in the reward), ``response_mask`` (B, T)
    with no empty row. Returns: (B, T), 0 on masked positions.
    """
    check_tensor("scores", scores, ndim=1)
    check_tensor("response_mask", response_mask, ndim=2)
    if response_mask.shape[0] != scores.shape[0]:
        raise ValueError(
            f"scores has {scores.shape[0]} rows but response_mask has shape {tuple(response_mask.shape)}"
        )
    mask = check_mask(response_mask, response_mask.shape)
    last = last_token_index(mask)
    zero = torch.zeros((), dtype=scores.dtype, device=scores.device)
    if kl is None:
        rewards = torch.zeros(mask.shape, dtype=scores.dtype, device=scores.device)
    else:
        check_tensor("kl", kl)
        if tuple(kl.shape) != tuple(mask.shape):
            raise ValueError(f"kl must have shape {tuple(mask.shape)}, got {tuple(kl.shape)}")
        rewards = torch.where(mask, -kl_coef * kl.to(scores.dtype), zero)
    rows = torch.arange(mask.shape[0], device=mask.device)
    rewards[rows, last] += scores
    return rewards


def apply_missing_eos_penalty(
    scores: torch.Tensor, has_eos: torch.Tensor, penalty: float, mode: str = "replace"
) -> torch.Tensor:
    """The EOS trick ("The N Implementation Details of RLHF with PPO", detail 23): a completion
    that never emitted EOS was cut at the length limit, so its score is not trusted.

    ``mode="replace"`` sets its score to ``penalty`` (e.g. -1); ``mode="subtract"`` subtracts
    ``penalty`` from it (TRL's ``missing_eos_penalty``). Args: ``scores`` (B,), ``has_eos`` (B,)
    bool. Returns: (B,).
    """
    check_tensor("scores", scores, ndim=1)
    has_eos = check_mask(has_eos, scores.shape, "has_eos")
    if mode == "replace":
        return torch.where(has_eos, scores, torch.full_like(scores, penalty))
    if mode == "subtract":
        return torch.where(has_eos, scores, scores - penalty)
    raise ValueError(f"mode must be 'replace' or 'subtract', got {mode!r}")
