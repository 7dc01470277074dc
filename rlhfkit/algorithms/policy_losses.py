"""Policy losses: PPO's clipped surrogate (asymmetric and dual clipping; token- or sequence-level
importance ratios, the latter GSPO), CISPO's clipped importance-sampling weight, SAPO's soft gate,
VESPO's Gamma-weighted sequence ratio, and the plain policy gradient.

All losses are negated objectives (for gradient descent) and return ``(loss, metrics)`` where
``metrics`` maps each name to a ``Metric`` of a declared kind (``metrics.py``: a token mean, a
maximum, ... as sufficient statistics), so the update reads the metric of a whole batch from those of
its micro-batches and processes (no ``.item()``; the caller decides when to synchronise).

Each loss but VESPO is written once, per token (``ppo_token_loss``, ``cispo_token_loss``,
``sapo_token_loss``, ``pg_token_loss``: ``(loss_mat, metrics)``); the rollout correction's weights and
the aggregation are applied around it by ``losses.corrected_loss`` — by ``POLICY_LOSSES`` in the RL
loop, by the scalar forms (``ppo_policy_loss``, ...) when called alone. VESPO folds the weights into
its sequence ratio, so it applies them itself.
"""

from __future__ import annotations

import math

import torch

from ._checks import check_mask, check_same_shape, masked_mean
from ._policy_terms import approx_kl_metrics, check_policy_inputs, ratio_metrics, scalar_like
from .kl import MAX_LOG_RATIO
from .losses import aggregate, corrected_loss
from .metrics import Metric, token_mean

IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence", "sequence_token", "sequence_sum")


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
    - ``"sequence_sum"``: the ratio of the whole sequence's probabilities,
      ``w_i = exp(Σ_t (log π(y_{i,t}) - log π_old(y_{i,t})))``, the same on every token of row
      ``i``, its gradient that of every token, ``∂ log w_i / ∂ log π(y_{i,t}) = 1`` — the ratio of
      the bandit view of REINFORCE / RLOO, where a completion is one action (TRL's ``RLOOTrainer``
      clips it; with ``agg="seq-mean-token-mean"`` PPO's clip on it is TRL's RLOO loss). At
      ``π = π_old`` its gradient is REINFORCE's ``-A Σ_t ∇log π``.

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
    if level == "sequence_sum":
        log_w = log_ratio.sum(-1, keepdim=True).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
        return torch.exp(log_w).expand_as(logprobs)
    log_s = masked_mean(log_ratio, mask, dim=-1).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)[:, None]
    if level == "sequence":
        return torch.exp(log_s).expand_as(logprobs)
    return torch.exp(log_s.detach() + torch.where(mask, logprobs - logprobs.detach(), zero))


def ppo_token_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    importance_sampling_level: str = "token",
) -> tuple[torch.Tensor, dict[str, Metric]]:
    """The per-token loss ``loss_t`` (B, T) of ``ppo_policy_loss`` (its formula, paper and metrics there),
    before the rollout correction's weights and the aggregation: ``(loss_mat, metrics)``; the
    ``"ppo_clip"`` entry of ``POLICY_LOSSES``, whose caller weighs and aggregates it (``corrected_loss``)."""
    mask, advantages = check_policy_inputs(logprobs, old_logprobs, advantages, response_mask)
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
    with torch.no_grad():
        metrics = {
            "policy/clip_frac": token_mean(is_clipped.to(logprobs.dtype), mask),
            "policy/clip_frac_dual": token_mean(is_dual.to(logprobs.dtype), mask),
            **ratio_metrics(logprobs, old_logprobs, ratio, mask),
        }
    return loss_mat, metrics


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
    loss_mat, metrics = ppo_token_loss(
        logprobs, old_logprobs, advantages, response_mask, clip_low, clip_high, dual_clip, importance_sampling_level
    )
    return corrected_loss(loss_mat, response_mask, weights, agg, horizon), metrics


def cispo_token_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_high: float,
    importance_sampling_level: str = "token",
) -> tuple[torch.Tensor, dict[str, Metric]]:
    """The per-token loss ``loss_t`` (B, T) of ``cispo_policy_loss`` (its formula, paper and metrics
    there), before the rollout correction's weights and the aggregation: ``(loss_mat, metrics)``; the
    ``"cispo"`` entry of ``POLICY_LOSSES``."""
    mask, advantages = check_policy_inputs(logprobs, old_logprobs, advantages, response_mask)
    if clip_high <= -1:
        raise ValueError(f"clip_high must be > -1 (the weight's cap 1 + clip_high > 0), got {clip_high}")
    ratio = importance_ratio(logprobs, old_logprobs, mask, importance_sampling_level)
    capped = ratio.clamp(max=1.0 + clip_high).detach()
    loss_mat = -advantages * capped * logprobs
    with torch.no_grad():
        metrics = {
            "policy/clip_frac": token_mean((ratio > 1.0 + clip_high).to(logprobs.dtype), mask),
            **ratio_metrics(logprobs, old_logprobs, ratio, mask),
        }
    return loss_mat, metrics


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
    loss_mat, metrics = cispo_token_loss(
        logprobs, old_logprobs, advantages, response_mask, clip_high, importance_sampling_level
    )
    return corrected_loss(loss_mat, response_mask, weights, agg, horizon), metrics


def sapo_token_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    temperature_pos: float = 1.0,
    temperature_neg: float = 1.05,
    importance_sampling_level: str = "token",
) -> tuple[torch.Tensor, dict[str, Metric]]:
    """The per-token loss ``loss_t`` (B, T) of ``sapo_policy_loss`` (its formula, paper and metrics
    there), before the rollout correction's weights and the aggregation: ``(loss_mat, metrics)``; the
    ``"sapo"`` entry of ``POLICY_LOSSES``."""
    mask, advantages = check_policy_inputs(logprobs, old_logprobs, advantages, response_mask)
    if temperature_pos <= 0 or temperature_neg <= 0:
        raise ValueError(f"SAPO temperatures must be > 0, got {temperature_pos}, {temperature_neg}")
    ratio = importance_ratio(logprobs, old_logprobs, mask, importance_sampling_level)
    tau = torch.where(advantages > 0, scalar_like(temperature_pos, ratio), scalar_like(temperature_neg, ratio))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau
    loss_mat = -gate * advantages
    with torch.no_grad():
        metrics = {
            "policy/sapo_gate_mean": token_mean(gate, mask),
            **ratio_metrics(logprobs, old_logprobs, ratio, mask),
        }
    return loss_mat, metrics


VESPO_LOG_FLOOR = math.log(1e-8)  # the sequence weight's floor (TRL's and the paper's code: log(1e-8))


def sapo_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    temperature_pos: float = 1.0,
    temperature_neg: float = 1.05,
    agg: str = "seq-mean-token-mean",
    horizon: int | None = None,
    weights: torch.Tensor | None = None,
    importance_sampling_level: str = "token",
):
    """SAPO, Soft Adaptive Policy Optimization (Gao et al. 2025, arXiv:2511.20347, eq. 5), negated:

    ``loss_t = -(4 / τ) σ(τ (ρ_t - 1)) A_t``, ``τ = temperature_pos`` where ``A_t > 0``, else
    ``temperature_neg``:

    a smooth gate in place of PPO's hard clip. Its gradient ``4 σ(1 - σ) ∇ρ_t A_t`` is the policy
    gradient at ``ρ = 1`` (the gate's slope there is 1) and fades as ``ρ`` leaves 1, the faster the
    larger ``τ`` — negative advantages get the larger ``τ`` by default (the paper's asymmetry) —
    instead of dropping to 0 at the clip edge. The paper's objective is averaged per sequence,
    ``agg="seq-mean-token-mean"`` (TRL's ``loss_type="sapo"``). ``importance_sampling_level`` and
    ``weights`` (the rollout correction's, multiplying each ``loss_t``) as in ``ppo_policy_loss``.

    Returns ``(loss, metrics)``: ``policy/sapo_gate_mean`` (the gate ``(4 / τ) σ(τ (ρ - 1))``,
    1 on policy) and the ratio metrics of ``ppo_policy_loss``.
    """
    loss_mat, metrics = sapo_token_loss(
        logprobs, old_logprobs, advantages, response_mask, temperature_pos, temperature_neg, importance_sampling_level
    )
    return corrected_loss(loss_mat, response_mask, weights, agg, horizon), metrics


def vespo_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    k_pos: float = 2.0,
    lambda_pos: float = 3.0,
    k_neg: float = 3.0,
    lambda_neg: float = 2.0,
    agg: str = "token-mean",
    horizon: int | None = None,
    weights: torch.Tensor | None = None,
):
    """VESPO, Variational Sequence-level Soft Policy Optimization (arXiv:2602.10693), negated:

    ``loss_t = -sg(φ(w_i)) A_t log π(y_t)``, ``φ(w) = e^λ w^k e^{-λ w}`` (a Gamma-shaped weight,
    ``φ(1) = 1``), ``w_i = Π_t ρ_{i,t}`` the row's *sequence* importance ratio (a product, not
    GSPO's geometric mean), ``(k, λ) = (k_pos, lambda_pos)`` where ``A_t >= 0``, else
    ``(k_neg, lambda_neg)``:

    a REINFORCE loss whose weight falls off smoothly on both sides of the behaviour policy — as
    ``w^k`` for ``w → 0`` and as ``e^{-λ w}`` for large ``w`` — rather than being clipped. On
    policy (``w = 1``) it is the policy gradient. Computed in log space as TRL 1.16 does
    (``GRPOTrainer.get_gamma_weights``): each token's log-ratio clamped to ±20, their masked sum
    clamped to ``[log 1e-8, 20]``; a non-finite ``φ`` is 0. ``weights`` (B, T), the rollout
    correction's token weights (``π_old / π_sampler``), are folded into ``w`` as their log-sum
    (clamped alike) instead of multiplying the loss: ``w`` is then the ratio to the sampler. Its
    normaliser is the batch's token count, ``agg="token-mean"`` (TRL's ``loss_type="vespo"``).

    Returns ``(loss, metrics)``: ``policy/vespo_phi_mean`` (``φ`` averaged over the rows with a
    token), ``policy/approx_kl`` and ``policy/approx_kl_k3``.
    """
    mask, advantages = check_policy_inputs(logprobs, old_logprobs, advantages, response_mask)
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    with torch.no_grad():
        log_ratio = torch.where(mask, (logprobs - old_logprobs).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO), zero)
        seq = log_ratio.sum(-1, keepdim=True)
        if weights is not None:
            check_same_shape(weights=weights, logprobs=logprobs)
            log_w = torch.log(weights.detach().clamp(min=1e-30)).clamp(VESPO_LOG_FLOOR, MAX_LOG_RATIO)
            seq = seq + torch.where(mask, log_w, zero).sum(-1, keepdim=True)
        log_w = seq.clamp(VESPO_LOG_FLOOR, MAX_LOG_RATIO)
        nonneg = advantages >= 0
        k = torch.where(nonneg, scalar_like(k_pos, logprobs), scalar_like(k_neg, logprobs))
        lam = torch.where(nonneg, scalar_like(lambda_pos, logprobs), scalar_like(lambda_neg, logprobs)).clamp(min=1e-4)
        phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
    loss = aggregate(-phi * advantages * logprobs, mask, agg, horizon)
    with torch.no_grad():
        rows = mask.any(-1)
        phi_row = torch.where(mask, phi.expand_as(mask), zero).sum(-1) / mask.sum(-1).clamp(min=1)
        metrics = {
            "policy/vespo_phi_mean": Metric.mean(torch.where(rows, phi_row, zero).sum(), rows.sum()),  # per row
            **approx_kl_metrics(logprobs, old_logprobs, mask),
        }
    return loss, metrics


def pg_token_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
) -> tuple[torch.Tensor, dict[str, Metric]]:
    """The per-token loss ``loss_t = -A_t · log π(y_t)`` (B, T) of ``pg_loss`` (its metrics there),
    before the rollout correction's weights and the aggregation: ``(loss_mat, metrics)``; the
    ``"vanilla"`` entry of ``POLICY_LOSSES``."""
    mask, advantages = check_policy_inputs(logprobs, old_logprobs, advantages, response_mask)
    loss_mat = -advantages * logprobs
    with torch.no_grad():
        metrics = approx_kl_metrics(logprobs, old_logprobs, mask)
    return loss_mat, metrics


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
    loss_mat, metrics = pg_token_loss(logprobs, old_logprobs, advantages, response_mask)
    return corrected_loss(loss_mat, response_mask, weights, agg, horizon), metrics
