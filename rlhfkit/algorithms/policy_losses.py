"""Policy losses: PPO's clipped surrogate (asymmetric and dual clipping; token- or sequence-level
importance ratios, the latter GSPO), CISPO's clipped importance-sampling weight, and the plain
policy gradient.

All losses are negated objectives (for gradient descent) and return ``(loss, metrics)`` where
``metrics`` holds detached 0-d tensors (no ``.item()``; the caller decides when to synchronise).
A metric whose name ends in ``_max`` is a maximum (the trainer reduces it with ``max``).
"""

from __future__ import annotations

import torch

from ._checks import check_mask, check_same_shape, check_tensor, masked_mean
from .kl import MAX_LOG_RATIO, kl_penalty
from .losses import aggregate

IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence", "sequence_token")


def importance_ratio(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, response_mask: torch.Tensor, level: str = "token"
) -> torch.Tensor:
    """The importance ratio each token's loss uses, (B, T), at ``level``:

    - ``"token"``: ``ρ_t = exp(log π(y_t) - log π_old(y_t))`` (PPO, GRPO).
    - ``"sequence"``: GSPO's length-normalised sequence ratio (Zheng et al. 2025, "Group Sequence
      Policy Optimization", arXiv:2507.18071, eq. 7)
      ``s_i = exp((1/|y_i|) Σ_t (log π(y_{i,t}) - log π_old(y_{i,t})))``, the same on every token
      of row ``i``; its gradient flows through the mean, ``∂ log s_i / ∂ log π(y_{i,t}) = 1/|y_i|``
      (TRL's ``importance_sampling_level="sequence"``).
    - ``"sequence_token"``: GSPO-token (same paper, §4.3)
      ``s_{i,t} = sg[s_i] · π(y_{i,t}) / sg[π(y_{i,t})]``: the value of ``s_i``, the gradient of
      its own token, ``∂ log s_{i,t} / ∂ log π(y_{i,t}) = 1``. With one advantage per sequence it
      gives GSPO's loss and gradient exactly; it also takes token-level advantages (ms-swift's and
      TRL's ``"sequence_token"``).

    ``|y_i|`` counts the row's unmasked tokens (an empty row has ``s_i = 1``); off the mask the
    log-ratio is 0, so padding garbage (NaN included) reaches neither the ratio nor its gradient.
    Log-ratios are clamped to ±20 before ``exp`` (past that the gradient is 0), as everywhere in
    the core.
    """
    if level not in IMPORTANCE_SAMPLING_LEVELS:
        raise ValueError(
            f"importance_sampling_level must be one of {', '.join(IMPORTANCE_SAMPLING_LEVELS)}, got {level!r}"
        )
    mask = check_mask(response_mask, logprobs.shape)
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    log_ratio = torch.where(mask, logprobs - old_logprobs, zero)
    if level == "token":
        return torch.exp(log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    log_s = masked_mean(log_ratio, mask, dim=-1).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)[:, None]
    if level == "sequence":
        return torch.exp(log_s).expand_as(logprobs)
    return torch.exp(log_s.detach() + torch.where(mask, logprobs - logprobs.detach(), zero))


def ppo_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    agg: str = "token-mean",
    horizon: int | None = None,
    weights: torch.Tensor | None = None,
    importance_sampling_level: str = "token",
):
    """PPO clipped surrogate (Schulman et al. 2017, arXiv:1707.06347, eq. 7), negated:

    ``loss_t = -min(ρ_t A_t, clip(ρ_t, 1 - clip_low, 1 + clip_high) A_t)``, ``ρ_t = exp(logp - old)``.

    ``clip_low != clip_high`` is DAPO's clip-higher (arXiv:2503.14476). ``dual_clip = c > 1``
    (Ye et al. 2020, arXiv:1912.09729; verl's ``clip_ratio_c``) bounds the objective from below by
    ``c·A`` when ``A < 0``: ``loss_t = min(loss_t, -c·A_t)``, so a huge ratio on a bad token cannot
    blow the loss up.

    ``importance_sampling_level`` picks ``ρ`` (``importance_ratio``): ``"token"`` (default, PPO);
    ``"sequence"`` is GSPO (arXiv:2507.18071, eqs. 5–7): the sequence ratio ``s_i`` in place of
    ``ρ_t`` on every token, so a whole sequence is clipped or not — the paper clips it with its own
    small range (3e-4 below, 4e-4 above), and its objective ``(1/G) Σ_i min(s_i A_i, clip(s_i) A_i)``
    is ``agg="seq-mean-token-mean"``; ``"sequence_token"`` is GSPO-token.

    ``weights`` (B, T), optional: the importance-sampling weights of the rollout correction
    (``rollout_is_weights``); each ``loss_t`` is multiplied by ``w_t`` (detached) before
    ``aggregate``. ``None`` leaves the loss untouched.

    Args: (B, T) tensors (``advantages`` may be (B,), broadcast over tokens). Returns ``(loss,
    metrics)``: ``policy/clip_frac`` (tokens where the clipped term is active; at a sequence level
    the share of tokens in clipped sequences), ``policy/clip_frac_dual``, ``policy/approx_kl``
    (k1, ``mean(old - new)``), ``policy/approx_kl_k3``, ``policy/ratio_mean`` (token-means over
    the mask) and ``policy/ratio_max`` (the largest ``ρ`` on the mask; 0 when it is empty).
    """
    mask, advantages = _check_policy_inputs(logprobs, old_logprobs, advantages, response_mask)
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip_low and clip_high must be >= 0, got {clip_low}, {clip_high}")
    ratio = importance_ratio(logprobs, old_logprobs, mask, importance_sampling_level)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss_mat = torch.maximum(unclipped, clipped)
    is_clipped = clipped > unclipped
    is_dual = torch.zeros_like(is_clipped)
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        bound = -advantages * dual_clip
        is_dual = (advantages < 0) & (loss_mat > bound)
        loss_mat = torch.where(advantages < 0, torch.minimum(loss_mat, bound), loss_mat)
    loss = aggregate(_weighted(loss_mat, weights, mask), mask, agg, horizon)
    with torch.no_grad():
        metrics = {
            "policy/clip_frac": masked_mean(is_clipped.to(logprobs.dtype), mask),
            "policy/clip_frac_dual": masked_mean(is_dual.to(logprobs.dtype), mask),
            **_ratio_metrics(logprobs, old_logprobs, ratio, mask),
        }
    return loss, {k: v.detach() for k, v in metrics.items()}


def cispo_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_high: float,
    agg: str = "token-mean",
    horizon: int | None = None,
    weights: torch.Tensor | None = None,
    importance_sampling_level: str = "token",
):
    """CISPO (MiniMax-M1, arXiv:2506.13585, eqs. 4–5), negated:

    ``loss_t = -sg(r̂_t) · A_t · log π(y_t)``, ``r̂_t = min(ρ_t, 1 + clip_high)``,

    a REINFORCE loss whose token weight is the importance ratio capped from above and detached
    (``sg``): no token is dropped from the gradient, however far its ratio moved (PPO's clip
    zeroes those tokens' gradients). Eq. 5 clips ``ρ`` to ``[1 - ε_low, 1 + ε_high]``; the paper
    sets ``ε_low`` large ("we did not impose a lower bound on the IS weight ... only tuned
    ε_high"), which is this function: an upper cap only. Its objective is normalised by the
    batch's token count, ``agg="token-mean"``. On-policy (``ρ = 1``) the gradient is the policy
    gradient ``-A_t ∇log π(y_t)``.

    ``importance_sampling_level`` as in ``ppo_policy_loss`` (``ρ`` is detached, so ``"sequence"``
    and ``"sequence_token"`` coincide here). ``weights`` (B, T), optional: the rollout correction's
    weights, multiplying each ``loss_t`` (detached) before ``aggregate``.

    Returns ``(loss, metrics)``: ``policy/clip_frac`` (tokens whose weight is capped),
    ``policy/approx_kl``, ``policy/approx_kl_k3``, ``policy/ratio_mean``, ``policy/ratio_max``.
    """
    mask, advantages = _check_policy_inputs(logprobs, old_logprobs, advantages, response_mask)
    if clip_high <= -1:
        raise ValueError(f"clip_high must be > -1 (the weight's cap 1 + clip_high > 0), got {clip_high}")
    ratio = importance_ratio(logprobs, old_logprobs, mask, importance_sampling_level)
    capped = ratio.clamp(max=1.0 + clip_high).detach()
    loss = aggregate(_weighted(-advantages * capped * logprobs, weights, mask), mask, agg, horizon)
    with torch.no_grad():
        metrics = {
            "policy/clip_frac": masked_mean((ratio > 1.0 + clip_high).to(logprobs.dtype), mask),
            **_ratio_metrics(logprobs, old_logprobs, ratio, mask),
        }
    return loss, {k: v.detach() for k, v in metrics.items()}


def pg_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    agg: str = "seq-mean-token-sum",
    horizon: int | None = None,
    weights: torch.Tensor | None = None,
):
    """Plain policy gradient (REINFORCE, Williams 1992): ``loss_t = -A_t · log π(y_t)``.

    With sequence-level advantages and ``agg="seq-mean-token-sum"`` this is exactly the bandit
    loss of the reference's REINFORCE / RLOO code: ``mean_i(-A_i Σ_t log π(y_{i,t}))``.
    ``old_logprobs`` only feeds the approx-KL metrics (the loss is on-policy by construction).
    ``weights`` (B, T), optional: the importance-sampling weights of the rollout correction
    (``rollout_is_weights``), multiplying each ``loss_t`` (detached) before ``aggregate``.
    Returns ``(loss, metrics)`` with ``policy/approx_kl`` and ``policy/approx_kl_k3``.
    """
    mask, advantages = _check_policy_inputs(logprobs, old_logprobs, advantages, response_mask)
    loss = aggregate(_weighted(-advantages * logprobs, weights, mask), mask, agg, horizon)
    with torch.no_grad():
        metrics = {
            "policy/approx_kl": masked_mean(old_logprobs - logprobs, mask),
            "policy/approx_kl_k3": masked_mean(kl_penalty(logprobs, old_logprobs, "k3"), mask),
        }
    return loss, {k: v.detach() for k, v in metrics.items()}


def _ratio_metrics(logprobs, old_logprobs, ratio, mask) -> dict:
    """approx-KL (k1, k3) between the old and the current policy, and the ratio's mean and maximum."""
    zero = torch.zeros((), dtype=ratio.dtype, device=ratio.device)
    return {
        "policy/approx_kl": masked_mean(old_logprobs - logprobs, mask),
        "policy/approx_kl_k3": masked_mean(kl_penalty(logprobs, old_logprobs, "k3"), mask),
        "policy/ratio_mean": masked_mean(ratio, mask),
        "policy/ratio_max": torch.where(mask, ratio, zero).max() if ratio.numel() else zero,
    }


def _weighted(loss_mat: torch.Tensor, weights: torch.Tensor | None, mask: torch.Tensor) -> torch.Tensor:
    """``loss_mat * weights`` with the weights detached (constants of the loss) and set to 0 off the
    mask (a NaN there would otherwise reach the gradient of the padding); ``None``: as is."""
    if weights is None:
        return loss_mat
    check_tensor("weights", weights)
    if tuple(weights.shape) != tuple(loss_mat.shape):
        raise ValueError(f"weights must have shape {tuple(loss_mat.shape)}, got {tuple(weights.shape)}")
    return loss_mat * torch.where(mask, weights.detach(), torch.zeros((), dtype=weights.dtype, device=weights.device))


def _check_policy_inputs(logprobs, old_logprobs, advantages, response_mask):
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
