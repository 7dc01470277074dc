"""Importance-sampling correction for the mismatch between the rollout engine and the trainer.

A fast engine (vLLM, SGLang) samples the responses with its own kernels, precision and sampler,
so the distribution the tokens come from, ``π_rollout``, is not exactly the trainer's ``π_old``
even with the same weights: the update is off-policy. With ``lr_t = log π_old(y_t) -
log π_rollout(y_t)`` on the response tokens (0 elsewhere) and the ratio ``ρ_t = exp(lr_t)``, the
policy loss of each token is multiplied by a weight ``w_t`` that brings its expectation back to
``π_old``:

- ``none``: ``w_t = 1`` (no correction).
- ``token_truncate`` — truncated IS, "TIS" (Yao et al. 2025, "Your Efficient RL Framework
  Secretly Brings You Off-Policy RL Training"): ``w_t = min(ρ_t, C)``. Biased a little where the
  engine under-samples a token (ρ > C), low variance; the default.
- ``token_mask`` — masked / rejection IS, "MIS" (Liu, Li et al. 2025, "When Speed Kills
  Stability: Demystifying RL Collapse from the Training-Inference Mismatch"): a token with
  ``ρ_t ∉ [1/C, C]`` leaves the mask (the loss and its denominator); the others keep
  ``w_t = ρ_t``. Drops the tokens where the engine and the trainer disagree most (in either
  direction) rather than trusting them a little.
- ``sequence_truncate``: ``w_i = min(exp(Σ_t lr_t), C)`` for every token of row ``i`` — the
  ratio of the whole sequence, the unbiased correction of a sequence-level objective (the bandit
  formulation of GRPO / RLOO), at the price of a higher variance.
- ``sequence_mask``: a row with ``exp(Σ_t lr_t) ∉ [1/C, C]`` leaves the mask entirely; the
  others keep the sequence ratio as weight.

Every log-ratio (and every row sum of them) is clamped to ``[-20, 20]`` before ``exp``, as in
verl, so nothing overflows. When the trainer samples itself (``old == rollout``) every ``lr_t``
is exactly 0: all weights are exactly 1 and nothing is masked, whatever the mode.

Each mode is an entry of the ``ROLLOUT_IS_MODES`` registry (``registry.Registry``) with the traits
``level`` (whose ratio weighs a token: its own, or its sequence's) and ``masks`` (it may remove
tokens from the mask); iterating the registry gives the mode names in the order above.
"""

from __future__ import annotations

import math
import numbers

import torch

from ._checks import check_mask, check_same_shape, check_tensor
from .kl import MAX_LOG_RATIO
from .metrics import Metric, token_max, token_std
from .registry import Registry

# ``f(log_ratio, response_mask, *, threshold) -> (weights, kept)``: ``log_ratio`` (B, T) per token,
# or (B, 1) per sequence when the mode's ``level`` is "sequence"; ``weights`` broadcast to (B, T).
ROLLOUT_IS_MODES = Registry(
    "rollout IS mode", ("log_ratio", "response_mask"), ("threshold", "low"), traits=("level", "masks")
)


@ROLLOUT_IS_MODES.register("none", level="token", masks=False)
def _no_correction(log_ratio, response_mask, *, threshold, low):
    return torch.ones_like(log_ratio), response_mask


def _log(bound: float | None, default: float) -> float:
    """A bound in log space (``None``: ``default``; 0 is ``-inf``: no lower bound)."""
    return default if bound is None else (math.log(bound) if bound > 0 else -math.inf)


def _truncate(log_ratio, response_mask, *, threshold, low):
    """``w = min(ρ, C)`` (``max(·, low)`` too when a lower bound is given); the mask is unchanged."""
    weights = torch.exp(log_ratio)
    if threshold is not None or low is not None:
        weights = weights.clamp(min=low, max=threshold)
    return weights, response_mask


def _mask(log_ratio, response_mask, *, threshold, low):
    """Keep ``ρ ∈ [low, C]`` (``low`` defaults to ``1/C``; compared in log space), with ``w = ρ``."""
    high = _log(threshold, math.inf)
    floor = _log(low, -high)
    kept = response_mask & (log_ratio <= high) & (log_ratio >= floor)
    return torch.exp(log_ratio), kept


ROLLOUT_IS_MODES.register("token_truncate", level="token", masks=False)(_truncate)
ROLLOUT_IS_MODES.register("token_mask", level="token", masks=True)(_mask)
ROLLOUT_IS_MODES.register("sequence_truncate", level="sequence", masks=False)(_truncate)
ROLLOUT_IS_MODES.register("sequence_mask", level="sequence", masks=True)(_mask)


def rollout_is_weights(
    old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
    mode: str = "token_truncate",
    threshold: float | None = 2.0,
    *,
    low: float | None = None,
):
    """Per-token importance-sampling weights correcting the rollout engine / trainer mismatch.

    ``lr_t = clamp(old_t - rollout_t, -20, 20)`` on the response tokens and 0 elsewhere (padding
    may hold anything, NaN and inf included: it is selected away, never multiplied by 0); the
    token ratio is ``ρ_t = exp(lr_t)``, the sequence ratio ``ρ_i = exp(clamp(Σ_t lr_t, -20, 20))``.
    With ``C = threshold``:

    - ``none``: ``w_t = 1``; ``token_truncate`` (TIS, Yao et al. 2025): ``w_t = min(ρ_t, C)``;
      ``sequence_truncate``: ``w_t = min(ρ_i, C)``. The mask is unchanged.
    - ``token_mask`` (MIS, Liu, Li et al. 2025): tokens with ``ρ_t ∉ [1/C, C]`` (bounds included
      in the interval, compared in log space: ``|lr_t| <= log C``) leave the mask, the others get
      ``w_t = ρ_t``; ``sequence_mask``: rows with ``ρ_i ∉ [1/C, C]`` leave the mask, the others
      get ``w_t = ρ_i``.

    ``low`` (optional, ``0 <= low < C``) sets the lower bound apart: the truncation modes then
    also floor the weight at ``low`` (``w = clamp(ρ, low, C)``), the mask modes keep ``ρ ∈ [low,
    C]`` (0: no lower bound). ``threshold=None`` is no upper bound (no cap, nothing masked above).
    TRL's ``vllm_importance_sampling_clip_min`` / ``_clip_max`` are ``low`` / ``threshold``.

    Truncation suits most runs (it keeps every token and bounds the variance); masking suits a
    large mismatch, where a token the engine and the trainer disagree about is better dropped;
    the sequence modes suit sequence-level objectives (one reward and advantage per sequence).
    With ``old == rollout`` (the trainer's own sampler) the weights are exactly 1 and nothing is
    masked in every mode.

    Args:
        old_logprobs: (B, T) the trainer's log-probs of the sampled tokens before the update (π_old).
        rollout_logprobs: (B, T) the engine's log-probs of the same tokens (π_rollout).
        response_mask: (B, T) bool or 0/1.
        mode: one of ``ROLLOUT_IS_MODES``.
        threshold: ``C > 1``, the truncation cap or the bounds ``[1/C, C]`` of the masks; None: no cap.
        low: the lower bound, when not ``1/C`` (mask modes) or none (truncation modes).

    Returns ``(weights, mask, metrics)``: ``weights`` (B, T) float32, detached, 0 outside the
    returned mask; ``mask`` (B, T) bool, a subset of ``response_mask`` (the tokens left in the
    loss); ``metrics``, ``Metric`` statistics (``metrics.py``: their values over several parts,
    micro-batches or processes, are those of the parts together) over the *original* response tokens:
    ``rollout/logprob_diff_mean`` and ``rollout/logprob_diff_max`` (of ``|old - rollout|``, 0
    when the mask is empty), ``rollout/is_weight_mean`` (mean weight over the returned mask, 1
    when it is empty: no correction), ``rollout/is_masked_frac`` (share of the response tokens
    removed, 0 when there are none), ``rollout/is_weight_std`` (the weights' population standard
    deviation over the returned mask, 0 when it is empty), ``rollout/kl_sampler_trainer`` (KL(π_rollout
    ‖ π_old) per response token, Schulman's unbiased k3 estimator on the engine's samples: the mean of
    ``exp(lr_t) − 1 − lr_t`` with the token log ratio ``lr_t``; 0 when there are no tokens).
    """
    check_same_shape(old_logprobs=old_logprobs, rollout_logprobs=rollout_logprobs)
    check_tensor("old_logprobs", old_logprobs, ndim=2)
    mask = check_mask(response_mask, old_logprobs.shape)
    correct, level = ROLLOUT_IS_MODES.get(mode), ROLLOUT_IS_MODES.traits(mode)["level"]
    if threshold is not None and (
        isinstance(threshold, bool) or not isinstance(threshold, numbers.Real) or not threshold > 1
    ):
        raise ValueError(f"rollout IS threshold must be a number > 1 or None, got {threshold!r}")
    if low is not None and (
        isinstance(low, bool)
        or not isinstance(low, numbers.Real)
        or not 0 <= low
        or (threshold is not None and not low < threshold)
    ):
        raise ValueError(f"rollout IS lower bound must be a number in [0, threshold), got {low!r}")

    dtype = torch.promote_types(torch.promote_types(old_logprobs.dtype, rollout_logprobs.dtype), torch.float32)
    zero = torch.zeros((), dtype=dtype, device=old_logprobs.device)
    with torch.no_grad():
        diff = old_logprobs.detach().to(dtype) - rollout_logprobs.detach().to(dtype)
        log_ratio = torch.where(mask, diff, zero).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
        if level == "sequence":
            log_ratio = log_ratio.sum(dim=-1, keepdim=True).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
        weights, kept = correct(log_ratio, mask, threshold=threshold, low=low)
        weights = torch.where(kept, weights.expand(mask.shape), zero).float()
        token_lr = torch.where(mask, diff, zero).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
        k3 = torch.where(mask, token_lr.exp() - 1 - token_lr, zero)  # KL(rollout || old) per sampled token
        metrics = _metrics(torch.where(mask, diff.abs(), zero), mask, weights, kept, k3)
    return weights, kept, metrics


def _metrics(abs_diff, mask, weights, kept, k3) -> dict[str, Metric]:
    """The ``rollout/*`` metrics as sums and counts (``Metric``)."""
    w = weights.to(abs_diff.dtype)
    n_tokens, n_kept = mask.sum(), kept.sum()
    return {
        "rollout/logprob_diff_mean": Metric.mean(abs_diff.sum(), n_tokens),
        "rollout/logprob_diff_max": token_max(abs_diff, mask),
        "rollout/is_weight_mean": Metric.mean(w.sum(), n_kept, empty=1.0),
        "rollout/is_masked_frac": Metric.mean(n_tokens - n_kept, n_tokens),
        # the weights' spread: population std over the kept tokens (0 when none or one is kept)
        "rollout/is_weight_std": token_std(weights, kept),
        "rollout/kl_sampler_trainer": Metric.mean(k3.sum(), n_tokens),
    }
