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
    ADVANTAGE_ESTIMATORS, apply_missing_eos_penalty, masked_mean, masked_sum, masked_var, token_level_rewards, whiten,
)
from ..config import RLConfig


def shape_scores(scores: torch.Tensor, valid: torch.Tensor, has_eos: torch.Tensor, args: RLConfig, reduce=None):
    """(B,) scores after the EOS trick, ``reward_clip`` and ``normalize_rewards`` (whitening over the
    valid samples), 0 on invalid samples; plus ``reward/*`` metrics over the valid samples.
    ``reduce`` (``distributed.reduce_sum``): the statistics are over every process's samples."""
    zero = torch.zeros((), dtype=scores.dtype, device=scores.device)
    if args.missing_eos_penalty is not None:
        scores = apply_missing_eos_penalty(scores, has_eos, args.missing_eos_penalty)
    if args.reward_clip is not None:
        scores = scores.clamp(-args.reward_clip, args.reward_clip)
    scores = torch.where(valid, scores, zero)
    if reduce is None:
        mean, std = masked_mean(scores, valid), masked_var(scores, valid, unbiased=True).sqrt()
        n, count = valid.sum(), torch.tensor(float(len(valid)))
    else:
        total = reduce(torch.stack([masked_sum(scores, valid), valid.sum().to(scores.dtype),
                                    torch.tensor(float(len(valid)), dtype=scores.dtype, device=scores.device)]))
        n, count = total[1], total[2]
        mean = total[0] / n.clamp(min=1)
        squares = reduce(masked_sum((scores - mean).square(), valid))
        std = (squares / (n - 1).clamp(min=1)).sqrt()
    metrics = {"reward/mean": mean, "reward/std": std, "reward/valid_frac": n / count}
    if args.normalize_rewards and int(n) >= 2:
        scores = whiten(scores, valid, reduce=reduce)
    return scores, metrics


def compute_advantages(args: RLConfig, scores: torch.Tensor, valid: torch.Tensor, response_mask: torch.Tensor,
                       kl: torch.Tensor | None, values: torch.Tensor | None, kl_coef: float, reduce=None):
    """Token rewards (the score on the last response token, ``-kl_coef * kl`` on every token when
    the KL is in the reward), then ``args.advantage_estimator`` and, when asked, whitening.

    Returns ``(advantages, returns, token_rewards, mask)``: all (B, T); ``mask`` is the response
    mask with the invalid samples' rows cleared — the tokens the update trains on.
    """
    response_mask = response_mask.bool()
    rewards = token_level_rewards(scores, kl if args.kl_in_reward else None, response_mask, kl_coef)
    mask = response_mask & valid[:, None]
    advantages, returns = ADVANTAGE_ESTIMATORS.get(args.advantage_estimator)(
        rewards, mask, values=values, group_size=args.group_size, gamma=args.gamma, lam=args.lam, reduce=reduce)
    tokens = mask.sum() if reduce is None else reduce(mask.sum())
    if args.whiten_advantages and int(tokens) >= 2:  # batch statistics over every process's samples
        advantages = whiten(advantages, mask, reduce=reduce)
    return advantages, returns, rewards, mask
