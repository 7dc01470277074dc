"""Phases 3 and 5 of the RL loop as plain functions of tensors and the config: the outcome scores
after the EOS trick, clipping and normalisation, then token rewards and advantages through the
registries. Samples that no reward function scored (``valid`` False) are absent from every
statistic — reward normalisation, group mean and std, the batch-mean baseline, whitening — so a
batch with unscored samples gives its scored samples exactly the advantages of the batch without
them; the unscored ones get advantage 0 and no gradient.
"""

from __future__ import annotations

import torch

from ..algorithms import (
    ADVANTAGE_ESTIMATORS, apply_missing_eos_penalty, masked_mean, masked_var, token_level_rewards, whiten,
)
from ..config import RLConfig


def shape_scores(scores: torch.Tensor, valid: torch.Tensor, has_eos: torch.Tensor, args: RLConfig):
    """(B,) scores after the EOS trick, ``reward_clip`` and ``normalize_rewards`` (whitening over the
    valid samples), 0 on invalid samples; plus ``reward/*`` metrics over the valid samples."""
    zero = torch.zeros((), dtype=scores.dtype, device=scores.device)
    if args.missing_eos_penalty is not None:
        scores = apply_missing_eos_penalty(scores, has_eos, args.missing_eos_penalty)
    if args.reward_clip is not None:
        scores = scores.clamp(-args.reward_clip, args.reward_clip)
    scores = torch.where(valid, scores, zero)
    metrics = {"reward/mean": masked_mean(scores, valid), "reward/std": masked_var(scores, valid, unbiased=True).sqrt(),
               "reward/valid_frac": valid.float().mean()}
    if args.normalize_rewards and int(valid.sum()) >= 2:
        scores = whiten(scores, valid)
    return scores, metrics


def compute_advantages(args: RLConfig, scores: torch.Tensor, valid: torch.Tensor, response_mask: torch.Tensor,
                       kl: torch.Tensor | None, values: torch.Tensor | None, kl_coef: float):
    """Token rewards (the score on the last response token, ``-kl_coef * kl`` on every token when
    the KL is in the reward), then ``args.advantage_estimator`` and, when asked, whitening.

    Returns ``(advantages, returns, token_rewards, mask)``: all (B, T); ``mask`` is the response
    mask with the invalid samples' rows cleared — the tokens the update trains on.
    """
    response_mask = response_mask.bool()
    rewards = token_level_rewards(scores, kl if args.kl_in_reward else None, response_mask, kl_coef)
    mask = response_mask & valid[:, None]
    advantages, returns = ADVANTAGE_ESTIMATORS.get(args.advantage_estimator)(
        rewards, mask, values=values, group_size=args.group_size, gamma=args.gamma, lam=args.lam)
    if args.whiten_advantages and int(mask.sum()) >= 2:
        advantages = whiten(advantages, mask)
    return advantages, returns, rewards, mask
