"""What the policy losses of ``policy_losses.py`` share: their input checks, their ratio and
approx-KL metrics (``Metric`` token means and maximum, ``metrics.py``), a knob as a tensor."""

from __future__ import annotations

import torch

from ._checks import check_mask, check_same_shape, check_tensor
from .kl import kl_penalty
from .metrics import Metric, token_max, token_mean


def approx_kl_metrics(logprobs, old_logprobs, mask) -> dict[str, Metric]:
    """approx-KL between the old and the current policy, k1 and k3, token means."""
    return {
        "policy/approx_kl": token_mean(old_logprobs - logprobs, mask),
        "policy/approx_kl_k3": token_mean(kl_penalty(logprobs, old_logprobs, "k3"), mask),
    }


def ratio_metrics(logprobs, old_logprobs, ratio, mask) -> dict[str, Metric]:
    """approx-KL (k1, k3) between the old and the current policy, and the ratio's mean and maximum."""
    return {
        **approx_kl_metrics(logprobs, old_logprobs, mask),
        "policy/ratio_mean": token_mean(ratio, mask),
        "policy/ratio_max": token_max(ratio, mask),
    }


def scalar_like(value: float, like: torch.Tensor) -> torch.Tensor:
    """``value`` as a 0-d tensor of ``like``'s dtype and device (a knob, exact in float64)."""
    return torch.tensor(value, dtype=like.dtype, device=like.device)


def check_policy_inputs(logprobs, old_logprobs, advantages, response_mask) -> tuple[torch.Tensor, torch.Tensor]:
    """The checked inputs of a policy loss: ``(mask, advantages)``, the mask as bool, (B,) advantages
    broadcast to (B, 1), detached; a one-line ``ValueError`` naming the argument otherwise."""
    check_same_shape(logprobs=logprobs, old_logprobs=old_logprobs)
    check_tensor("logprobs", logprobs, ndim=2)
    check_tensor("advantages", advantages)
    if advantages.dim() == 1 and advantages.shape[0] == logprobs.shape[0]:
        advantages = advantages[:, None]
    elif tuple(advantages.shape) != tuple(logprobs.shape):
        raise ValueError(
            f"advantages must have shape {tuple(logprobs.shape)} or ({logprobs.shape[0]},), "
            f"got {tuple(advantages.shape)}"
        )
    mask = check_mask(response_mask, logprobs.shape)
    # Advantages are constants of the surrogate: never let a gradient flow into them.
    return mask, advantages.detach()
