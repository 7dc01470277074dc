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
"""

from __future__ import annotations

import math
import numbers

import torch

from ._checks import check_mask, check_same_shape, check_tensor, masked_sum
from .kl import _MAX_LOG_RATIO

ROLLOUT_IS_MODES = ("none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def rollout_is_weights(
    old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
    mode: str = "token_truncate",
    threshold: float = 2.0,
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
        threshold: ``C > 1``, the truncation cap or the bounds ``[1/C, C]`` of the masks.

    Returns ``(weights, mask, metrics)``: ``weights`` (B, T) float32, detached, 0 outside the
    returned mask; ``mask`` (B, T) bool, a subset of ``response_mask`` (the tokens left in the
    loss); ``metrics``, detached 0-d float32 tensors over the *original* response tokens:
    ``rollout/logprob_diff_mean`` and ``rollout/logprob_diff_max`` (of ``|old - rollout|``, 0
    when the mask is empty), ``rollout/is_weight_mean`` (mean weight over the returned mask, 1
    when it is empty: no correction), ``rollout/is_masked_frac`` (share of the response tokens
    removed, 0 when there are none). Per-process means: a trainer averaging over processes should
    re-reduce sums and counts itself.
    """
    check_same_shape(old_logprobs=old_logprobs, rollout_logprobs=rollout_logprobs)
    check_tensor("old_logprobs", old_logprobs, ndim=2)
    mask = check_mask(response_mask, old_logprobs.shape)
    if mode not in ROLLOUT_IS_MODES:
        raise ValueError(f"unknown rollout IS mode {mode!r}; valid: {', '.join(ROLLOUT_IS_MODES)}")
    if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real) or not threshold > 1:
        raise ValueError(f"rollout IS threshold must be a number > 1, got {threshold!r}")

    dtype = torch.promote_types(torch.promote_types(old_logprobs.dtype, rollout_logprobs.dtype), torch.float32)
    zero = torch.zeros((), dtype=dtype, device=old_logprobs.device)
    with torch.no_grad():
        diff = old_logprobs.detach().to(dtype) - rollout_logprobs.detach().to(dtype)
        log_ratio = torch.where(mask, diff, zero).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
        log_c = math.log(threshold)
        if mode.startswith("sequence"):
            log_ratio = log_ratio.sum(dim=-1, keepdim=True).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
        ratio = torch.exp(log_ratio)
        kept = mask
        if mode == "none":
            weights = torch.ones_like(ratio)
        elif mode.endswith("truncate"):
            weights = ratio.clamp(max=threshold)
        else:  # *_mask: keep ρ ∈ [1/C, C]; the clamp only absorbs the rounding of exp at the bounds
            kept = mask & (log_ratio.abs() <= log_c)
            weights = ratio.clamp(1.0 / threshold, threshold)
        weights = torch.where(kept, weights.expand(mask.shape), zero).float()

        n_tokens, n_kept = mask.sum(), kept.sum()
        abs_diff = torch.where(mask, diff.abs(), zero)
        weight_sum = weights.sum()
        metrics = {
            "rollout/logprob_diff_mean": masked_sum(diff.abs(), mask) / n_tokens.clamp(min=1).to(dtype),
            # a 0 appended: the max of an empty mask (or an empty batch) is 0, not an error
            "rollout/logprob_diff_max": torch.cat([abs_diff.flatten(), zero[None]]).max(),
            "rollout/is_weight_mean": torch.where(n_kept > 0, weight_sum / n_kept.clamp(min=1).float(),
                                                  torch.ones_like(weight_sum)),
            "rollout/is_masked_frac": (n_tokens - n_kept).float() / n_tokens.clamp(min=1).float(),
        }
    return weights, kept, {k: v.detach().float() for k, v in metrics.items()}
