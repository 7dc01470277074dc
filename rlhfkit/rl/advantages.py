"""Phases 3 and 5 of the RL loop as plain functions of tensors and the config: the outcome scores
after the EOS trick, DAPO's overlong punishment, clipping and normalisation, then token rewards and
advantages through the registries. Samples that no reward function scored (``valid`` False) are absent from every
statistic — reward normalisation, group mean and std, the batch-mean baseline, whitening — so a
batch with unscored samples gives its scored samples exactly the advantages of the batch without
them; the unscored ones get advantage 0 and no gradient. Also the rollout correction (engine vs
trainer log-probs) and the rollout's own statistics.
"""

from __future__ import annotations

import torch

from .. import distributed
from ..algorithms import (
    ADVANTAGE_ESTIMATORS,
    KL_ESTIMATORS,
    Metric,
    apply_missing_eos_penalty,
    global_values,
    masked_mean,
    masked_sum,
    masked_var,
    overlong_penalty,
    rollout_is_weights,
    token_level_rewards,
    token_mean,
    whiten,
)
from ..config.parts import ConfigFields, takes


@takes(
    "max_new_tokens",
    "missing_eos_penalty",
    "overlong_buffer_len",
    "overlong_penalty",
    "reward_clip",
    "normalize_rewards",
    "dynamic_sampling",
    "reward_aggregation",
    "advantage_epsilon",
)
class ScoreShaping(ConfigFields):
    """The fields of ``RLConfig`` that phase 3's score shaping reads (``shape_scores``,
    ``normalize_scores``); same names, same meaning."""


def shape_scores(
    scores: torch.Tensor,
    valid: torch.Tensor,
    has_eos: torch.Tensor,
    args: ScoreShaping,
    reduce=None,
    lengths: torch.Tensor | None = None,
):
    """(B,) scores after the EOS trick, DAPO's soft overlong punishment, ``reward_clip`` and
    ``normalize_rewards`` (whitening over the valid samples), 0 on invalid samples; plus
    ``reward/*`` metrics over the valid samples. ``reduce`` (``distributed.reduce_sum``): the
    statistics are over every process's samples. ``lengths`` (B,): the completions' lengths in
    tokens (``response_mask.sum(-1)``, EOS included, as verl counts), needed with
    ``args.overlong_buffer_len`` (then ``reward/overlong_penalty_mean`` is logged).

    With ``args.dynamic_sampling`` the batch-level step (``normalize_scores``) is left to the
    batch the step keeps (``rl.sampling.sample_batch``): the scores returned are per sample."""
    zero = torch.zeros((), dtype=scores.dtype, device=scores.device)
    metrics = {}
    if args.missing_eos_penalty is not None:
        scores = apply_missing_eos_penalty(scores, has_eos, args.missing_eos_penalty)
    if args.overlong_buffer_len is not None:
        if lengths is None:
            raise ValueError("shape_scores needs the completions' lengths with overlong_buffer_len")
        penalty = overlong_penalty(
            lengths.to(scores.device), args.max_new_tokens, args.overlong_buffer_len, args.overlong_penalty
        ).to(scores.dtype)
        scores = scores + penalty
        metrics["reward/overlong_penalty_mean"] = _mean(penalty, valid, reduce)
    if args.reward_clip is not None:
        scores = scores.clamp(-args.reward_clip, args.reward_clip)
    scores = torch.where(valid, scores, zero)
    if reduce is None:
        mean, std = masked_mean(scores, valid), masked_var(scores, valid, unbiased=True).sqrt()
        n, count = valid.sum(), torch.tensor(float(len(valid)))
    else:
        total = reduce(
            torch.stack(
                [
                    masked_sum(scores, valid),
                    valid.sum().to(scores.dtype),
                    torch.tensor(float(len(valid)), dtype=scores.dtype, device=scores.device),
                ]
            )
        )
        n, count = total[1], total[2]
        mean = total[0] / n.clamp(min=1)
        squares = reduce(masked_sum((scores - mean).square(), valid))
        std = (squares / (n - 1).clamp(min=1)).sqrt()
    metrics.update({"reward/mean": mean, "reward/std": std, "reward/valid_frac": n / count})
    if args.normalize_rewards and int(n) >= 2 and not args.dynamic_sampling:
        scores = whiten(scores, valid, reduce=reduce)
    return scores, metrics


def normalize_scores(scores: torch.Tensor, valid: torch.Tensor, args: ScoreShaping, reduce=None) -> torch.Tensor:
    """The batch-level step of ``shape_scores``: with ``args.normalize_rewards``, the scores whitened
    over the valid samples (of every process with ``reduce``) when there are at least two."""
    if not args.normalize_rewards:
        return scores
    n = valid.sum() if reduce is None else reduce(valid.sum().to(scores.dtype))
    return whiten(scores, valid, reduce=reduce) if int(n) >= 2 else scores


def _mean(x: torch.Tensor, valid: torch.Tensor, reduce=None) -> torch.Tensor:
    """Mean of ``x`` over the valid samples (of every process with ``reduce``)."""
    if reduce is None:
        return masked_mean(x, valid)
    total = reduce(torch.stack([masked_sum(x, valid), valid.sum().to(x.dtype)]))
    return total[0] / total[1].clamp(min=1)


@takes(
    "kl_in_reward",
    "advantage_estimator",
    "group_size",
    "gamma",
    "lam",
    "whiten_advantages",
    "advantage_epsilon",
    "unscored_in_loss",
)
class AdvantageEstimation(ConfigFields):
    """The fields of ``RLConfig`` that phase 5's advantages read (``compute_advantages``); same
    names, same meaning (``config.part(AdvantageEstimation, config)``)."""


def compute_advantages(
    args: AdvantageEstimation,
    scores: torch.Tensor,
    valid: torch.Tensor,
    response_mask: torch.Tensor,
    kl: torch.Tensor | None,
    values: torch.Tensor | None,
    kl_coef: float,
    reduce=None,
):
    """Token rewards (the score on the last response token, ``-kl_coef * kl`` on every token when
    the KL is in the reward), then ``args.advantage_estimator`` and, when asked, whitening.

    Returns ``(advantages, returns, token_rewards, mask)``: all (B, T); ``mask`` is the response
    mask with the invalid samples' rows cleared — the tokens the update trains on — or, with
    ``args.unscored_in_loss`` (TRL's rule), the whole response mask, the invalid rows' advantages 0.
    """
    response_mask = response_mask.bool()
    nonempty = response_mask.any(-1)  # an agent episode that never called the model has no token: unscored
    valid = valid & nonempty
    kl = kl if args.kl_in_reward else None
    if bool(nonempty.all()):
        rewards = token_level_rewards(scores, kl, response_mask, kl_coef)
    else:
        rewards = torch.zeros(response_mask.shape, dtype=scores.dtype, device=scores.device)
        if bool(nonempty.any()):
            rewards[nonempty] = token_level_rewards(
                scores[nonempty], None if kl is None else kl[nonempty], response_mask[nonempty], kl_coef
            )
    mask = response_mask & valid[:, None]
    advantages, returns = ADVANTAGE_ESTIMATORS.get(args.advantage_estimator)(
        rewards,
        mask,
        values=values,
        group_size=args.group_size,
        gamma=args.gamma,
        lam=args.lam,
        reduce=reduce,
        eps=args.advantage_epsilon,
    )
    tokens = mask.sum() if reduce is None else reduce(mask.sum())
    if args.whiten_advantages and int(tokens) >= 2:  # batch statistics over every process's samples
        advantages = whiten(advantages, mask, reduce=reduce)
    if args.unscored_in_loss:  # their advantage is 0, their tokens stay in the loss (and its normaliser)
        advantages = torch.where(mask, advantages, torch.zeros((), dtype=advantages.dtype, device=advantages.device))
        mask = response_mask
    return advantages, returns, rewards, mask


@takes("rollout_is", "rollout_is_threshold", "rollout_is_threshold_low", "rollout_is_zero_masked")
class RolloutCorrection(ConfigFields):
    """The fields of ``RLConfig`` that the rollout correction reads (``rollout_correction``)."""


def rollout_correction(
    args: RolloutCorrection, old, behaviour, mask: torch.Tensor, log_kept_mass=None, local: bool = False
):
    """The one place the rollout importance-sampling correction is computed: the weights (B, T)
    for the gap between the engine that sampled (``behaviour``: its log-probs of the sampled
    tokens) and the trainer's log-probs of the same tokens before the update (``old``), by
    ``rollout_is_weights`` with ``args.rollout_is``. Returns ``(weights or None, mask, metrics)``:
    tokens or sequences a mask mode rejects have left ``mask``; ``metrics`` are
    ``rollout/logprob_diff_mean`` and ``_max`` (|old - behaviour| over the response tokens),
    ``rollout/is_weight_mean``, ``_std``, ``rollout/is_masked_frac`` and ``rollout/kl_sampler_trainer``
    (``rollout_is_weights``): their values over every process, or with ``local`` these rows' ``Metric``
    statistics (a micro-batch of the update, which reduces them with the others: ``metrics.py``). With
    ``args.rollout_is_zero_masked`` (TRL's rule) the rejected tokens keep their place in ``mask``,
    with weight 0.

    Like with like: an engine that truncates (top-k / top-p) reports log-probs renormalised over
    the tokens it kept, so ``log_kept_mass`` (``RLModels.engine_support``) is subtracted from
    ``old`` first; the ratio then measures the engine/trainer mismatch, not the truncation. The
    HF engine samples from the trained weights themselves (``behaviour`` None): its log-probs
    *are* the trainer's, so the difference is 0, every weight 1, and no weights are applied."""
    own_sampler = behaviour is None
    if own_sampler:
        old = behaviour = old if old is not None else torch.zeros(mask.shape, device=mask.device)
    elif log_kept_mass is not None:
        old = old - log_kept_mass.to(old.device)
    behaviour = behaviour.to(old.device)
    weights, kept, stats = rollout_is_weights(
        old, behaviour, mask, args.rollout_is, args.rollout_is_threshold, low=args.rollout_is_threshold_low
    )
    metrics = stats if local else global_values(stats, distributed.reduce_sum, distributed.reduce_tensor_max)
    if own_sampler or args.rollout_is == "none":
        return None, mask, metrics
    return weights, mask if args.rollout_is_zero_masked else kept, metrics


def kl_metrics(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor) -> dict[str, Metric]:
    """``kl/k1`` and ``kl/k3``: the two estimators of KL(π‖ref), token means over ``mask`` (``Metric``:
    ``metrics.global_values`` reads them over every process's rows)."""
    return {
        f"kl/{name}": token_mean(KL_ESTIMATORS.get(name)(logprobs.detach(), ref_logprobs), mask.bool())
        for name in ("k1", "k3")
    }


def rollout_metrics(rollout) -> dict:
    """Completion lengths and the share cut at max_new_tokens, over every process's rows."""
    lengths = rollout.response_mask.sum(-1).float()
    every = torch.ones_like(lengths, dtype=torch.bool)
    return {
        "rollout/response_length_mean": distributed.global_mean(lengths, every),
        "rollout/response_length_max": distributed.reduce_tensor_max(lengths.max()),
        "rollout/truncated_frac": distributed.global_mean((~rollout.has_eos).float(), every),
    }
