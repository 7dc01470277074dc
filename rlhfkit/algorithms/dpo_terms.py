"""What the DPO trainer computes from per-token log-probs before a loss of ``dpo.py`` reads them:
each completion's log-prob under LD-DPO's length desensitisation, and WPO's pair weights.

Rows come as the DPO trainer lays them out: the ``n`` chosen completions, then their ``n`` rejected
ones (row ``i`` and row ``n + i`` answer the same prompt), each ``(2n, T)`` with a completion mask
marking the completion's tokens (EOS included) from column 0.
"""

from __future__ import annotations

import torch

from ._checks import check_mask, check_tensor


def _pairs(token_logps: torch.Tensor, mask: torch.Tensor) -> tuple[int, torch.Tensor]:
    check_tensor("token_logps", token_logps, ndim=2)
    if token_logps.shape[0] % 2:
        raise ValueError(f"token_logps must hold 2n rows (chosen, then rejected), got {token_logps.shape[0]}")
    return token_logps.shape[0] // 2, check_mask(mask, token_logps.shape, "completion_mask")


def ld_logps(token_logps: torch.Tensor, completion_mask: torch.Tensor, alpha: float) -> torch.Tensor:
    """LD-DPO (Liu et al. 2024, "Length Desensitization in Directed Preference Optimization",
    arXiv:2409.06411): each completion's log-prob (2n,) with the tokens past the shorter completion
    of its pair — the longer one's excess, the "verbose" part — weighted by ``alpha`` (TRL's
    ``ld_alpha``): ``Σ_{t ≤ ℓ} log p_t + α Σ_{t > ℓ} log p_t``, ``ℓ = min(|y_w|, |y_l|)``. ``alpha``
    1 is the plain sum (DPO), 0 keeps the shared length only."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"ld_alpha must be in [0, 1], got {alpha!r}")
    n, mask = _pairs(token_logps, completion_mask)
    lengths = mask.sum(-1)
    shared = torch.minimum(lengths[:n], lengths[n:]).repeat(2)
    inside = mask & (mask.cumsum(-1) <= shared[:, None])
    tail = mask & ~inside
    zero = torch.zeros((), dtype=token_logps.dtype, device=token_logps.device)
    return torch.where(inside, token_logps, zero).sum(-1) + alpha * torch.where(tail, token_logps, zero).sum(-1)


def log_sum_sq_probs(token_logps: torch.Tensor, half_temperature_logps: torch.Tensor) -> torch.Tensor:
    """``log Σ_v p(v)²`` at each position from the log-prob of the token there under the
    distribution and under its temperature-½ version: with logits ``z``, ``log Σ_v e^{2 z_v} -
    2 logsumexp z = 2 log p(y) - log p_½(y)`` (``p_½ = softmax(2z)``) — no vocabulary-wide tensor
    beyond what a log-prob pass holds."""
    return 2 * token_logps - half_temperature_logps


def wpo_weights(token_logps: torch.Tensor, log_sum_sq_probs: torch.Tensor, completion_mask: torch.Tensor):
    """WPO (Zhou et al. 2024, "WPO: Enhancing RLHF with Weighted Preference Optimization",
    arXiv:2406.11827, eq. 2, with its length-normalised, sampling-aligned probability): each pair's
    weight (n,), ``w(y_w) w(y_l)``, ``w(y) = exp(mean_t (log p(y_t) - log Σ_v p(v)²))`` — how
    likely the policy is to have produced the completion itself, each token's probability taken
    against the distribution's own self-probability ``Σ_v p(v)²``. Without gradient (a weight)."""
    n, mask = _pairs(token_logps, completion_mask)
    check_tensor("log_sum_sq_probs", log_sum_sq_probs)
    if log_sum_sq_probs.shape != token_logps.shape:
        raise ValueError(
            f"log_sum_sq_probs must have shape {tuple(token_logps.shape)}, got {tuple(log_sum_sq_probs.shape)}"
        )
    with torch.no_grad():
        aligned = torch.where(mask, token_logps.float() - log_sum_sq_probs.float(), 0.0)
        weights = torch.exp(aligned.sum(-1) / mask.sum(-1).clamp(min=1))
    return weights[:n] * weights[n:]
