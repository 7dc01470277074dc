"""Phases 4–5 of the RL loop (generate → score → **make experience** → update): what an update
trains on, from a scored rollout."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import distributed
from ..algorithms import KL_ESTIMATORS, ROLLOUT_IS_MODES, global_values, mask_truncated, teacher_token_advantages
from ..config.parts import ConfigFields, takes
from ..config.teacher import distillation_weight
from ..models import efficiency
from ..models.rl_models import RLModels
from ..rollout import Rollout
from .advantages import AdvantageEstimation, RolloutCorrection, compute_advantages, kl_metrics, rollout_correction


@dataclass
class Experience:
    """Everything phase 6 trains on; all (B, T) except ``rollout``."""

    rollout: Rollout
    mask: torch.Tensor
    old_logprobs: torch.Tensor | None
    ref_logprobs: torch.Tensor | None
    old_values: torch.Tensor | None
    advantages: torch.Tensor
    returns: torch.Tensor | None
    is_weights: torch.Tensor | None = None  # rollout correction (vLLM): per-token weights of the policy loss
    correct_in_loss: bool = False  # the correction is computed in the loss (one on-policy pass, no old pass)
    counted_rows: torch.Tensor | None = None  # (B,) rows a per-sequence loss counts; None: those with a token in mask


@takes("prompts_per_step", "group_size", "num_iterations", "mini_batch_size")
class UpdatePasses(ConfigFields):
    """The fields of ``RLConfig`` that say how the update passes over a batch (``single_pass``)."""

    @property
    def batch_size(self) -> int:
        """Sequences per step, ``prompts_per_step x group_size`` (``RLConfig.batch_size``)."""
        return self.prompts_per_step * self.group_size


@takes(
    "kl_coef",
    "kl_estimator",
    "use_critic",
    "mask_truncated_completions",
    "masked_rows_count",
    "distillation_coef",
    "distillation_mode",
)
class ExperienceMaking(AdvantageEstimation, RolloutCorrection, UpdatePasses):
    """The fields of ``RLConfig`` that phases 4–5 read (``make_experience``): those it takes, and those
    of the functions it calls (``compute_advantages``, ``rollout_correction``, ``single_pass``),
    whose parts it extends so that it passes itself on."""


def single_pass(args: UpdatePasses) -> bool:
    """One on-policy pass: old log-probs equal the current ones, so they are not recomputed."""
    mini = args.mini_batch_size or args.batch_size
    return args.num_iterations == 1 and mini >= args.batch_size


@torch.no_grad()
def make_experience(
    models: RLModels, args: ExperienceMaking, rollout: Rollout, scores, valid, kl_coef: float, metrics: dict
) -> Experience:
    """Phases 4–5, after the scores: old / reference log-probs and values, token rewards,
    advantages, and the rollout correction when it is not left to the loss. ``kl_coef``: β of this
    step (the KL controller's value); ``metrics`` gains ``kl/*`` (KL in the reward),
    ``reward/token_reward_sum``, ``policy/advantages_mean`` and ``rollout/*``.

    Formulas (through ``rl.advantages``): ``rlhfkit/algorithms/kl.py`` (the KL estimators),
    ``algorithms/shaping.py`` (token rewards; ``mask_truncated`` with
    ``args.mask_truncated_completions``; ``teacher_token_advantages``, added to the advantages with a
    teacher in distillation_mode 'token', after any whitening), ``algorithms/advantages.py`` and the
    ``ADVANTAGE_ESTIMATORS`` of ``algorithms/registry.py`` (advantages, whitening),
    ``algorithms/rollout_is.py`` (the rollout correction)."""
    device = models.device
    rollout = rollout.to(device)
    mask, scores = rollout.response_mask.bool(), scores.to(device)
    behaviour = rollout.logprobs  # the engine's own log-probs (vLLM); None: it sampled from the policy itself
    # Old log-probs are computed when something else needs them (the KL in the reward, a critic,
    # more than one pass) or a mask mode must know the kept tokens before the update; then the
    # correction is computed here, else in the one on-policy pass of the loss — exactly once.
    masks = (
        behaviour is not None and ROLLOUT_IS_MODES.traits(args.rollout_is)["masks"] and not args.rollout_is_zero_masked
    )  # zero-masked: the mask does not change, the weights say it
    by_token = models.teacher is not None and args.distillation_mode == "token"  # the teacher scores each token
    need_old = (args.kl_in_reward and args.kl_coef > 0) or not single_pass(args) or args.use_critic or masks or by_token
    with efficiency.counting("logprob"):
        old_logprobs, old_values, kept_mass = (
            models.policy_outputs(rollout, with_values=args.use_critic) if need_old else (None, None, None)
        )
        ref = models.reference_logprobs(rollout) if args.kl_coef > 0 else None
        teacher = models.teacher_logprobs(rollout) if by_token else None
    passes = int(need_old) + int(args.kl_coef > 0) + int(by_token)
    if passes:
        efficiency.add_needed("logprob", passes * efficiency.needed_tokens(rollout))
    valid = valid.to(device)
    kl = None
    if ref is not None and old_logprobs is not None:
        kl = KL_ESTIMATORS.get(args.kl_estimator)(old_logprobs, ref)
        kl_stats = kl_metrics(old_logprobs, ref, mask)  # scored or not
        metrics.update(global_values(kl_stats, distributed.reduce_sum, None))
    advantages, returns, rewards, mask = compute_advantages(
        args, scores, valid, mask, kl, old_values, kl_coef, reduce=distributed.reduce_sum
    )
    if teacher is not None and old_logprobs is not None:
        advantages = advantages + teacher_token_advantages(old_logprobs, teacher, mask, distillation_weight(args))
        metrics["distill/reverse_kl"] = distributed.global_mean(old_logprobs - teacher, mask)  # k1, per token
    counted_rows = None
    if args.mask_truncated_completions:  # truncated completions keep their group statistics, leave the loss
        if args.masked_rows_count:  # ... but still count as (empty) rows of a per-sequence loss (TRL's rule)
            counted_rows = mask.any(-1)
        mask = mask_truncated(mask, rollout.has_eos.to(device))
    metrics["reward/token_reward_sum"] = distributed.global_mean(rewards.sum(-1), valid)
    metrics["policy/advantages_mean"] = distributed.global_mean(advantages, mask)
    correct_in_loss, is_weights = behaviour is not None and old_logprobs is None, None
    if not correct_in_loss:
        is_weights, mask, is_metrics = rollout_correction(args, old_logprobs, behaviour, mask, kept_mass)
        metrics.update(is_metrics)
        if counted_rows is not None:  # a row the correction masked out leaves the denominator; a truncated one stays
            counted_rows = counted_rows & (mask.any(-1) | ~rollout.has_eos.to(device))
    return Experience(
        rollout, mask, old_logprobs, ref, old_values, advantages, returns, is_weights, correct_in_loss, counted_rows
    )
